"""How a test reaches a node without starting a process for each question.

The product names are imported here once (the CLI's ``main``, the local-socket ``ask_node``), so a move of
either is one line to fix for every test.

- ``cli_in_process(config, home, *args)``: the ``ai-memory`` CLI's own ``main`` run in this process with its
  stdout and stderr captured: the same argument parsing, store access, JSON output and exit codes as
  ``python -m node.cli`` (which only adds ``sys.exit``), without the 0.6-0.9 s of interpreter start and
  imports a subprocess costs (and builds the CLI's parser once, not per call). The store is opened from this
  process, which is not the node's, exactly as the CLI's; what only the running node knows (``peers``,
  ``status``) the CLI itself asks over the node's local socket. Tests that pin the CLI as a program (its
  entry point, environment, stdin) spawn it instead.
- ``ask(config, home, tool, args)``: one tool call on a running node's local socket (``<home>/run/node.sock``),
  or None when no node answers there: what a poll asks a running node, at a few milliseconds a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json as jsonlib
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

from node.cli import main as cli_main
from node.config import NodeConfig, load_config
from node.mcp.socket import ask_node

# stdout, stderr and stdin are process-wide: one in-process CLI call at a time, whatever thread asks.
_CLI_LOCK = threading.Lock()


def _run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with _CLI_LOCK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        stdin, sys.stdin = sys.stdin, io.StringIO("")  # the spawned CLI had stdin=DEVNULL
        try:
            rc = cli_main(argv)
        except SystemExit as e:  # argparse: 2 on a usage error, 0 on --help
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # an unexpected error: the interpreter would print it and exit 1
            traceback.print_exc(file=err)
            rc = 1
        finally:
            sys.stdin = stdin
    return rc, out.getvalue(), err.getvalue()


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def cli_in_process(config: Path, home: Path, *args: str, json: bool = True) -> tuple[int, Any, str]:
    """``ai-memory --config <config> --home <home> <args> [--json]`` in this process: (rc, stdout, stderr).

    With ``json`` the flag ``--json`` is appended and stdout parsed (left as text when it does not parse).
    ``--home`` does what the spawned CLI's ``AI_MEMORY_HOME`` did. Called from inside an event loop (an
    async test) it runs on a helper thread, since the CLI runs its own loop; the caller's loop waits, as it
    did for ``subprocess.run``.
    """
    argv = ["--config", str(config), "--home", str(home), *args]
    if json:
        argv.append("--json")
    if _in_running_loop():
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cli") as pool:
            rc, text, err = pool.submit(_run_main, argv).result()
    else:
        rc, text, err = _run_main(argv)
    out: Any = text
    if json:
        try:
            out = jsonlib.loads(text)
        except ValueError:
            pass
    return rc, out, err


@cache
def _config(config: Path, home: Path) -> NodeConfig:
    return load_config(config, env={"AI_MEMORY_HOME": str(home)})


def ask(config: Path, home: Path, tool: str, args: dict[str, Any] | None = None) -> Any:
    """The answer of the node running from ``config`` to ``tool`` over its local socket, or None when no
    node answers there. An error answer raises it (ServiceError with the node's code)."""
    cfg = _config(config, home)
    if _in_running_loop():
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ask") as pool:
            return pool.submit(asyncio.run, ask_node(cfg, tool, args)).result()
    return asyncio.run(ask_node(cfg, tool, args))
