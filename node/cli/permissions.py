"""Who may do what, from the command line: permission rules, the approvals an ``ask`` parks, and webhook
subscriptions (docs/permissions.md)."""

from __future__ import annotations

import argparse
import hashlib
import os
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_OK, Handler, emit, with_service
from node.config import NodeConfig
from node.errors import ServiceError

if TYPE_CHECKING:
    from node.cli.common import Commands
    from node.events.webhooks import Webhooks
    from node.permissions.gate import Gate
    from node.service import Service


def add_parsers(sub: Commands) -> None:
    """permissions (list, check, add), approvals, subscriptions."""
    ops = "store, update, link, recall, get, list, verify, replay or *"
    pm = sub.add_parser("permissions", help="permission rules (docs/permissions.md)")
    psub = pm.add_commands(dest="sub", required=True, metavar="ACTION")
    pl = psub.add_parser("list", help="the rules in force, in evaluation order, and the mode")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(handler=_permissions_list)
    ck = psub.add_parser("check", help="what the rules answer for one request (whatever the mode)")
    ck.add_argument("--agent", required=True, help="agent id (this node's own for local callers, or a peer's)")
    ck.add_argument("--namespace", required=True, help="namespace the request writes or reads")
    ck.add_argument("--operation", required=True, help=ops)
    ck.add_argument("--json", action="store_true")
    ck.set_defaults(handler=_permissions_check)
    ad = psub.add_parser("add", help="add a runtime rule (stored in the database; a running node sees it)")
    ad.add_argument("--agent", required=True, help="agent id or *")
    ad.add_argument("--namespace", required=True, help="namespace (its subtree too) or *")
    ad.add_argument("--operation", action="append", required=True, dest="operations", help=f"repeatable: {ops}")
    ad.add_argument("--action", required=True, choices=["allow", "deny", "ask"],
                    help="allow, deny, or ask (park the write until a person approves it)")
    ad.add_argument("--no-inherit", action="store_true",
                    help="break inheritance here: rules on the namespaces above are not consulted")
    ad.add_argument("--json", action="store_true")
    ad.set_defaults(handler=_permissions_add)
    _add_approval_parsers(sub)
    _add_subscription_parsers(sub)


def _add_approval_parsers(sub: Commands) -> None:
    ap = sub.add_parser("approvals", help="pending actions parked by an ask")
    asub = ap.add_commands(dest="sub", required=True, metavar="ACTION")
    al = asub.add_parser("list", help="pending actions, oldest first")
    al.add_argument("--status", default="pending", choices=["pending", "applied", "denied", "expired", "failed"],
                    help="which actions (default pending)")
    al.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    al.add_argument("--json", action="store_true")
    al.set_defaults(handler=_approvals_list)
    for name, what in (("approve", "run the parked write now (exactly once)"), ("deny", "refuse it for good")):
        d = asub.add_parser(name, help=what)
        d.add_argument("id", help="pending action id")
        d.add_argument("--by", default=os.environ.get("USER") or "cli", help="who decides (default $USER)")
        if name == "approve":
            d.add_argument("--remember", choices=["once", "forever"], default="once",
                           help="forever: answer the same ask for this namespace from now on")
        d.add_argument("--json", action="store_true")
        d.set_defaults(handler=_decide(name))

    rk = asub.add_parser("rotate-key", help="a new HMAC key for the approval API; the old one verifies for "
                                            "approval.key_grace_s more (a running node sees it at once)")
    rk.add_argument("--json", action="store_true")
    rk.set_defaults(handler=_approvals_rotate_key)


def _add_subscription_parsers(sub: Commands) -> None:
    sb = sub.add_parser("subscriptions", help="webhook subscriptions (signed deliveries, retries, dead letters)")
    ssub = sb.add_commands(dest="sub", required=True, metavar="ACTION")
    sa = ssub.add_parser("add", help="subscribe a URL to events; prints the signing secret once")
    sa.add_argument("--url", required=True, help="where deliveries are POSTed (signed with the secret)")
    sa.add_argument("--event", action="append", required=True, dest="events",
                    help="repeatable: approval.requested, approval.decided, memory.stored, link.attested or *")
    sa.add_argument("--json", action="store_true")
    sa.set_defaults(handler=_subscriptions_add)
    sl = ssub.add_parser("list", help="subscriptions")
    sl.add_argument("--json", action="store_true")
    sl.set_defaults(handler=_subscriptions_list)
    sd = ssub.add_parser("deliveries", help="deliveries, oldest first")
    sd.add_argument("--status", choices=["pending", "delivered", "dead"], help="only these (default all)")
    sd.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    sd.add_argument("--json", action="store_true")
    sd.set_defaults(handler=_subscriptions_deliveries)
    sr = ssub.add_parser("replay", help="queue a dead delivery again (the running node sends it)")
    sr.add_argument("id", type=int, help="delivery id (from `subscriptions deliveries --status dead`)")
    sr.add_argument("--json", action="store_true")
    sr.set_defaults(handler=_subscriptions_replay)


# ---- permission rules -----------------------------------------------------------------------

def _permissions_list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        snap = _gate(svc).snapshot()
        emit(args, snap, lambda s: f"mode {s['mode']}, default {s['default']}, {s['rules']} rule(s)\n"
             + "\n".join(s["rule_summary"]))
        return EXIT_OK
    return with_service(go, cfg)


def _permissions_check(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.hooks.decision import decision_to_wire
    from node.permissions.rules import Operation

    async def go(svc: Service) -> int:
        try:
            op = Operation(args.operation)
        except ValueError:
            raise ServiceError("bad_input", f"--operation must be one of {', '.join(Operation)}, "
                                            f"got {args.operation!r}") from None
        gate = _gate(svc)
        decision, rule = gate.check(args.agent, args.namespace, op)
        out = {**decision_to_wire(decision), "rule": rule.summary() if rule else None, "mode": str(gate.mode)}
        emit(args, out, lambda d: f"{d['decision']}  ({d['rule'] or 'no rule: the default'}; mode {d['mode']})")
        return EXIT_OK
    return with_service(go, cfg)


def _permissions_add(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.service import now_ms

    async def go(svc: Service) -> int:
        rule = await _gate(svc).add_rule({"agent": args.agent, "namespace": args.namespace,
                                          "operations": args.operations, "action": args.action,
                                          "inherit": not args.no_inherit}, os.environ.get("USER") or "cli", now_ms())
        emit(args, {"rule": rule.summary()}, lambda d: f"added: {d['rule']}")
        return EXIT_OK
    return with_service(go, cfg)


def _gate(svc: Service) -> Gate:
    """The service's permission gate (``open_service`` always builds one)."""
    assert svc.gate is not None
    return svc.gate


# ---- approvals ------------------------------------------------------------------------------

def _action_line(a: dict[str, Any]) -> str:
    return (f"{a['id']}  {a['status']:<8} {a['operation']:<7} [{a['namespace']}] by {a['agent']}  "
            f"asked by {a['asked_by']}: {a['prompt']}")


def _approvals_list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        rows = await svc.approval_list(status=args.status, limit=args.limit)
        emit(args, rows, lambda rows: "\n".join(map(_action_line, rows)) or f"no {args.status} actions")
        return EXIT_OK
    return with_service(go, cfg)


def _decide(choice: str) -> Handler:
    """The handler of ``approvals approve`` or ``approvals deny``."""
    def handler(args: argparse.Namespace, cfg: NodeConfig) -> int:
        async def go(svc: Service) -> int:
            a = await svc.approval_decide(args.id, choice, decided_by=args.by,
                                          remember=getattr(args, "remember", "once"))
            emit(args, a, _action_line)
            return EXIT_OK
        return with_service(go, cfg)
    return handler


def _approvals_rotate_key(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.permissions import approval_api

    new = approval_api.rotate_key(cfg)
    out = {"key_path": str(approval_api.key_path(cfg)), "key_sha256_prefix": hashlib.sha256(new).hexdigest()[:16],
           "previous_valid_s": cfg.approval.key_grace_s}
    emit(args, out, lambda d: f"new approval key in {d['key_path']} (sha256 {d['key_sha256_prefix']}...); the "
                              f"previous key verifies for {d['previous_valid_s']:g} s more")
    return EXIT_OK


# ---- webhook subscriptions ------------------------------------------------------------------

def _webhooks(svc: Service) -> Webhooks:
    """The subscriptions of a service ``open_service`` built (it always builds them)."""
    assert svc.webhooks is not None, "open_service builds every service with its webhooks"
    return svc.webhooks


def _subscriptions_add(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        sub = await _webhooks(svc).subscribe(args.url, args.events)
        emit(args, sub, lambda d: f"subscription {d['id']} -> {d['url']} ({', '.join(d['events'])})\n"
                                  f"signing secret (shown once): {d['secret']}")
        return EXIT_OK
    return with_service(go, cfg)


def _subscriptions_list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from storage import subscriptions

    async def go(svc: Service) -> int:
        rows = await svc.db.read(subscriptions.list_)
        emit(args, rows, lambda rows: "\n".join(f"{r['id']:>4}  {r['url']}  {', '.join(r['events'])}"
                                                 for r in rows) or "no subscriptions")
        return EXIT_OK
    return with_service(go, cfg)


def _subscriptions_deliveries(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        rows = [{"id": d.id, "subscription_id": d.subscription_id, "url": d.url, "event": d.event,
                 "status": d.status, "attempts": d.attempts, "last_error": d.last_error, "created_at": d.created_at,
                 "delivered_at": d.delivered_at}
                for d in await _webhooks(svc).deliveries(args.status, args.limit)]
        emit(args, rows, lambda rows: "\n".join(
            f"{r['id']:>6}  {r['status']:<9} {r['event']:<18} attempts={r['attempts']}  {r['last_error'] or ''}"
            for r in rows) or "no deliveries")
        return EXIT_OK
    return with_service(go, cfg)


def _subscriptions_replay(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        await _webhooks(svc).replay(args.id)
        emit(args, {"replayed": args.id}, lambda d: f"delivery {d['replayed']} queued again")
        return EXIT_OK
    return with_service(go, cfg)
