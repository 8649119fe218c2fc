"""What every command group shares: exit codes, the config the command line names, output, and a service
opened for the length of one command."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from node import files
from node.config import HOME_ENV, NodeConfig, load_config
from node.errors import ServiceError, describe

if TYPE_CHECKING:
    from node.service import Service

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CHECK = 0, 1, 2, 3
# stdout's reader went away (128 + SIGPIPE, what a shell reports for a tool the signal ended).
EXIT_PIPE_CLOSED = 141

# A command: its parsed arguments and the config in force -> its exit code. Bound to its parser with
# ``set_defaults(handler=...)``.
Handler = Callable[[argparse.Namespace, NodeConfig], int]
T = TypeVar("T")


class _AddParser(Protocol):
    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


class CommandParser(argparse.ArgumentParser):
    """``ai-memory``'s parser: it keeps the parsers of its subcommands (``commands``) and the actions of its
    options by name (``options``), so that the global options can be given after a subcommand too
    (``node.cli.build_parser``)."""

    def __init__(self, *args: Any, only: str | None = None, built: bool = True, **kwargs: Any) -> None:
        # Before argparse's own __init__, which adds -h through add_argument.
        self.commands: list[CommandParser] = []
        self.options: dict[str, argparse.Action] = {}
        # ``only``: the one subcommand this parser will parse (``command_named``); the others are named for
        # choices and errors but not ``built``: their arguments are not added (building all ~60 parsers was ~10 ms
        # of every command's start-up).
        self.only = only
        self.built = built
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if not self.built:
            return _UNBUILT
        action = super().add_argument(*args, **kwargs)
        self.options.update(dict.fromkeys(action.option_strings, action))
        return action

    def add_commands(self, **kwargs: Any) -> Commands:
        """``add_subparsers(**kwargs)``, whose parsers are CommandParsers kept in ``commands``."""
        return Commands(self.add_subparsers(parser_class=CommandParser, **kwargs), self.commands,
                        self.only if self.built else "")


# What an unbuilt parser's add_argument returns: an action no parser holds.
_UNBUILT = argparse.Action([], argparse.SUPPRESS)
# The options ``ai-memory`` takes before its command: those followed by a value, and flags.
_GLOBAL_VALUED = ("--config", "--home")
_GLOBAL_FLAGS = ("--json",)


def command_named(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word after the global options), or None where that is not plain
    (no command, --help, --version, an abbreviated or ``=`` option): then every command's parser is built."""
    words = iter(argv)
    for word in words:
        if word in _GLOBAL_VALUED:
            next(words, None)
        elif word not in _GLOBAL_FLAGS:
            return None if word.startswith("-") else word
    return None


class Commands:
    """A parser's subcommands, as a command group adds to them in its ``add_parsers(sub)``."""

    def __init__(self, subparsers: _AddParser, kept: list[CommandParser], only: str | None = None) -> None:
        self._subparsers = subparsers
        self._kept = kept
        # None: build every command; a name: only that one (and all of its own subcommands).
        self._only = only

    def add_parser(self, name: str, **kwargs: Any) -> CommandParser:
        built = self._only is None or self._only == name
        parser = self._subparsers.add_parser(name, built=built, **kwargs)
        assert isinstance(parser, CommandParser)  # add_commands makes every subcommand's parser one
        if built:
            self._kept.append(parser)
        return parser


def resolve_config(args: argparse.Namespace) -> NodeConfig:
    """The config --config names, else <home>/config.toml when it exists (home: --home, $AI_MEMORY_HOME,
    ~/.config/ai-memory), else the defaults for that home."""
    return load_config(config_file(args), env=_env(args))


def config_file(args: argparse.Namespace) -> Path | None:
    """The file ``resolve_config`` reads: --config, else <home>/config.toml when it exists; None: the defaults."""
    if args.config is not None:
        return Path(args.config)
    candidate = Path(_env(args).get(HOME_ENV) or "~/.config/ai-memory").expanduser() / "config.toml"
    return candidate if candidate.exists() else None


def _env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    if args.home is not None:
        env[HOME_ENV] = str(args.home)
    return env


def error_line(exc: BaseException) -> str:
    """The one stderr line a project error becomes: ``ai-memory: error [code]: message``."""
    d = describe(exc)
    return f"ai-memory: error [{d.code}]: {d.message}"


def emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    """Print ``data`` as JSON with --json, else as ``human(data)`` says."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(human(data))


def check_home(cfg: NodeConfig, *, serving: bool = False) -> None:
    """Refuse a home that does not exist rather than create a store there (a mistyped --home), and one whose
    files this user may not read or write (one line naming the file and the fix, before anything is created)."""
    refuse_unreachable_home(cfg)
    if not os.path.isdir(cfg.home):
        raise ServiceError("home_not_found",
                           f"no node home at {cfg.home} (mistyped --home or {HOME_ENV}?); a new node starts with "
                           f"`ai-memory --home {cfg.home} identity generate --agent-id ...`")
    files.check(cfg.home, cfg.home_files(serving=serving))


def refuse_unreachable_home(cfg: NodeConfig) -> None:
    """A home behind a directory this user may not enter is that, not a missing home."""
    files.check(cfg.home, [files.HomeFile(cfg.home, "the node home", files.Need.ENTER)])


def refuse_while_the_node_runs(cfg: NodeConfig, command: str) -> None:
    """Refuse (``in_use``) while this home's node runs: its local socket answers, or ``run/node.json`` names a
    process that is alive (a node stopped cleanly removes the file; one killed leaves it, naming a pid now gone)."""
    from node.mcp.registry import CAPABILITIES
    from node.mcp.socket import ask_node
    from storage.errors import StorageCode, StorageError

    stop = (f"stop it first (`systemctl stop ai-memory`, or SIGTERM to the pid in {cfg.status_path}), then run "
            f"`ai-memory {command}` again")
    if run_async(ask_node(cfg, CAPABILITIES)) is not None:
        raise StorageError(StorageCode.IN_USE, f"the node is running (it answers on {cfg.socket_path}): {stop}")
    pid = _status_pid(cfg.status_path)
    if pid is not None and _alive(pid):
        raise StorageError(StorageCode.IN_USE, f"the node is running (pid {pid}, {cfg.status_path}): {stop}")


def _status_pid(path: Path) -> int | None:
    """The pid a node's ``run/node.json`` names (None: no such file, or none readable in it)."""
    try:
        pid = json.loads(path.read_bytes()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def with_service(fn: Callable[[Service], Awaitable[int]], cfg: NodeConfig, *, require_identity: bool = False) -> int:
    """Open the node's service (``node.assemble.open_service``), run ``fn`` on it, close it; ``fn``'s exit code."""
    from node.assemble import open_service

    check_home(cfg)

    async def go() -> int:
        svc = await open_service(cfg, require_identity=require_identity)
        try:
            return await fn(svc)
        finally:
            await svc.close()

    return run_async(go())
