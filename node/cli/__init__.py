"""The ``ai-memory`` command line: one module per command group, each adding its commands (``add_parsers``)
with the handler that runs them.

Exit codes: 0 success; 1 an operation failed (the message names the stable error code);
2 usage error; 3 a check ran and found a problem (a link that does not verify, a broken audit chain, ``status``
with no node running); 141 (128 + SIGPIPE, as a shell reports a tool killed by it) when the reader of stdout went
away (``ai-memory list | head -1``), said by nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

from node import files, log
from node.cli import agents, doctor, identity, kg, mcp, memory, mesh, migrate, permissions, probe, repair, transcripts
from node.cli.common import (
    EXIT_FAILED,
    EXIT_PIPE_CLOSED,
    CommandParser,
    Handler,
    command_named,
    error_line,
    resolve_config,
)
from node.config import HOME_ENV
from node.errors import is_project_error
from node.version import version

# Each group's commands, in the order `ai-memory --help` lists them.
GROUPS = (identity.add_parsers, memory.add_parsers, kg.add_parsers, transcripts.add_parsers,
          memory.add_audit_parsers, mesh.add_parsers, mcp.add_parsers, doctor.add_parsers, probe.add_parsers,
          repair.add_parsers, migrate.add_parsers, permissions.add_parsers, agents.add_parsers)


def build_parser(command: str | None = None) -> CommandParser:
    """The parser of every command, or with ``command`` one that builds only that command's arguments (the others
    are still named: ``--help`` lists them and a mistyped command is told the choices)."""
    p = CommandParser(prog="ai-memory", description="attested-mesh node: memories, signed links, federation.",
                      only=command)
    p.add_argument("--version", action=_Version, help="show the version and exit")
    p.add_argument("--config", type=Path, help="node config TOML (default: <home>/config.toml when it exists)")
    p.add_argument("--home", type=Path, help=f"node home directory (overrides {HOME_ENV} and the config file)")
    sub = p.add_commands(dest="cmd", required=True, metavar="COMMAND")
    for add_parsers in GROUPS:
        add_parsers(sub)
    p.add_argument("--json", action="store_true", help="machine-readable output (where the command has it)")
    _global_options_anywhere(p)
    return p


class _Version(argparse.Action):
    """``--version``: the version is read when asked for, not each time the parser is built (reading the
    installed package's metadata costs every other command start-up time)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog} {version()}")
        parser.exit()


def _global_options_anywhere(parser: CommandParser) -> None:
    """Accept --config, --home and --json after the subcommand as well as before it.

    A subcommand's option defaults to SUPPRESS so that a value given before the subcommand survives
    (argparse copies a subparser's defaults over the parent's values)."""
    for sub in parser.commands:
        json_option = sub.options.get("--json")
        if json_option is not None:
            json_option.default = argparse.SUPPRESS
            json_option.help = json_option.help or "print the result as JSON"
        for name in ("--config", "--home"):
            if name not in sub.options:
                sub.add_argument(name, type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        _global_options_anywhere(sub)


@cache
def _parser(command: str | None) -> CommandParser:
    """The parser for ``command`` (None: all), built once a process (a test runs ``main`` hundreds of times; a
    parser parses any number of argument lists)."""
    return build_parser(command)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = _parser(command_named(words)).parse_args(words)
    log.setup_cli()  # a warning a command meets is a readable line on stderr (`serve` and `mcp` set their own)
    handler: Handler = args.handler
    home: Path | None = None
    try:
        cfg = resolve_config(args)
        home = cfg.home
        rc = handler(args, cfg)
        sys.stdout.flush()  # a reader gone is met here, not in the interpreter's flush at exit
        return rc
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except Exception as exc:  # the one place errors become messages and exit codes
        if isinstance(exc, OSError) and (explained := files.explain(exc, home)) is not None:
            exc = explained  # a file this user may not read or write: one line with the fix, not a traceback
        if not is_project_error(exc):
            raise
        print(error_line(exc), file=sys.stderr)
        return EXIT_FAILED


def _reader_gone() -> int:
    """stdout's reader closed it (``| head -1``): end quietly. stdout is pointed at /dev/null so that the
    interpreter's flush at exit does not meet the closed pipe again and print its own traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (a caller's StringIO): nothing will flush into the pipe
        pass
    return EXIT_PIPE_CLOSED
