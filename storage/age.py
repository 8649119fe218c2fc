"""The knowledge-graph walks as Cypher on Apache AGE, over a graph kept in step with memory_links.

The graph ``am_kg`` holds one ``Memory`` vertex per linked memory and one ``LINK`` edge per link, with
the edge properties the walks filter on: link_id, relation, valid_from and ``ends_at`` (the earliest of the
link's own valid_until and its invalidations; absent while open-ended). It is kept in step inside the
write transactions themselves: before each COMMIT the writer applies the change-log entries of kind
'link' (links and invalidations) past the graph's watermark (``am_kg_sync``), set-based, a few statements
per batch whatever its size, so the graph never shows a link the table does not, and a rolled-back batch
leaves both unchanged.

AGE creates no index on its label tables; ``setup`` adds, on every open (a graph made by an older build
gets them too): the vertex and edge graphids (``id``), the edges' ``start_id`` and ``end_id``, and the
vertex ``id`` property that Cypher's ``a.id = ...`` reads.

What AGE 1.6 can do, and so how each walk goes (docs/kg.md, "Backends", has the measured plans). AGE's
variable-length match (VLE, ``age_vle``) is a depth-first enumeration of trails (no edge twice) in C over an
in-memory copy of the whole graph that each backend builds on its first walk and again after any write to the
graph (~0.4-1 s at 100k links). A VLE filters each edge only by label and by equality with a property map, so
the validity window (a range) is tested on each trail's edges after the enumeration; trails that visit a
memory twice are dropped here: the answers are those of simple paths.

- ``paths`` is one Cypher MATCH, ``(a)-[x:LINK*1..N]->(b)`` with both ends bound through the vertex index.
  A ``WITH x SKIP 0`` fence keeps the window test on the trails that reach the destination (without it the
  planner pushes it into the function scan, onto every trail leaving the source).
- ``reach`` is one VLE too, ``age_vle`` called from SQL with no far end: the Cypher form joins the far end to
  every vertex of the graph (``age_match_vle_terminal_edge`` as a join filter, 42.7M calls for 2,137 trails
  at 100k links). Reading anything from a trail (its far end, each link's window) means materialising it
  as agtype (``age_materialize_vle_edges``, ``age_properties``), and that, not the walk, is its cost.
- ``edges_into`` (one hop into given memories) is the same SQL as the CTE backend's, by the indexed
  ``memory_links.dst_id``: a 1,000-memory ``UNWIND ... MATCH`` took 445 ms p50 at 100k links, the SQL 85 ms.

No value is ever placed in a VLE's property map: AGE caches each VLE's edge filter per parsed statement, so
a prepared ``[*1..5 {relation: $r}]`` would keep the first value it saw.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from storage import graph
from storage.graph import Edge

GRAPH = "am_kg"

# Where a role that is not a superuser loads AGE from: Postgres lets it LOAD only from $libdir/plugins/ (the
# server host links AGE's library there: docs/operations.md, "Apache AGE with the node's role").
PLUGIN_LIBRARY = "$libdir/plugins/age"


def prepare_session(raw: Any) -> None:
    """Every connection that runs Cypher loads AGE (a superuser from anywhere, any other role from
    ``PLUGIN_LIBRARY``) and can name its types; our own tables stay in the schema they were created in (AGE's
    catalog comes last, so nothing of ours lands in it). The JIT is off: AGE's estimates for a cypher() call are
    huge, so Postgres would compile every walk (~0.2 s) for nothing."""
    superuser = raw.execute("SELECT current_setting('is_superuser')").fetchone()[0] == "on"
    raw.execute("LOAD 'age'" if superuser else f"LOAD '{PLUGIN_LIBRARY}'")
    raw.execute('SET search_path = "$user", public, ag_catalog')
    raw.execute("SET jit = off")


def access_problem(raw: Any) -> str | None:
    """Why this connection's role cannot keep the graph and walk it with AGE, or None when it can: it must use
    ``ag_catalog``, load the library, and either own the graph's tables or be able to make the graph (a
    superuser, or a role that may create schemas in the database). Leaves the session prepared when None."""
    if not raw.execute("SELECT has_schema_privilege('ag_catalog', 'USAGE')").fetchone()[0]:
        return "the role has no USAGE on schema ag_catalog (GRANT USAGE ON SCHEMA ag_catalog TO <role>)"
    if not raw.execute("SELECT has_table_privilege('ag_catalog.ag_graph', 'SELECT') "
                       "AND has_table_privilege('ag_catalog.ag_label', 'SELECT')").fetchone()[0]:
        return ("the role may not read AGE's catalog "
                "(GRANT SELECT ON ag_catalog.ag_graph, ag_catalog.ag_label TO <role>)")
    try:
        prepare_session(raw)
    except psycopg.Error as e:
        return f"AGE's library does not load for this role: {(e.diag.message_primary or str(e)).strip()}"
    graph = raw.execute("SELECT namespace::regnamespace::text FROM ag_catalog.ag_graph WHERE name = %s",
                        (GRAPH,)).fetchone()
    if graph is None:
        if raw.execute("SELECT current_setting('is_superuser') = 'on' "
                       "OR has_database_privilege(current_database(), 'CREATE')").fetchone()[0]:
            return None
        return f"the graph {GRAPH} does not exist and the role may not create it (a superuser makes it)"
    foreign = raw.execute(
        "SELECT string_agg(c.relname, ', ' ORDER BY c.relname) FROM pg_class AS c "
        "WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('r', 'S') AND NOT pg_has_role(c.relowner, 'USAGE')",
        (graph[0],)).fetchone()[0]
    if foreign:
        return f"the graph {GRAPH}'s tables belong to another role ({foreign}): ALTER ... OWNER TO the node's role"
    return None


_SETUP = (
    "CREATE TABLE IF NOT EXISTS am_kg_sync (last_seq BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS am_kg_vertex (memory_id TEXT PRIMARY KEY, gid ag_catalog.graphid NOT NULL)",
    "CREATE TABLE IF NOT EXISTS am_kg_edge (link_id TEXT PRIMARY KEY, gid ag_catalog.graphid NOT NULL)",
)

# The indexes AGE does not make (name, statement); each is built once, on the open that first misses it.
INDEXES = (
    ("am_kg_memory_gid", f'CREATE UNIQUE INDEX IF NOT EXISTS am_kg_memory_gid ON {GRAPH}."Memory" (id)'),
    ("am_kg_link_gid", f'CREATE UNIQUE INDEX IF NOT EXISTS am_kg_link_gid ON {GRAPH}."LINK" (id)'),
    ("am_kg_link_start", f'CREATE INDEX IF NOT EXISTS am_kg_link_start ON {GRAPH}."LINK" (start_id)'),
    ("am_kg_link_end", f'CREATE INDEX IF NOT EXISTS am_kg_link_end ON {GRAPH}."LINK" (end_id)'),
    ("am_kg_memory_id", f'CREATE INDEX IF NOT EXISTS am_kg_memory_id ON {GRAPH}."Memory" '
                        "(ag_catalog.agtype_access_operator(VARIADIC ARRAY[properties, '\"id\"'::agtype]))"),
)


def setup(conn: Any) -> None:
    """Create the graph, its labels, indexes and bookkeeping when missing, then catch it up (one transaction)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("SELECT 1 FROM ag_catalog.ag_graph WHERE name = ?", (GRAPH,)).fetchone() is None:
            conn.execute("SELECT ag_catalog.create_graph(?)", (GRAPH,))
            conn.execute("SELECT ag_catalog.create_vlabel(?, 'Memory')", (GRAPH,))
            conn.execute("SELECT ag_catalog.create_elabel(?, 'LINK')", (GRAPH,))
        for _name, sql in INDEXES:
            conn.execute(sql)
        for sql in _SETUP:
            conn.execute(sql)
        sync(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


# ---- keeping the graph in step (set-based: a few statements per batch) -------------------------

# The batch's links not yet in the graph (the change-log window is the two parameters: after, up to).
_NEW_LINKS = ("SELECT DISTINCT l.link_id, l.src_id, l.dst_id, l.relation, l.valid_from, l.valid_until "
              "FROM change_log AS c JOIN memory_links AS l ON l.link_id = c.ref_id "
              "WHERE c.kind = 'link' AND c.seq > ? AND c.seq <= ? "
              "AND NOT EXISTS (SELECT 1 FROM am_kg_edge AS k WHERE k.link_id = l.link_id)")

# A graphid made as AGE's own column default makes it, so each row's id is known before it is inserted.
_GRAPHID = "ag_catalog._graphid(ag_catalog._label_id('{g}', '{label}')::integer, nextval('{g}.\"{label}_id_seq\"'))"

_ADD_VERTICES = (
    f"WITH n AS ({_NEW_LINKS}), "
    "ids AS (SELECT DISTINCT s.m FROM (SELECT src_id AS m FROM n UNION SELECT dst_id FROM n) AS s "
    "WHERE NOT EXISTS (SELECT 1 FROM am_kg_vertex AS v WHERE v.memory_id = s.m)), "
    f"v AS (SELECT m, {_GRAPHID.format(g=GRAPH, label='Memory')} AS gid FROM ids), "
    f'g AS (INSERT INTO {GRAPH}."Memory" (id, properties) '
    "SELECT gid, json_build_object('id', m)::text::ag_catalog.agtype FROM v) "
    "INSERT INTO am_kg_vertex (memory_id, gid) SELECT m, gid FROM v")

# An edge's properties, from its link and the earliest invalidation ending it (LEAST skips nulls).
_EDGE_PROPS = ("json_strip_nulls(json_build_object('link_id', {l}.link_id, 'relation', {l}.relation, "
               "'valid_from', {l}.valid_from, 'ends_at', LEAST({l}.valid_until, {ends})))::text::ag_catalog.agtype")

_ADD_EDGES = (
    f"WITH n AS ({_NEW_LINKS}), "
    f"e AS (SELECT n.link_id, {_GRAPHID.format(g=GRAPH, label='LINK')} AS gid, s.gid AS sg, d.gid AS dg, "
    + _EDGE_PROPS.format(l="n", ends="(SELECT min(i.valid_until) FROM link_invalidations AS i "
                                     "WHERE i.link_id = n.link_id)")
    + " AS props FROM n JOIN am_kg_vertex AS s ON s.memory_id = n.src_id "
    "JOIN am_kg_vertex AS d ON d.memory_id = n.dst_id), "
    f'g AS (INSERT INTO {GRAPH}."LINK" (id, start_id, end_id, properties) SELECT gid, sg, dg, props FROM e) '
    "INSERT INTO am_kg_edge (link_id, gid) SELECT link_id, gid FROM e")

# Edges whose link got an invalidation in the window: their ends_at again, from all its invalidations.
_END_EDGES = (
    f'UPDATE {GRAPH}."LINK" AS g SET properties = '
    + _EDGE_PROPS.format(l="l", ends="m.ends")
    + " FROM (SELECT i.link_id, min(i.valid_until) AS ends FROM link_invalidations AS i "
    "WHERE i.link_id IN (SELECT j.link_id FROM change_log AS c JOIN link_invalidations AS j ON j.inval_id = c.ref_id "
    "WHERE c.kind = 'link' AND c.seq > ? AND c.seq <= ?) GROUP BY i.link_id) AS m "
    "JOIN memory_links AS l ON l.link_id = m.link_id JOIN am_kg_edge AS k ON k.link_id = l.link_id "
    "WHERE g.id = k.gid")


def sync(conn: Any) -> int:
    """Apply to the graph every 'link' change-log entry past the watermark (links become edges, their ends
    vertices; invalidations set ``ends_at``); returns how many entries. Runs inside the caller's write
    transaction."""
    r = conn.execute("SELECT last_seq FROM am_kg_sync").fetchone()
    last = int(r[0]) if r else 0
    top = conn.execute("SELECT max(seq), count(*) FROM change_log WHERE kind = 'link' AND seq > ?",
                       (last,)).fetchone()
    if top is None or top[0] is None:
        return 0
    upto = int(top[0])
    for sql in (_ADD_VERTICES, _ADD_EDGES, _END_EDGES):
        conn.execute(sql, (last, upto))
    if r is None:
        conn.execute("INSERT INTO am_kg_sync (last_seq) VALUES (?)", (upto,))
    else:
        conn.execute("UPDATE am_kg_sync SET last_seq = ?", (upto,))
    return int(top[1])


# ---- walks ----------------------------------------------------------------------------------

def _cypher(conn: Any, query: str, params: dict[str, Any]) -> list[Any]:
    rows = conn.execute(f"SELECT * FROM ag_catalog.cypher('{GRAPH}', $$ {query} $$, ?) AS (r agtype)",
                        (json.dumps(params),)).fetchall()
    return [json.loads(str(row[0])) for row in rows]


# The VLE edge prototype: any LINK edge (the window cannot be a VLE filter: it only tests property equality).
_PROTO = ''''{"id": 0, "label": "LINK", "end_id": 0, "start_id": 0, "properties": {}}::edge'::ag_catalog.agtype'''

# Every trail (no link twice) of 1..depth links leaving the start, as AGE's VLE finds it, called from SQL: the
# Cypher form joins the trail's far end to every vertex of the graph (age_match_vle_terminal_edge as a join
# filter, 42.7M calls for 2,137 trails at 100k links), and this form needs no far end. A trail counts when
# each of its links is valid at the instant (and of the relations); a memory's distance is its shortest one.
_REACH = (
    "WITH t AS MATERIALIZED (SELECT ag_catalog.age_materialize_vle_edges(v.edges) AS es "
    "FROM am_kg_vertex AS s, ag_catalog.age_vle('\"am_kg\"'::ag_catalog.agtype, "
    "ag_catalog.graphid_to_agtype(s.gid), NULL::ag_catalog.agtype, " + _PROTO + ", '1'::ag_catalog.agtype, "
    "?::text::ag_catalog.agtype, '1'::ag_catalog.agtype) AS v WHERE s.memory_id = ?), "
    "ok AS (SELECT ag_catalog.age_end_id(t.es -> -1)::text::bigint AS e, "
    "ag_catalog.age_size(t.es)::text::integer AS d FROM t "
    "WHERE NOT EXISTS (SELECT 1 FROM ag_catalog.age_unnest(t.es) AS x, "
    "LATERAL (SELECT ag_catalog.age_properties(x) AS p) AS q "
    "WHERE (q.p ->> 'valid_from'::text)::bigint > ? "
    "OR coalesce((q.p ->> 'ends_at'::text)::bigint > ?, true) IS NOT TRUE{rel})) "
    "SELECT m.memory_id, min(ok.d) AS d FROM ok JOIN am_kg_vertex AS m ON m.gid = ok.e::text::ag_catalog.graphid "
    "WHERE m.memory_id <> ? GROUP BY m.memory_id ORDER BY d, m.memory_id LIMIT ?")
_REACH_REL = " OR NOT (q.p ->> 'relation'::text) = ANY(?)"


def _trails_query(max_depth: int, relations: Sequence[str] | None) -> str:
    """One VLE from $src to $dst; each trail kept when all its edges are valid at $t (and of $rels)."""
    depth = int(max_depth)  # an int by contract; never text spliced into the query
    rel = " OR NOT properties(e).relation IN $rels" if relations else ""
    return (f"MATCH (a:Memory)-[x:LINK*1..{depth}]->(b:Memory) WHERE a.id = $src AND b.id = $dst "
            "WITH x SKIP 0 "
            "WITH x WHERE size([e IN x WHERE properties(e).valid_from > $t "
            f"OR properties(e).ends_at <= $t{rel}]) = 0 "
            "RETURN [e IN x | [properties(e).link_id, start_id(e), end_id(e)]]")


class AgeOps:
    """storage.kg_ops.GraphOps on Apache AGE (the connection must have run ``prepare_session``)."""

    def reach(self, conn: Any, start: str, depth: int, relations: Sequence[str] | None, as_of: int,
              limit: int) -> list[tuple[str, int]]:
        sql = _REACH.replace("{rel}", _REACH_REL if relations else "")
        params: list[Any] = [str(int(depth)), start, as_of, as_of]
        if relations:
            params.append(list(relations))
        rows = conn.execute(sql, [*params, start, limit]).fetchall()  # a trail back to the start is no hit
        return [(str(r[0]), int(r[1])) for r in rows]

    def edges_into(self, conn: Any, dst_ids: Iterable[str], relations: Sequence[str] | None,
                   as_of: int) -> list[Edge]:
        """One hop, by the indexed memory_links.dst_id: the table answers a single hop faster than any Cypher
        (a 1,000-memory UNWIND MATCH took 445 ms p50 at 100k links, this 85 ms)."""
        return graph.edges_into(conn, dst_ids, relations, as_of)

    def paths(self, conn: Any, src: str, dst: str, max_depth: int, relations: Sequence[str] | None, as_of: int,
              cap: int) -> list[list[str]]:
        params: dict[str, Any] = {"src": src, "dst": dst, "t": as_of}
        if relations:
            params["rels"] = list(relations)
        found: list[list[str]] = []
        for hops in _cypher(conn, _trails_query(max_depth, relations), params):
            nodes = [hops[0][1], *(h[2] for h in hops)]
            if len(set(nodes)) == len(nodes):  # a trail through no memory twice: a simple path
                found.append([str(h[0]) for h in hops])
        return sorted(found, key=len)[:cap]
