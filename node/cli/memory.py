"""Memories and links from the command line: store, update, get, list, recall, link, links, verify, and the
audit chain's check."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_CHECK, EXIT_OK, emit, with_service
from node.config import NodeConfig

if TYPE_CHECKING:
    from node.cli.common import Commands
    from node.service import Service


def add_parsers(sub: Commands) -> None:
    """store, update, get, list, recall, link, links, verify."""
    s = sub.add_parser("store", help="store a memory")
    s.add_argument("content", help="memory text")
    s.add_argument("--title", default="", help="short title (default none)")
    s.add_argument("--namespace", default="default", help="namespace (default 'default'); [federation.namespaces] "
                                                          "may restrict which peers it replicates to")
    s.add_argument("--tag", action="append", default=[], dest="tags", help="a tag; repeat for more")
    s.add_argument("--priority", type=int, default=5, help="1..10 (default 5)")
    s.add_argument("--confidence", type=float, default=1.0, help="0..1 (default 1)")
    s.add_argument("--source", default="", help="where the memory came from (free text)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(handler=_store)

    up = sub.add_parser("update", help="change fields of a memory (new version, replicated)")
    up.add_argument("id", help="memory id")
    up.add_argument("--content", help="new text")
    up.add_argument("--title", help="new title")
    up.add_argument("--tag", action="append", dest="tags", help="a tag; repeat for more; replaces all tags")
    up.add_argument("--priority", type=int, help="1..10")
    up.add_argument("--confidence", type=float, help="0..1")
    up.add_argument("--source", help="where the memory came from (free text)")
    up.add_argument("--json", action="store_true")
    up.set_defaults(handler=_update)

    gm = sub.add_parser("get", help="show one memory")
    gm.add_argument("id", help="memory id")
    gm.add_argument("--json", action="store_true")
    gm.set_defaults(handler=_get)

    lm = sub.add_parser("list", help="list memories, newest first")
    lm.add_argument("--namespace", help="only this namespace")
    lm.add_argument("--limit", type=int, default=50, help="most rows (default 50, at most limits.max_recall_limit)")
    lm.add_argument("--offset", type=int, default=0, help="rows to skip (default 0)")
    lm.add_argument("--json", action="store_true")
    lm.set_defaults(handler=_list)

    r = sub.add_parser("recall", help="full-text recall, ranked by BM25")
    r.add_argument("query", help="search text (any text is a safe query)")
    r.add_argument("--limit", type=int, default=10, help="most hits (default 10)")
    r.add_argument("--namespace", help="only this namespace")
    r.add_argument("--json", action="store_true")
    r.set_defaults(handler=_recall)
    _add_link_parsers(sub)


def _add_link_parsers(sub: Commands) -> None:
    lk = sub.add_parser("link", help="link two memories (signed with the node key when present)")
    lk.add_argument("src_id", help="memory id the link starts at")
    lk.add_argument("dst_id", help="memory id the link points to")
    lk.add_argument("relation", help="e.g. related_to, contradicts, derived_from")
    lk.add_argument("--valid-until", type=int, help="end of validity, unix milliseconds")
    lk.add_argument("--confidence", type=float, help="0..1")
    lk.add_argument("--json", action="store_true")
    lk.set_defaults(handler=_link)

    ls = sub.add_parser("links", help="list links")
    ls.add_argument("--attest-level", choices=["unsigned", "self_signed", "peer_attested"],
                    help="only links at this level")
    ls.add_argument("--limit", type=int, default=50, help="most rows (default 50)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=_links)

    v = sub.add_parser("verify", help="re-derive a link's or a memory version's signed payload and check its "
                                      "signature (exit 3 if it fails)")
    v.add_argument("id", help="a link_id, or a memory id (its current version is checked)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(handler=_verify)


def add_audit_parsers(sub: Commands) -> None:
    """audit verify (listed after the graph and transcript commands, where `ai-memory --help` has it)."""
    a = sub.add_parser("audit", help="the append-only signed event chain")
    asub = a.add_commands(dest="sub", required=True, metavar="ACTION")
    av = asub.add_parser("verify", help="walk the hash chain; exit 3 and name the first bad seq if broken")
    av.add_argument("--json", action="store_true")
    av.set_defaults(handler=_audit_verify)


def _memory_line(m: dict[str, Any]) -> str:
    title = f" {m['title']!r}" if m["title"] else ""
    text = m["content"] if len(m["content"]) <= 80 else m["content"][:77] + "..."
    return f"{m['id']}  [{m['namespace']}]{title} {text}"


def _link_line(link: dict[str, Any]) -> str:
    return (f"{link['link_id']}  {link['src_id']} -[{link['relation']}]-> {link['dst_id']}  "
            f"{link['attest_level']}  by {link['observed_by']}")


def _store(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        m = await svc.memory_store(args.content, title=args.title, namespace=args.namespace, tags=args.tags,
                                   priority=args.priority, confidence=args.confidence, source=args.source)
        emit(args, m, lambda m: m["id"])
        return EXIT_OK
    return with_service(go, cfg)


def _update(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        m = await svc.memory_update(args.id, content=args.content, title=args.title, tags=args.tags,
                                    priority=args.priority, confidence=args.confidence, source=args.source)
        emit(args, m, lambda m: f"{m['id']} version {m['version']}")
        return EXIT_OK
    return with_service(go, cfg)


def _get(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        m = await svc.memory_get(args.id)
        emit(args, m, lambda m: "\n".join(f"{k}: {v}" for k, v in m.items()))
        return EXIT_OK
    return with_service(go, cfg)


def _list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        ms = await svc.memory_list(namespace=args.namespace, limit=args.limit, offset=args.offset)
        emit(args, ms, lambda ms: "\n".join(map(_memory_line, ms)) or "no memories")
        return EXIT_OK
    return with_service(go, cfg)


def _recall(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        hits = await svc.memory_recall(args.query, limit=args.limit, namespace=args.namespace)
        emit(args, hits, lambda hs: "\n".join(f"{h['score']:8.3f}  {_memory_line(h)}" for h in hs) or "no match")
        return EXIT_OK
    return with_service(go, cfg)


def _link(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        link = await svc.memory_link(args.src_id, args.dst_id, args.relation, valid_until=args.valid_until,
                                     confidence=args.confidence)
        emit(args, link, _link_line)
        return EXIT_OK
    return with_service(go, cfg)


def _links(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        rows = await svc.links_list(attest_level=args.attest_level, limit=args.limit)
        emit(args, rows, lambda rows: "\n".join(map(_link_line, rows)) or "no links")
        return EXIT_OK
    return with_service(go, cfg)


def _verify(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        r = await svc.memory_verify(args.id)

        def human(r: dict[str, Any]) -> str:
            verdict = "VERIFIED" if r["signature_verified"] else f"NOT VERIFIED ({r['reason']})"
            what = r["link_id"] if "link_id" in r else f"{r['memory_id']} v{r['version']}"
            return f"{what}  {verdict}  attest_level={r['attest_level']}  signed_by={r['signed_by']}"

        emit(args, r, human)
        return EXIT_OK if r["signature_verified"] else EXIT_CHECK
    return with_service(go, cfg)


def _audit_verify(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        r = await svc.audit_verify()

        def human(r: dict[str, Any]) -> str:
            if r["ok"]:
                return f"audit chain intact: {r['checked']} event(s) checked"
            return f"audit chain BROKEN at seq {r['first_bad_seq']}: {r['reason']}"

        emit(args, r, human)
        return EXIT_OK if r["ok"] else EXIT_CHECK
    return with_service(go, cfg)
