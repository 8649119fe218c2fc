"""The ``ai-memory`` command line.

Exit codes: 0 success; 1 an operation failed (the message names the stable error code);
2 usage error; 3 a check ran and found a problem (a link that does not verify, a broken audit chain).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from node.config import HOME_ENV, NodeConfig, load_config
from node.errors import describe, is_project_error

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CHECK = 0, 1, 2, 3

Handler = Callable[[argparse.Namespace, NodeConfig], int]
_HANDLERS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _HANDLERS[name] = fn
        return fn
    return register


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ai-memory", description="attested-mesh node: memories, signed links, federation.")
    p.add_argument("--config", type=Path, help="node config TOML (default: <home>/config.toml when it exists)")
    p.add_argument("--home", type=Path, help=f"node home directory (overrides {HOME_ENV} and the config file)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    ident = sub.add_parser("identity", help="manage this node's Ed25519 identity and trusted peer keys")
    isub = ident.add_subparsers(dest="sub", required=True, metavar="ACTION")
    g = isub.add_parser("generate", help="create <home>/keys/<agent_id>.priv (0600) and .pub (0644)")
    g.add_argument("--agent-id", required=True, help="immutable agent id, e.g. ai:node-1@lab")
    g.add_argument("--force", action="store_true", help="replace an existing identity")
    i = isub.add_parser("import", help="trust a peer: copy its .pub into <home>/peers/")
    i.add_argument("file", type=Path, help="the peer's <agent_id>.pub")
    i.add_argument("--agent-id", help="peer agent id (default: the file name without .pub)")
    i.add_argument("--force", action="store_true", help="replace a different key already trusted for that id")
    isub.add_parser("list", help="this node's identity and trusted peers, with fingerprints").add_argument(
        "--json", action="store_true")
    e = isub.add_parser("export-pub", help="copy this node's .pub to a directory to hand to other operators")
    e.add_argument("--out", type=Path, default=Path("."), help="destination directory (default: .)")

    s = sub.add_parser("store", help="store a memory")
    s.add_argument("content", help="memory text")
    s.add_argument("--title", default="")
    s.add_argument("--namespace", default="default")
    s.add_argument("--tag", action="append", default=[], dest="tags", help="repeatable")
    s.add_argument("--priority", type=int, default=5, help="1..10 (default 5)")
    s.add_argument("--confidence", type=float, default=1.0, help="0..1 (default 1)")
    s.add_argument("--source", default="")
    s.add_argument("--json", action="store_true")

    gm = sub.add_parser("get", help="show one memory")
    gm.add_argument("id")
    gm.add_argument("--json", action="store_true")

    lm = sub.add_parser("list", help="list memories, newest first")
    lm.add_argument("--namespace")
    lm.add_argument("--limit", type=int, default=50)
    lm.add_argument("--offset", type=int, default=0)
    lm.add_argument("--json", action="store_true")

    r = sub.add_parser("recall", help="full-text recall, ranked by BM25")
    r.add_argument("query")
    r.add_argument("--limit", type=int, default=10)
    r.add_argument("--namespace")
    r.add_argument("--json", action="store_true")

    lk = sub.add_parser("link", help="link two memories (signed with the node key when present)")
    lk.add_argument("src_id")
    lk.add_argument("dst_id")
    lk.add_argument("relation", help="e.g. related_to, contradicts, derived_from")
    lk.add_argument("--valid-until", type=int, help="end of validity, unix milliseconds")
    lk.add_argument("--confidence", type=float)
    lk.add_argument("--json", action="store_true")

    ls = sub.add_parser("links", help="list links")
    ls.add_argument("--attest-level", choices=["unsigned", "self_signed", "peer_attested"])
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--json", action="store_true")

    v = sub.add_parser("verify", help="re-derive a link's payload and check its signature (exit 3 if it fails)")
    v.add_argument("link_id")
    v.add_argument("--json", action="store_true")

    a = sub.add_parser("audit", help="the append-only signed event chain")
    asub = a.add_subparsers(dest="sub", required=True, metavar="ACTION")
    asub.add_parser("verify", help="walk the hash chain; exit 3 and name the first bad seq if broken").add_argument(
        "--json", action="store_true")

    return p


def resolve_config(args: argparse.Namespace) -> NodeConfig:
    env = dict(os.environ)
    if args.home is not None:
        env[HOME_ENV] = str(args.home)
    path = args.config
    if path is None:
        home = Path(env.get(HOME_ENV) or "~/.config/ai-memory").expanduser()
        candidate = home / "config.toml"
        path = candidate if candidate.exists() else None
    return load_config(path, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    key = f"{args.cmd} {args.sub}" if getattr(args, "sub", None) else args.cmd
    try:
        cfg = resolve_config(args)
        return _HANDLERS[key](args, cfg)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place errors become messages and exit codes
        if not is_project_error(exc):
            raise
        d = describe(exc)
        print(f"ai-memory: error [{d.code}]: {d.message}", file=sys.stderr)
        return EXIT_FAILED


def run_async(coro: Awaitable[int]) -> int:
    return asyncio.run(coro)  # type: ignore[arg-type]


def emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(human(data))


def with_service(fn: Callable[[Any], Awaitable[int]], cfg: NodeConfig, *, require_identity: bool = False) -> int:
    from node.service import Service

    async def go() -> int:
        svc = await Service.open(cfg, require_identity=require_identity)
        try:
            return await fn(svc)
        finally:
            await svc.close()

    return run_async(go())


# ---- identity -----------------------------------------------------------------------------

@command("identity generate")
def _identity_generate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    ident = keys.generate_identity(cfg.keys_dir, args.agent_id, force=args.force)
    print(f"identity {ident.agent_id}  fingerprint {ident.fingerprint}")
    print(f"  private key {ident.priv_path} (0600)")
    print(f"  public key  {ident.pub_path} (hand this file to peer operators)")
    return EXIT_OK


@command("identity import")
def _identity_import(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    peer = keys.import_peer(cfg.peers_dir, args.file, agent_id=args.agent_id, force=args.force)
    print(f"trusted peer {peer.agent_id}  fingerprint {peer.fingerprint}  ({peer.path})")
    return EXIT_OK


@command("identity list")
def _identity_list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    infos = keys.list_keys(cfg.keys_dir, cfg.peers_dir)
    rows = [{"agent_id": k.agent_id, "fingerprint": k.fingerprint, "trust": k.trust, "path": str(k.path)}
            for k in infos]

    def human(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return f"no identity or peers under {cfg.home}"
        width = max(len(r["agent_id"]) for r in rows)
        return "\n".join(f"{r['agent_id']:<{width}}  {r['fingerprint']}  {r['trust']}" for r in rows)

    emit(args, rows, human)
    return EXIT_OK


@command("identity export-pub")
def _identity_export(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    ident = keys.load_identity(cfg.keys_dir, cfg.agent_id or None)
    out = keys.export_pub(cfg.keys_dir, ident.agent_id, args.out)
    print(out)
    return EXIT_OK


# ---- memories and links -------------------------------------------------------------------

def _memory_line(m: dict[str, Any]) -> str:
    title = f" {m['title']!r}" if m["title"] else ""
    text = m["content"] if len(m["content"]) <= 80 else m["content"][:77] + "..."
    return f"{m['id']}  [{m['namespace']}]{title} {text}"


@command("store")
def _store(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        m = await svc.memory_store(args.content, title=args.title, namespace=args.namespace, tags=args.tags,
                                   priority=args.priority, confidence=args.confidence, source=args.source)
        emit(args, m, lambda m: m["id"])
        return EXIT_OK
    return with_service(go, cfg)


@command("get")
def _get(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        m = await svc.memory_get(args.id)
        emit(args, m, lambda m: "\n".join(f"{k}: {v}" for k, v in m.items()))
        return EXIT_OK
    return with_service(go, cfg)


@command("list")
def _list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        ms = await svc.memory_list(namespace=args.namespace, limit=args.limit, offset=args.offset)
        emit(args, ms, lambda ms: "\n".join(map(_memory_line, ms)) or "no memories")
        return EXIT_OK
    return with_service(go, cfg)


@command("recall")
def _recall(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        hits = await svc.memory_recall(args.query, limit=args.limit, namespace=args.namespace)
        emit(args, hits, lambda hs: "\n".join(f"{h['score']:8.3f}  {_memory_line(h)}" for h in hs) or "no match")
        return EXIT_OK
    return with_service(go, cfg)


def _link_line(link: dict[str, Any]) -> str:
    return (f"{link['link_id']}  {link['src_id']} -[{link['relation']}]-> {link['dst_id']}  "
            f"{link['attest_level']}  by {link['observed_by']}")


@command("link")
def _link(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        link = await svc.memory_link(args.src_id, args.dst_id, args.relation, valid_until=args.valid_until,
                                     confidence=args.confidence)
        emit(args, link, _link_line)
        return EXIT_OK
    return with_service(go, cfg)


@command("links")
def _links(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        rows = await svc.links_list(attest_level=args.attest_level, limit=args.limit)
        emit(args, rows, lambda rows: "\n".join(map(_link_line, rows)) or "no links")
        return EXIT_OK
    return with_service(go, cfg)


@command("verify")
def _verify(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.memory_verify(args.link_id)

        def human(r: dict[str, Any]) -> str:
            verdict = "VERIFIED" if r["signature_verified"] else f"NOT VERIFIED ({r['reason']})"
            return f"{r['link_id']}  {verdict}  attest_level={r['attest_level']}  signed_by={r['signed_by']}"

        emit(args, r, human)
        return EXIT_OK if r["signature_verified"] else EXIT_CHECK
    return with_service(go, cfg)


@command("audit verify")
def _audit_verify(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.audit_verify()

        def human(r: dict[str, Any]) -> str:
            if r["ok"]:
                return f"audit chain intact: {r['checked']} event(s) checked"
            return f"audit chain BROKEN at seq {r['first_bad_seq']}: {r['reason']}"

        emit(args, r, human)
        return EXIT_OK if r["ok"] else EXIT_CHECK
    return with_service(go, cfg)


if __name__ == "__main__":
    sys.exit(main())
