"""``ai-memory mcp``: serve MCP on stdin/stdout for one agent.

It joins the running node over the node's local socket (``[mcp] socket``, default <home>/run/node.sock)
when one answers, and otherwise opens the node's database itself for as long as the client stays.
``python -m node.mcp_cli [--config FILE] [--home DIR]`` behaves exactly like ``ai-memory mcp``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from node.config import HOME_ENV, NodeConfig

HELP = ("serve MCP over stdio (joins the running node's local socket; with no node running, opens its store "
        "here: writes then wait in the outbox until `ai-memory serve` runs)")
DESCRIPTION = (HELP + ". stdout carries only MCP messages; diagnostics go to stderr. "
               "Example: claude mcp add ai-memory -- ai-memory mcp --config /path/node.toml")


def _add_options(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    # SUPPRESS keeps a value given before the subcommand (ai-memory --config X mcp) from being reset.
    default = argparse.SUPPRESS if suppress else None
    p.add_argument("--config", type=Path, default=default,
                   help="node config TOML (default: <home>/config.toml when it exists)")
    p.add_argument("--home", type=Path, default=default,
                   help=f"node home directory (overrides {HOME_ENV} and the config file)")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``mcp`` command; --config/--home are accepted after it too (as MCP client configs write them)."""
    p = subparsers.add_parser("mcp", help=HELP, description=DESCRIPTION)
    _add_options(p, suppress=True)
    return p


def handler(args: argparse.Namespace, cfg: NodeConfig) -> int:
    """Run the stdio MCP server until the client closes stdin; 0 on a clean end."""
    from node.mcp_server import run_stdio

    logging.basicConfig(stream=sys.stderr, level=cfg.log.level.upper(),
                        format="ai-memory mcp: %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run_stdio(cfg))
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    from node.cli import EXIT_FAILED, resolve_config
    from node.errors import describe, is_project_error

    parser = argparse.ArgumentParser(prog="ai-memory mcp", description=DESCRIPTION)
    _add_options(parser, suppress=False)
    args = parser.parse_args(argv)
    try:
        return handler(args, resolve_config(args))
    except Exception as exc:  # same mapping as ai-memory's main()
        if not is_project_error(exc):
            raise
        d = describe(exc)
        print(f"ai-memory: error [{d.code}]: {d.message}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
