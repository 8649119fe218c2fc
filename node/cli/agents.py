"""``ai-memory agents``: this node's agents (docs/security.md, "Agents"): list them, vouch for one (its keypair made
under ``<home>/keys/agents/`` and a delegation signed), end that (a signed revocation that replicates; the key is
destroyed), and give one a bearer token for the streamable HTTP door."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_OK, emit, with_service
from node.config import NodeConfig
from node.errors import ServiceCode, ServiceError

if TYPE_CHECKING:
    from node.cli.common import Commands
    from node.service import Service


def add_parsers(sub: Commands) -> None:
    ag = sub.add_parser("agents", help="this node's agents: their keys, delegations and revocations")
    asub = ag.add_commands(dest="sub", required=True, metavar="ACTION")
    ls = asub.add_parser("list", help="the agents this node vouches for, each with its newest delegation")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=_list)
    dg = asub.add_parser("delegate", help="vouch for an agent now: its keypair (made on first use) and a signed "
                                          "delegation; a revoked agent gets a new key")
    dg.add_argument("id", help="agent id, e.g. ai:claude-code@laptop")
    dg.add_argument("--json", action="store_true")
    dg.set_defaults(handler=_delegate)
    rv = asub.add_parser("revoke", help="end the agent's delegations (a signed record that replicates: what it "
                                        "signs from then on is refused everywhere) and destroy its key")
    rv.add_argument("id", help="agent id")
    rv.add_argument("--since", type=int, metavar="UNIX_MS",
                    help="refuse what it signed from this time on (default now; at most now)")
    rv.add_argument("--json", action="store_true")
    rv.set_defaults(handler=_revoke)
    tk = asub.add_parser("token", help="a new bearer token for the agent (0600 under keys/agents/): an MCP HTTP "
                                       "request carrying it acts as the agent; printed once")
    tk.add_argument("id", help="agent id")
    tk.add_argument("--json", action="store_true")
    tk.set_defaults(handler=_token)


def _list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        now = svc.clock()
        rows = [a.to_json(now) for a in await svc.agents.statuses()]
        emit(args, rows, lambda rows: "\n".join(
            f"{r['agent_id']}  {r['fingerprint']}  {r['state']}  delegation {r['delegation_id'][:16]}" for r in rows)
            or "this node vouches for no agents")
        return EXIT_OK
    return with_service(go, cfg, require_identity=True)


def _delegate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        try:
            principal = await svc.agents.principal(args.id)
        except ServiceError as e:
            if e.code != ServiceCode.DELEGATION_REVOKED:
                raise
            principal = await svc.agents.delegate_again(args.id)
        out: dict[str, Any] = {"agent_id": args.id, "node": principal is None}
        if principal is not None:
            out |= {"fingerprint": principal.identity.fingerprint, "delegation_id": principal.delegation_id,
                    "valid_from": principal.valid_from, "valid_until": principal.valid_until}
        emit(args, out, lambda d: f"{d['agent_id']} is this node itself" if d["node"] else
             f"agent {d['agent_id']}  fingerprint {d['fingerprint']}  delegation {d['delegation_id']}")
        return EXIT_OK
    return with_service(go, cfg, require_identity=True)


def _revoke(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        made = await svc.agents.revoke(args.id, since_ms=args.since)
        emit(args, made, lambda rows: "\n".join(
            f"revoked {r['agent_id']} delegation {r['delegation_id'][:16]} from {r['revoked_at']}" for r in rows)
            or f"{args.id} was revoked already")
        return EXIT_OK
    return with_service(go, cfg, require_identity=True)


def _token(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import agentkeys

    async def go(svc: Service) -> int:
        await svc.agents.principal(args.id)  # admitted and delegated before it is given a way in
        token = agentkeys.agent_token(cfg.keys_dir, args.id, create=True)
        emit(args, {"agent_id": args.id, "token": token},
             lambda d: f"{d['token']}\n(send it as `Authorization: Bearer <token>` to act as {d['agent_id']}; "
                       "kept 0600 under keys/agents/, shown once here)")
        return EXIT_OK
    return with_service(go, cfg, require_identity=True)
