"""The node process and its mesh: ``serve``, the mesh CA and node certificates, and A2A messages (send one,
the dead letters)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_CHECK, EXIT_OK, config_file, emit, resolve_config, with_service
from node.config import NodeConfig
from node.errors import ServiceError

if TYPE_CHECKING:
    import sqlite3

    from a2a import Envelope
    from node.cli.common import Commands
    from node.service import Service


def add_parsers(sub: Commands) -> None:
    """serve, mesh (ca init, cert issue), a2a (send, dead-letters)."""
    sv = sub.add_parser("serve", help="run the node: mTLS mesh server, peer links, outbox sender, local MCP")
    sv.add_argument("--restore", action="store_true",
                    help="restore from the mesh: start from an empty store (refused otherwise) and pull what every "
                         "peer holds, this node's own writes included; progress in the log and `status`")
    sv.set_defaults(json=False, handler=_serve)

    m = sub.add_parser("mesh", help="the mesh CA and node TLS certificates")
    msub = m.add_commands(dest="sub", required=True, metavar="ACTION")
    ca = msub.add_parser("ca", help="mesh certificate authority")
    casub = ca.add_commands(dest="sub2", required=True, metavar="ACTION")
    ci = casub.add_parser("init", help="create ca.key (0600) and a self-signed ca.crt in --out")
    ci.add_argument("--out", type=Path, required=True, help="directory for ca.key and ca.crt")
    ci.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    ci.add_argument("--force", action="store_true", help="replace an existing CA")
    ci.set_defaults(handler=_ca_init)
    cert = msub.add_parser("cert", help="node certificates")
    certsub = cert.add_commands(dest="sub2", required=True, metavar="ACTION")
    cis = certsub.add_parser("issue", help="issue a node certificate over the node's own Ed25519 identity key")
    cis.add_argument("--ca", type=Path, required=True, help="CA directory (from `mesh ca init`)")
    cis.add_argument("--agent-id", required=True, help="the node's agent id, e.g. ai:node-1@lab")
    cis.add_argument("--pub", type=Path, required=True, help="the node's <agent_id>.pub")
    cis.add_argument("--out", type=Path, help="certificate path (default: <home>/tls/node.crt from the config)")
    cis.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    cis.add_argument("--ip", action="append", default=[], help="extra IP SAN (repeatable)")
    cis.set_defaults(handler=_cert_issue)
    _add_a2a_parsers(sub)


def _add_a2a_parsers(sub: Commands) -> None:
    a2 = sub.add_parser("a2a", help="A2A messaging tools")
    a2sub = a2.add_commands(dest="sub", required=True, metavar="ACTION")
    snd = a2sub.add_parser("send", help="send one message to a peer and print its ACK and latency")
    snd.add_argument("--to", required=True, help="peer agent id (its url comes from [[mesh.peers]] or --url)")
    snd.add_argument("--url", help="peer base url, e.g. https://127.0.0.1:7444")
    snd.add_argument("--kind", default="ping", choices=["ping"], help="payload kind (default ping)")
    snd.add_argument("--correlation-id", help="reuse a correlation id (to see duplicate handling)")
    snd.add_argument("--ttl", type=float, help="seconds until expires_at (default a2a.ttl_s; <= 0 sends expired)")
    snd.add_argument("--queue", action="store_true",
                     help="write it to the outbox instead; the running node delivers it with retries "
                          "(the peer must be in [[mesh.peers]]; --url is not used)")
    snd.add_argument("--json", action="store_true")
    snd.set_defaults(handler=_a2a_send)
    dl = a2sub.add_parser("dead-letters", help="messages that exhausted their retries; --replay re-sends")
    dl.add_argument("--peer", help="only this peer")
    g2 = dl.add_mutually_exclusive_group()
    g2.add_argument("--replay", type=int, metavar="ID", help="re-queue one dead letter (fresh id and expiry)")
    g2.add_argument("--replay-all", action="store_true", help="re-queue every dead letter (of --peer)")
    dl.add_argument("--json", action="store_true")
    dl.set_defaults(handler=_dead_letters)


def _serve(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node import log
    from node.node import run_serve
    log.setup(cfg.agent_id or "?", cfg.log.level, cfg.log.format)
    # SIGHUP reads the same file again.
    return run_serve(cfg, lambda: resolve_config(args), restore=args.restore, config_path=config_file(args))


def _ca_init(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import ca
    paths = ca.init_ca(args.out, validity_days=args.days, force=args.force)
    print(f"CA key  {paths.key} (0600, keep it offline)")
    print(f"CA cert {paths.cert} (give to every node as mesh.ca_cert)")
    return EXIT_OK


def _cert_issue(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import ca
    out = args.out or cfg.cert_path
    out.parent.mkdir(parents=True, exist_ok=True)
    path = ca.issue_node_cert(args.ca, args.agent_id, args.pub, out, validity_days=args.days,
                              extra_ips=tuple(args.ip))
    print(f"certificate for {args.agent_id}: {path}")
    return EXIT_OK


def _peer_url(cfg: NodeConfig, agent_id: str, url: str | None) -> str:
    if url:
        return url.rstrip("/")
    for p in cfg.mesh.peers:
        if p.agent_id == agent_id:
            return p.url
    raise ServiceError("unknown_peer", f"no [[mesh.peers]] entry for {agent_id!r}; pass --url")


def _a2a_send(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        env, now = _envelope(args, cfg, svc.agent_id)
        if args.queue:
            return await _queue(args, cfg, svc, env, now)
        return await _post(args, cfg, svc, env)
    return with_service(go, cfg, require_identity=True)


def _envelope(args: argparse.Namespace, cfg: NodeConfig, sender: str) -> tuple[Envelope, int]:
    """The ping --to asks for, expiring --ttl (s) from now, under --correlation-id when given; and now (unix ms)."""
    from a2a import Envelope, new_envelope
    from node.service import now_ms

    ttl_s = cfg.a2a.ttl_s if args.ttl is None else args.ttl
    now = now_ms()
    payload = {"kind": args.kind, "sent_at": now}
    env = new_envelope(sender, [args.to], payload, now, max(1, int(ttl_s * 1000)))
    if args.correlation_id or ttl_s <= 0:
        env = Envelope(correlation_id=args.correlation_id or env.correlation_id, sender=env.sender,
                       recipients=env.recipients, payload=payload, expires_at=now + int(ttl_s * 1000))
    return env, now


async def _queue(args: argparse.Namespace, cfg: NodeConfig, svc: Service, env: Envelope, now: int) -> int:
    """Write ``env`` to the outbox (enqueued at ``now``, unix ms); the running node delivers it."""
    from storage import outbox

    if args.to not in {p.agent_id for p in cfg.mesh.peers}:
        raise ServiceError("unknown_peer", f"no [[mesh.peers]] entry for {args.to!r}: the node would never "
                                           "deliver a queued message to it (--url applies without --queue)")
    await svc.db.write(outbox.enqueue, env.correlation_id, args.to, env.kind, env.to_wire(), env.expires_at, now, now)
    emit(args, {"queued": env.correlation_id, "peer": args.to}, lambda d: f"queued {d['queued']}")
    return EXIT_OK


async def _post(args: argparse.Namespace, cfg: NodeConfig, svc: Service, env: Envelope) -> int:
    """Send ``env`` to the peer now and report its ACK and the latency (ms); exit 3 unless it is accepted."""
    from mesh import tls
    from mesh.link import post_envelope

    ident = svc.identity
    assert ident is not None  # opened with require_identity
    ctx = tls.client_context(cfg.cert_path, ident.priv_path, cfg.ca_cert_path)
    t0 = time.perf_counter()
    status, ack, err = await post_envelope(_peer_url(cfg, args.to, args.url), env, ctx,
                                           expected_agent_id=args.to, pinned=svc.peer_keys,
                                           timeout_s=cfg.a2a.ack_timeout_s, max_bytes=cfg.a2a.max_message_bytes)
    ms = (time.perf_counter() - t0) * 1000
    out = {"correlation_id": env.correlation_id, "http_status": status, "latency_ms": round(ms, 3),
           "ack": ack.to_map() if ack else None, "error": (err or {}).get("error")}

    def human(d: dict[str, Any]) -> str:
        if d["ack"]:
            a = d["ack"]
            verdict = "accepted" if a["accepted"] else a["reason"]
            return f"ACK {verdict} from {a['recipient']} in {d['latency_ms']} ms ({d['correlation_id']})"
        return f"no ACK: HTTP {d['http_status']} {d['error']} ({d['correlation_id']})"

    emit(args, out, human)
    return EXIT_OK if ack and ack.accepted else EXIT_CHECK


def _dead_letters(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.log import iso_ms
    from storage import outbox

    async def go(svc: Service) -> int:
        if args.replay is not None or args.replay_all:
            return await _replay_dead_letters(args, cfg, svc)
        rows = await svc.db.read(outbox.dead_letters, args.peer, 1000)
        data = [{"id": d.id, "peer": d.peer, "kind": d.kind, "correlation_id": d.correlation_id,
                 "attempts": d.attempts, "last_error": d.last_error, "dead_at": d.dead_at} for d in rows]
        emit(args, data, lambda rows: "\n".join(
            f"{r['id']:>6}  {iso_ms(r['dead_at'])}  {r['peer']}  {r['kind']}  attempts={r['attempts']}  "
            f"{r['last_error']}" for r in rows) or "no dead letters")
        return EXIT_OK
    return with_service(go, cfg)


async def _replay_dead_letters(args: argparse.Namespace, cfg: NodeConfig, svc: Service) -> int:
    """Queue --replay ID (or every dead letter of --peer) again, each with a fresh id and expiry."""
    from a2a import Envelope, decode_frame, new_envelope
    from node.service import now_ms
    from storage import outbox

    ids = [args.replay] if args.replay is not None else [
        d.id for d in await svc.db.read(outbox.dead_letters, args.peer, 1_000_000)]

    def replay(conn: sqlite3.Connection, dead_id: int) -> str:
        dead = outbox.get_dead_letter(conn, dead_id)
        if dead is None:
            raise ServiceError("not_found", f"no dead letter with id {dead_id}")
        old = decode_frame(dead.envelope, cfg.a2a.max_message_bytes)
        assert isinstance(old, Envelope)  # the outbox holds envelopes, never ACKs
        now = now_ms()
        env = new_envelope(old.sender, old.recipients, old.payload, now, int(cfg.a2a.ttl_s * 1000))
        outbox.replay_dead_letter(conn, dead_id, now, env.expires_at, envelope=env.to_wire(),
                                  correlation_id=env.correlation_id)
        return env.correlation_id

    done = [(i, await svc.db.write(replay, i)) for i in ids]
    emit(args, [{"dead_letter": i, "correlation_id": c} for i, c in done],
         lambda rows: f"re-queued {len(rows)} message(s); the running node delivers them")
    return EXIT_OK
