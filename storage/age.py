"""The knowledge-graph walks as Cypher on Apache AGE, over a graph kept in step with memory_links.

The graph ``am_kg`` holds one ``Memory`` vertex per linked memory and one ``LINK`` edge per link, with
the edge properties the walks filter on: link_id, relation, valid_from and ``ends_at`` (the earliest of the
link's own valid_until and its invalidations; absent while open-ended). It is kept in step inside the
write transactions themselves: before each COMMIT the writer applies the change-log entries of kind
'link' (links and invalidations) past the graph's watermark (``am_kg_sync``), so the graph never shows a
link the table does not, and a rolled-back batch leaves both unchanged. Rows are loaded with plain SQL
into AGE's label tables (set-based and fast); the walks are Cypher.

Walks go one hop per Cypher query, frontier by frontier, with the same answers as storage/graph.py:
``reach`` is a breadth-first walk; ``paths`` first walks backwards from the destination for the hop
distances, then enumerates simple paths forwards through memories that can still reach it in time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from storage.graph import Edge

GRAPH = "am_kg"
# Most ids sent in one Cypher parameter list.
_CHUNK = 1000


def prepare_session(raw: Any) -> None:
    """Every connection that runs Cypher loads AGE and can name its types; our own tables stay in the
    schema they were created in (AGE's catalog comes last, so nothing of ours lands in it)."""
    raw.execute("LOAD 'age'")
    raw.execute('SET search_path = "$user", public, ag_catalog')


_SETUP = (
    "CREATE TABLE IF NOT EXISTS am_kg_sync (last_seq BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS am_kg_vertex (memory_id TEXT PRIMARY KEY, gid ag_catalog.graphid NOT NULL)",
    "CREATE TABLE IF NOT EXISTS am_kg_edge (link_id TEXT PRIMARY KEY, gid ag_catalog.graphid NOT NULL)",
)


def setup(conn: Any) -> None:
    """Create the graph, its labels, indexes and bookkeeping when missing, then catch it up (one transaction)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("SELECT 1 FROM ag_catalog.ag_graph WHERE name = ?", (GRAPH,)).fetchone() is None:
            conn.execute("SELECT ag_catalog.create_graph(?)", (GRAPH,))
            conn.execute("SELECT ag_catalog.create_vlabel(?, 'Memory')", (GRAPH,))
            conn.execute("SELECT ag_catalog.create_elabel(?, 'LINK')", (GRAPH,))
            conn.execute(f'CREATE INDEX IF NOT EXISTS am_kg_link_start ON {GRAPH}."LINK" (start_id)')
            conn.execute(f'CREATE INDEX IF NOT EXISTS am_kg_link_end ON {GRAPH}."LINK" (end_id)')
            conn.execute(f'CREATE INDEX IF NOT EXISTS am_kg_memory_id ON {GRAPH}."Memory" '
                         "(ag_catalog.agtype_access_operator(VARIADIC ARRAY[properties, '\"id\"'::agtype]))")
        for sql in _SETUP:
            conn.execute(sql)
        sync(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _vertex(conn: Any, memory_id: str, cache: dict[str, str]) -> str:
    gid = cache.get(memory_id)
    if gid is not None:
        return gid
    r = conn.execute("SELECT gid::text FROM am_kg_vertex WHERE memory_id = ?", (memory_id,)).fetchone()
    if r is None:
        r = conn.execute(f'INSERT INTO {GRAPH}."Memory" (properties) VALUES (?::agtype) RETURNING id::text',
                         (json.dumps({"id": memory_id}),)).fetchone()
        conn.execute("INSERT INTO am_kg_vertex (memory_id, gid) VALUES (?, ?::text::ag_catalog.graphid)",
                     (memory_id, r[0]))
    cache[memory_id] = str(r[0])
    return cache[memory_id]


def sync(conn: Any) -> int:
    """Apply to the graph every 'link' change-log entry past the watermark; returns how many. Runs inside
    the caller's write transaction."""
    r = conn.execute("SELECT last_seq FROM am_kg_sync").fetchone()
    last = int(r[0]) if r else 0
    rows = conn.execute(
        "SELECT c.seq, l.link_id, l.src_id, l.dst_id, l.relation, l.valid_from, l.valid_until, i.link_id "
        "FROM change_log AS c LEFT JOIN memory_links AS l ON l.link_id = c.ref_id "
        "LEFT JOIN link_invalidations AS i ON i.inval_id = c.ref_id "
        "WHERE c.kind = 'link' AND c.seq > ? ORDER BY c.seq", (last,)).fetchall()
    if not rows:
        return 0
    cache: dict[str, str] = {}
    touched: set[str] = set()
    for _seq, link_id, src, dst, relation, valid_from, valid_until, invalidated in rows:
        if link_id is not None:
            if conn.execute("SELECT 1 FROM am_kg_edge WHERE link_id = ?", (link_id,)).fetchone() is not None:
                continue
            props: dict[str, Any] = {"link_id": link_id, "relation": relation, "valid_from": int(valid_from)}
            if valid_until is not None:
                props["ends_at"] = int(valid_until)
            e = conn.execute(f'INSERT INTO {GRAPH}."LINK" (start_id, end_id, properties) VALUES '
                             "(?::text::ag_catalog.graphid, ?::text::ag_catalog.graphid, ?::agtype) RETURNING id::text",
                             (_vertex(conn, src, cache), _vertex(conn, dst, cache), json.dumps(props))).fetchone()
            conn.execute("INSERT INTO am_kg_edge (link_id, gid) VALUES (?, ?::text::ag_catalog.graphid)",
                         (link_id, e[0]))
            touched.add(link_id)
        elif invalidated is not None:
            touched.add(str(invalidated))
    for link_id in touched:
        _refresh_end(conn, link_id)
    if r is None:
        conn.execute("INSERT INTO am_kg_sync (last_seq) VALUES (?)", (int(rows[-1][0]),))
    else:
        conn.execute("UPDATE am_kg_sync SET last_seq = ?", (int(rows[-1][0]),))
    return len(rows)


def _refresh_end(conn: Any, link_id: str) -> None:
    """Set the edge's ``ends_at`` to the earliest of the link's valid_until and its invalidations."""
    r = conn.execute("SELECT l.valid_until, (SELECT min(i.valid_until) FROM link_invalidations AS i "
                     "WHERE i.link_id = l.link_id), l.relation, l.valid_from FROM memory_links AS l "
                     "WHERE l.link_id = ?", (link_id,)).fetchone()
    if r is None or (r[0] is None and r[1] is None):
        return
    end = min(int(v) for v in r[:2] if v is not None)
    props = {"link_id": link_id, "relation": r[2], "valid_from": int(r[3]), "ends_at": end}
    conn.execute(f'UPDATE {GRAPH}."LINK" SET properties = ?::agtype WHERE id = '
                 "(SELECT gid FROM am_kg_edge WHERE link_id = ?)", (json.dumps(props), link_id))


# ---- walks ----------------------------------------------------------------------------------

def _cypher(conn: Any, query: str, params: dict[str, Any]) -> list[Any]:
    rows = conn.execute(f"SELECT * FROM ag_catalog.cypher('{GRAPH}', $$ {query} $$, ?) AS (r agtype)",
                        (json.dumps(params),)).fetchall()
    return [json.loads(str(row[0])) for row in rows]


def _hop(conn: Any, ids: Sequence[str], forward: bool, relations: Sequence[str] | None, as_of: int) -> list[Edge]:
    """Links valid at ``as_of`` leaving (``forward``) or entering the memories ``ids``, one Cypher query a chunk."""
    near = "a" if forward else "b"
    rel = " AND x.relation IN $rels" if relations else ""
    query = (f"MATCH (a:Memory)-[x:LINK]->(b:Memory) WHERE {near}.id IN $ids AND x.valid_from <= $t "
             f"AND (x.ends_at IS NULL OR x.ends_at > $t){rel} RETURN [x.link_id, a.id, b.id, x.relation]")
    out: list[Edge] = []
    for i in range(0, len(ids), _CHUNK):
        params: dict[str, Any] = {"ids": list(ids[i:i + _CHUNK]), "t": as_of}
        if relations:
            params["rels"] = list(relations)
        out.extend(Edge(*r) for r in _cypher(conn, query, params))
    return out


def _distances(conn: Any, start: str, depth: int, forward: bool, relations: Sequence[str] | None,
               as_of: int) -> tuple[dict[str, int], dict[str, list[Edge]]]:
    """Breadth-first hop distances from ``start`` (forwards or backwards), and the edges seen per node."""
    dist = {start: 0}
    seen: dict[str, list[Edge]] = {}
    frontier = [start]
    for d in range(1, depth + 1):
        if not frontier:
            break
        nxt: list[str] = []
        for e in _hop(conn, frontier, forward, relations, as_of):
            near, far = (e.src_id, e.dst_id) if forward else (e.dst_id, e.src_id)
            seen.setdefault(near, []).append(e)
            if far not in dist:
                dist[far] = d
                nxt.append(far)
        frontier = nxt
    return dist, seen


class AgeOps:
    """storage.kg_ops.GraphOps on Apache AGE (the connection must have run ``prepare_session``)."""

    def reach(self, conn: Any, start: str, depth: int, relations: Sequence[str] | None, as_of: int,
              limit: int) -> list[tuple[str, int]]:
        dist, _ = _distances(conn, start, depth, True, relations, as_of)
        hits = sorted(((n, d) for n, d in dist.items() if d > 0), key=lambda nd: (nd[1], nd[0]))
        return hits[:limit]

    def edges_into(self, conn: Any, dst_ids: Iterable[str], relations: Sequence[str] | None,
                   as_of: int) -> list[Edge]:
        return _hop(conn, list(dict.fromkeys(dst_ids)), False, relations, as_of)

    def paths(self, conn: Any, src: str, dst: str, max_depth: int, relations: Sequence[str] | None, as_of: int,
              cap: int) -> list[list[str]]:
        togo, _ = _distances(conn, dst, max_depth, False, relations, as_of)
        if src not in togo:
            return []
        # Forward adjacency restricted to memories that can still reach dst, fetched a level at a time.
        out_edges: dict[str, list[Edge]] = {}
        frontier, fetched = [src], set()
        for _ in range(max_depth):
            todo = [n for n in frontier if n not in fetched and n != dst]
            if not todo:
                break
            fetched.update(todo)
            nxt: list[str] = []
            for e in _hop(conn, todo, True, relations, as_of):
                if e.dst_id in togo:
                    out_edges.setdefault(e.src_id, []).append(e)
                    nxt.append(e.dst_id)
            frontier = nxt
        found: list[list[str]] = []
        stack: list[tuple[str, list[str], frozenset[str]]] = [(src, [], frozenset({src}))]
        while stack and len(found) < cap:
            node, links, on_path = stack.pop()
            for e in out_edges.get(node, []):
                if e.dst_id in on_path or len(links) + 1 + togo[e.dst_id] > max_depth:
                    continue
                if e.dst_id == dst:
                    found.append([*links, e.link_id])
                else:
                    stack.append((e.dst_id, [*links, e.link_id], on_path | {e.dst_id}))
        return sorted(found, key=len)
