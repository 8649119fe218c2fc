"""``ai-memory kg``: the knowledge graph over the links (node/kg.py): neighbours, paths, timeline, invalidate."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_OK, emit, with_service
from node.config import NodeConfig

if TYPE_CHECKING:
    from node.cli.common import Commands
    from node.service import Service


def add_parsers(sub: Commands) -> None:
    kg = sub.add_parser("kg", help="the knowledge graph over the links: neighbours, paths, timeline, invalidate")
    kgsub = kg.add_commands(dest="sub", required=True, metavar="ACTION")
    kq = kgsub.add_parser("query", help="memories reachable from one memory, each with the path that reached it")
    kq.add_argument("memory_id", help="the memory to start from")
    kq.add_argument("--depth", type=int, default=2, help="hops, 1..kg.max_depth (default 2)")
    kq.add_argument("--relation", action="append", dest="relations", help="only these relations (repeatable)")
    kq.add_argument("--as-of", type=int, help="links valid at this instant, unix ms (default now)")
    kq.add_argument("--limit", type=int, help="most neighbours (default kg.max_results)")
    kq.add_argument("--json", action="store_true")
    kq.set_defaults(handler=_query)
    kp = kgsub.add_parser("paths", help="simple paths between two memories, shortest first")
    kp.add_argument("src_id", help="memory id the paths start at")
    kp.add_argument("dst_id", help="memory id the paths end at")
    kp.add_argument("--max-depth", type=int, default=3, help="most links per path, 1..kg.max_depth (default 3)")
    kp.add_argument("--limit", type=int, default=10, help="most paths, 1..kg.max_paths (default 10)")
    kp.add_argument("--relation", action="append", dest="relations", help="only these relations (repeatable)")
    kp.add_argument("--as-of", type=int, help="links valid at this instant, unix ms (default now)")
    kp.add_argument("--json", action="store_true")
    kp.set_defaults(handler=_paths)
    kt = kgsub.add_parser("timeline", help="the links touching a memory over time")
    kt.add_argument("memory_id", help="the memory whose links to show")
    kt.add_argument("--limit", type=int, help="most links, 1..kg.max_timeline (default all up to it)")
    kt.add_argument("--json", action="store_true")
    kt.set_defaults(handler=_timeline)
    ki = kgsub.add_parser("invalidate", help="end a link's validity with a signed invalidation (replicated)")
    ki.add_argument("link_id", help="the link to end")
    ki.add_argument("--valid-until", type=int, help="end of validity, unix ms (default now)")
    ki.add_argument("--json", action="store_true")
    ki.set_defaults(handler=_invalidate)


def _query(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        r = await svc.kg.query(args.memory_id, depth=args.depth, relations=args.relations, as_of=args.as_of,
                               limit=args.limit)

        def human(r: dict[str, Any]) -> str:
            lines = [f"{n['depth']}  {n['memory_id']}  via {' > '.join(v['relation'] for v in n['via'])}"
                     for n in r["neighbours"]]
            lines.append(f"{r['count']} neighbour(s) within {r['depth']} hop(s)"
                         + (f" (truncated at {r['limit']})" if r["truncated"] else ""))
            return "\n".join(lines)

        emit(args, r, human)
        return EXIT_OK
    return with_service(go, cfg)


def _paths(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        r = await svc.kg.find_paths(args.src_id, args.dst_id, max_depth=args.max_depth, limit=args.limit,
                                    relations=args.relations, as_of=args.as_of)

        def human(r: dict[str, Any]) -> str:
            lines = [f"{p['length']}  {' '.join(p['links'])}" for p in r["paths"]]
            lines.append(f"{r['count']} path(s)" + (" (truncated)" if r["truncated"] else ""))
            return "\n".join(lines)

        emit(args, r, human)
        return EXIT_OK
    return with_service(go, cfg)


def _timeline(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        r = await svc.kg.timeline(args.memory_id, limit=args.limit)

        def human(r: dict[str, Any]) -> str:
            lines = [f"{e['at']}  {e['event']:<11} {e['link_id']}" for e in r["events"]]
            return "\n".join(lines) or "no links"

        emit(args, r, human)
        return EXIT_OK
    return with_service(go, cfg)


def _invalidate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        r = await svc.kg.invalidate(args.link_id, valid_until=args.valid_until)
        emit(args, r, lambda r: f"{r['inval_id']}  ends {r['link_id']} at {r['valid_until']} ({r['attest_level']})")
        return EXIT_OK
    return with_service(go, cfg)
