"""Knowledge-graph operations over the links: neighbours, paths, timelines and signed invalidation.

The walks run in storage (recursive CTEs, or Cypher on Apache AGE: ``storage.kg_ops``); this module
validates input, picks each neighbour's path deterministically (fewest hops, then the smallest link
ids, hop by hop) so every backend answers alike, and signs invalidations.

An invalidation never edits a link (links are signed and immutable): it is a record of its own,
canonical CBOR ``{type: "link.invalidate", link_id, observed_by, valid_until}`` signed with Ed25519,
id = hex SHA-256 of those bytes, appended to signed_events and replicated as ``link.invalidate``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from node import attest
from node.attest import InvalidationPayload
from node.errors import ServiceError
from node.permissions.approvals import APPROVED
from node.permissions.rules import Mode, Operation
from node.writepath import Queued, WritePath
from storage import changelog, events, graph, kg_ops, links, memories
from storage.graph import Edge, InvalidationRow
from storage.memories import MemoryRow

log = logging.getLogger("node.kg")


def shortest_paths(start: str, dist: dict[str, int], edges: Sequence[Edge]) -> dict[str, list[Edge]]:
    """For every memory in ``dist`` (hop distance from ``start``), the path that reached it: each hop is
    the smallest link id among links from a memory one hop nearer. Pure; ``edges`` are links into them."""
    dist = {**dist, start: 0}
    parent: dict[str, Edge] = {}
    for e in sorted(edges, key=lambda e: e.link_id):
        d = dist.get(e.dst_id)
        if d is None or d == 0 or e.dst_id in parent:
            continue
        if dist.get(e.src_id) == d - 1:
            parent[e.dst_id] = e
    out: dict[str, list[Edge]] = {}
    for node in sorted(dist, key=lambda n: dist[n]):
        if node == start:
            continue
        hop = parent.get(node)
        if hop is None:
            continue  # unreachable in a consistent snapshot; skipped rather than guessed
        out[node] = [*out.get(hop.src_id, []), hop]
    return out


def invalidation_wire(row: InvalidationRow) -> dict[str, Any]:
    """The link.invalidate body: the signed fields, the raw 64-byte signature and the signer."""
    return {"invalidation": {"link_id": row.link_id, "observed_by": row.observed_by, "valid_until": row.valid_until},
            "signature": row.signature, "signed_by": row.signed_by}


def invalidation_dict(row: InvalidationRow) -> dict[str, Any]:
    return {"inval_id": row.inval_id, "link_id": row.link_id, "observed_by": row.observed_by,
            "valid_until": row.valid_until, "attest_level": row.attest_level, "signed_by": row.signed_by,
            "signature": row.signature.hex() if row.signature else None, "received_from": row.received_from,
            "created_at": row.created_at}


class KnowledgeGraph:
    """The KG operations of one store (``svc.kg``): reads gated as memory_get, invalidations written through
    ``writes`` as any local write; ``clock`` gives now in unix ms."""

    def __init__(self, writes: WritePath, clock: Callable[[], int]) -> None:
        self.writes = writes
        self.db = writes.db
        self.clock = clock
        self.cfg = writes.cfg.kg

    @property
    def backend(self) -> str:
        """sqlite-cte | postgres-cte | postgres-age."""
        return str(getattr(self.db, "kg_backend", "sqlite-cte"))

    # ---- validation -----------------------------------------------------------------------

    def _depth(self, name: str, depth: Any) -> int:
        top = self.cfg.max_depth
        if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= top:
            raise ServiceError("bad_input", f"{name} must be an integer 1..{top}, got {depth!r}")
        return depth

    def _relations(self, relations: Any) -> list[str] | None:
        if relations is None:
            return None
        if isinstance(relations, str) or not isinstance(relations, Sequence):
            raise ServiceError("bad_input", f"relations must be a list of strings, got {relations!r}")
        if len(relations) > self.cfg.max_relations:
            raise ServiceError("too_large", f"{len(relations)} relations, the limit is {self.cfg.max_relations}")
        for r in relations:
            if not isinstance(r, str) or not r.strip() or len(r) > self.writes.cfg.limits.max_relation_chars:
                raise ServiceError("bad_input", f"relations must be non-empty strings of at most "
                                                f"{self.writes.cfg.limits.max_relation_chars} chars, got {r!r}")
        return sorted(set(relations)) or None

    def _as_of(self, as_of: Any) -> int:
        if as_of is None:
            return self.clock()
        if not isinstance(as_of, int) or isinstance(as_of, bool) or not 0 <= as_of < 2**63:
            raise ServiceError("bad_input", f"as_of must be an integer unix ms >= 0, got {as_of!r}")
        return as_of

    def _limit(self, limit: Any, top: int) -> int:
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= top:
            raise ServiceError("bad_input", f"limit must be an integer 1..{top}, got {limit!r}")
        return limit

    async def _known(self, **named: str) -> None:
        """Each id names a stored memory this node's agent may read (memory_get's rule), else raise."""
        for name, value in named.items():
            self.writes.check_id(name, value)
        ids = set(named.values())
        found = await self.db.read(memories.get_many, ids)
        missing = sorted(ids - set(found))
        if missing:
            raise ServiceError("unknown_memory", f"no memory with id {', '.join(map(repr, missing))}")
        for ns in sorted({m.namespace for m in found.values()}):
            await self.writes.permit(ns, Operation.GET)

    def _gated(self) -> bool:
        gate = self.writes.gate
        return gate is not None and gate.mode is not Mode.OFF

    async def _hidden(self, ids: set[str]) -> set[str]:
        """Those of ``ids`` in namespaces the gate does not let this node's agent read (``get``): the walks
        leave them out, and what is reached through them, as memory_recall leaves out their hits."""
        if not ids or not self._gated():
            return set()
        found = await self.db.read(memories.get_many, ids)
        readable = await self.writes.readable({m.namespace for m in found.values()}, Operation.GET)
        return {i for i, m in found.items() if m.namespace not in readable}

    # ---- queries --------------------------------------------------------------------------

    async def query(self, memory_id: str, *, depth: int = 2, relations: Sequence[str] | None = None,
                    as_of: int | None = None, limit: int | None = None) -> dict[str, Any]:
        """Memories reachable from ``memory_id`` along links valid at ``as_of`` (unix ms, default now),
        1..``depth`` hops, nearest first, each with the path (link ids) that reached it."""
        depth = self._depth("depth", depth)
        rels = self._relations(relations)
        t = self._as_of(as_of)
        top = self.cfg.max_results
        limit = top if limit is None else self._limit(limit, top)
        await self._known(memory_id=memory_id)
        ops = kg_ops.for_backend(self.backend)

        def read(conn: Any) -> tuple[list[tuple[str, int]], list[Edge]]:
            hits = ops.reach(conn, memory_id, depth, rels, t, limit + 1)
            kept = hits[:limit]
            return hits, ops.edges_into(conn, [n for n, _ in kept], rels, t) if kept else []

        hits, edges = await self.db.read(read)
        kept = hits[:limit]
        found = shortest_paths(memory_id, dict(kept), edges)
        hidden = await self._hidden({n for n, _ in kept})
        found = {n: p for n, p in found.items() if not any(e.dst_id in hidden for e in p)}
        neighbours = [{"memory_id": n, "depth": d, "path": [e.link_id for e in found[n]],
                       "via": [{"link_id": e.link_id, "src_id": e.src_id, "dst_id": e.dst_id,
                                "relation": e.relation} for e in found[n]]}
                      for n, d in kept if n in found]
        return {"memory_id": memory_id, "depth": depth, "as_of": t, "relations": rels,
                "neighbours": neighbours, "count": len(neighbours), "truncated": len(hits) > limit,
                "limit": limit, "kg_backend": self.backend}

    async def find_paths(self, src_id: str, dst_id: str, *, max_depth: int = 3, limit: int = 10,
                         relations: Sequence[str] | None = None, as_of: int | None = None) -> dict[str, Any]:
        """Simple paths (no memory twice) from ``src_id`` to ``dst_id`` along links valid at ``as_of``,
        1..``max_depth`` links, shortest first (ties by link ids); at most ``limit``."""
        max_depth = self._depth("max_depth", max_depth)
        limit = self._limit(limit, self.cfg.max_paths)
        rels = self._relations(relations)
        t = self._as_of(as_of)
        await self._known(src_id=src_id, dst_id=dst_id)
        if src_id == dst_id:
            raise ServiceError("bad_input", "src_id and dst_id are the same memory; a path needs two")
        ops = kg_ops.for_backend(self.backend)
        cap = self.cfg.path_scan_cap
        found = await self.db.read(ops.paths, src_id, dst_id, max_depth, rels, t, cap + 1)
        scan_truncated = len(found) > cap
        ranked = sorted((tuple(p) for p in found[:cap]), key=lambda p: (len(p), p))
        if self._gated():
            ranked = await self._readable_paths(ranked)
        out = [list(p) for p in ranked[:limit]]
        return {"src_id": src_id, "dst_id": dst_id, "max_depth": max_depth, "as_of": t, "relations": rels,
                "paths": [{"length": len(p), "links": p} for p in out], "count": len(out),
                "truncated": scan_truncated or len(ranked) > limit, "limit": limit, "kg_backend": self.backend}

    async def _readable_paths(self, ranked: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """``ranked`` without the paths through a memory this node's agent may not read."""
        link_ids = {lid for p in ranked for lid in p}

        def ends(conn: Any) -> dict[str, tuple[str, str]]:
            rows = (links.get(conn, lid) for lid in link_ids)
            return {r.link_id: (r.src_id, r.dst_id) for r in rows if r is not None}

        by_link = await self.db.read(ends)
        hidden = await self._hidden({m for pair in by_link.values() for m in pair})
        return [p for p in ranked if all(lid in by_link and not hidden.intersection(by_link[lid]) for lid in p)]

    async def timeline(self, memory_id: str, *, limit: int | None = None) -> dict[str, Any]:
        """The links touching ``memory_id`` over time: when each began, ended, and who invalidated it."""
        top = self.cfg.max_timeline
        limit = top if limit is None else self._limit(limit, top)
        await self._known(memory_id=memory_id)

        def read(conn: Any) -> tuple[list[tuple[Any, ...]], list[InvalidationRow]]:
            rows = graph.links_of(conn, memory_id, limit + 1)
            return rows, graph.invalidations_of(conn, [r[0] for r in rows[:limit]])

        rows, invs = await self.db.read(read)
        hidden = await self._hidden({end for r in rows[:limit] for end in (r[1], r[2])})
        truncated = len(rows) > limit
        rows = [r for r in rows[:limit] if r[1] not in hidden and r[2] not in hidden]
        by_link: dict[str, list[InvalidationRow]] = {}
        for v in invs:
            by_link.setdefault(v.link_id, []).append(v)
        items, evs = [], []
        for link_id, src, dst, relation, observed_by, valid_from, valid_until, level in rows:
            ends = [v.valid_until for v in by_link.get(link_id, [])] + ([valid_until] if valid_until else [])
            items.append({"link_id": link_id, "src_id": src, "dst_id": dst, "relation": relation,
                          "direction": "out" if src == memory_id else "in", "observed_by": observed_by,
                          "attest_level": level, "valid_from": valid_from, "valid_until": valid_until,
                          "ended_at": min(ends) if ends else None,
                          "invalidations": [invalidation_dict(v) for v in by_link.get(link_id, [])]})
            evs.append({"at": valid_from, "event": "valid_from", "link_id": link_id})
            if valid_until is not None:
                evs.append({"at": valid_until, "event": "valid_until", "link_id": link_id})
            evs.extend({"at": v.valid_until, "event": "invalidated", "link_id": link_id, "inval_id": v.inval_id,
                        "by": v.observed_by} for v in by_link.get(link_id, []))
        evs.sort(key=lambda e: (e["at"], e["link_id"], e["event"]))
        return {"memory_id": memory_id, "links": items, "events": evs, "count": len(items),
                "truncated": truncated, "limit": limit}

    # ---- invalidation ---------------------------------------------------------------------

    async def invalidate(self, link_id: str, *, valid_until: int | None = None) -> dict[str, Any]:
        """End a link's validity at ``valid_until`` (unix ms, default now) with a new signed record."""
        w = self.writes
        w.check_id("link_id", link_id)
        ts = self.clock()
        end = ts if valid_until is None else valid_until
        link = await self.db.read(links.get, link_id)
        if link is None:
            raise ServiceError("unknown_link", f"no link with id {link_id!r}")
        try:
            payload = InvalidationPayload(link_id=link_id, observed_by=w.agent_id, valid_until=end)
        except attest.AttestError as e:
            raise ServiceError("bad_input", e.message) from None
        if end < link.valid_from:
            raise ServiceError("bad_input", f"valid_until {end} is before the link's valid_from {link.valid_from}")
        # Ending a link writes a link record into both of its ends' namespaces: gated as memory_link is.
        # The parked call carries the resolved end, so an approval later ends the link when it was asked to.
        call = {"method": "memory_kg_invalidate", "args": {"link_id": link_id, "valid_until": end}}
        ends = await self.db.read(memories.get_many, {link.src_id, link.dst_id})
        for ns in sorted({m.namespace for m in ends.values()}):
            await w.permit(ns, Operation.LINK, call)
        approved = APPROVED.get()
        signed = w.sign(payload)
        row = InvalidationRow(inval_id=payload.inval_id, link_id=link_id, observed_by=w.agent_id,
                              valid_until=end, signature=signed.signature, attest_level=signed.attest_level,
                              signed_by=signed.signed_by, created_at=ts)

        def write(conn: Any) -> tuple[list[MemoryRow], Queued]:
            ended = graph.effective_end(conn, link_id)
            if ended is not None and ended <= end:
                raise ServiceError("already_ended", f"link {link_id} already ends at {ended} ms, "
                                                    f"not after the requested {end} ms; nothing stored")
            w.claim(conn, approved, ts)
            graph.insert_invalidation(conn, row)
            events.append(conn, "link_invalidation", link_id, w.agent_id, row.inval_id, row.signature, ts)
            # The change log's 'link' kind carries link records: links and their invalidations.
            changelog.append(conn, "link", row.inval_id, 1, ts, row.observed_by)
            # An invalidation goes where its link went: to peers that may see both ends.
            scope = list(memories.get_many(conn, {link.src_id, link.dst_id}).values())
            return scope, w.replicate(conn, "link.invalidate", invalidation_wire(row), scope, ts)

        scope, queued = await self.db.write(write)
        return {**invalidation_dict(row), **await w.after_write(queued, scope)}
