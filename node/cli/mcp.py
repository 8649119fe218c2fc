"""``ai-memory mcp``: serve MCP on stdin/stdout for one agent.

It joins the running node over the node's local socket (``[mcp] socket``, default <home>/run/node.sock).
When none answers it waits for one (``mcp.join_wait_s``) if a node is configured to serve the home, and
otherwise opens the node's database itself for as long as the client stays (``--embedded`` asks for that).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from node import log
from node.cli.common import EXIT_OK, refuse_unreachable_home
from node.config import HOME_ENV, NodeConfig
from node.errors import ServiceError

if TYPE_CHECKING:
    from node.cli.common import Commands

HELP = ("serve MCP over stdio (joins the running node's local socket, waiting for a node configured to serve the "
        "home; where none is, or with --embedded, opens its store here: writes then wait in the outbox until "
        "`ai-memory serve` runs)")
DESCRIPTION = (HELP + ". stdout carries only MCP messages; diagnostics go to stderr. "
               "Example: claude mcp add ai-memory -- ai-memory mcp --config /path/node.toml")


def add_parsers(sub: Commands) -> None:
    """mcp; --config/--home are accepted after it too (as MCP client configs write them), and shown."""
    p = sub.add_parser("mcp", help=HELP, description=DESCRIPTION)
    # SUPPRESS keeps a value given before the subcommand (ai-memory --config X mcp) from being reset.
    p.add_argument("--config", type=Path, default=argparse.SUPPRESS,
                   help="node config TOML (default: <home>/config.toml when it exists)")
    p.add_argument("--home", type=Path, default=argparse.SUPPRESS,
                   help=f"node home directory (overrides {HOME_ENV} and the config file)")
    p.add_argument("--agent-id", metavar="ID",
                   help="act as this agent of the node, e.g. ai:claude-code@laptop: its own key (made on first use "
                        "under <home>/keys/agents/), its own rules and quotas; default: the node's own id")
    p.add_argument("--embedded", action="store_true",
                   help="open the node's store in this process even where a node is configured to serve the home "
                        "(default: join the node over its socket, waiting up to mcp.join_wait_s for it)")
    p.set_defaults(handler=_serve_stdio)


def _serve_stdio(args: argparse.Namespace, cfg: NodeConfig) -> int:
    """Run the stdio MCP server until the client closes stdin; 0 on a clean end."""
    from node.mcp.server import run_stdio  # the MCP SDK loads only for this command

    _check_home_option(args, cfg)
    log.setup_cli("ai-memory mcp", cfg.log.level)
    try:
        asyncio.run(run_stdio(cfg, embedded=args.embedded, agent=args.agent_id))
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


def _check_home_option(args: argparse.Namespace, cfg: NodeConfig) -> None:
    """A --home that does not exist is the mistake to name, before any socket is tried or store opened (unless
    the node's socket lives outside it: ``[mcp] socket``)."""
    given = getattr(args, "home", None)
    if given is None or not cfg.socket_path.is_relative_to(cfg.home):
        return
    refuse_unreachable_home(cfg)
    if not cfg.home.is_dir():
        raise ServiceError("home_not_found", f"--home {given}: there is no such directory, so no node home and no "
                                             "node socket there (mistyped? `ai-memory --home DIR identity generate "
                                             "--agent-id ...` makes a new home)")
