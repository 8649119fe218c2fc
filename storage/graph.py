"""The knowledge graph over memory_links, as recursive CTEs, and the link_invalidations table.

Every statement here runs unchanged on SQLite and on Postgres (``?`` placeholders, ``||``, ``LIKE``,
``UNION`` in a recursive CTE, which both engines de-duplicate against all rows so far), so the
walks are bounded by (memories x depth) rows whatever cycles the graph holds.

A link is an edge at time ``as_of`` (unix ms) when ``valid_from <= as_of``, its own ``valid_until``
is null or later, and no stored invalidation ends it at or before ``as_of``. Edges are directed
(``src_id -> dst_id``). Sync functions taking ``conn`` first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from storage.errors import StorageCode, StorageError
from storage.sqlconn import Conn

# Bound on host parameters per statement (SQLite's default cap is 32766).
_CHUNK = 500


class Edge(NamedTuple):
    link_id: str
    src_id: str
    dst_id: str
    relation: str


@dataclass(frozen=True, kw_only=True, slots=True)
class InvalidationRow:
    inval_id: str                    # hex sha256 of the canonical CBOR invalidation payload
    link_id: str                     # the link whose validity it ends
    observed_by: str
    valid_until: int                 # unix ms: the link is not valid at or after this instant
    signature: bytes | None = None
    attest_level: str                # unsigned | self_signed | peer_attested
    signed_by: str | None = None
    received_from: str | None = None
    created_at: int                  # unix ms


_INV_COLUMNS = ("inval_id, link_id, observed_by, valid_until, signature, attest_level, signed_by, "
                "received_from, created_at")


def _valid(alias: str, relations: Sequence[str] | None, as_of: int) -> tuple[str, list[Any]]:
    """The WHERE fragment (and its parameters) that keeps the links of ``alias`` valid at ``as_of``."""
    sql = (f"{alias}.valid_from <= ? AND ({alias}.valid_until IS NULL OR {alias}.valid_until > ?) "
           f"AND NOT EXISTS (SELECT 1 FROM link_invalidations AS i WHERE i.link_id = {alias}.link_id "
           "AND i.valid_until <= ?)")
    params: list[Any] = [as_of, as_of, as_of]
    if relations:
        sql += f" AND {alias}.relation IN ({','.join('?' * len(relations))})"
        params.extend(relations)
    return sql, params


def reach(conn: Conn, start: str, depth: int, relations: Sequence[str] | None, as_of: int,
          limit: int) -> list[tuple[str, int]]:
    """Memories reachable from ``start`` in 1..``depth`` hops, each with its hop distance, nearest first
    (ties by id); at most ``limit`` rows. Every ancestor of a returned row on a shortest path is returned
    too, because it is nearer."""
    valid, vparams = _valid("e", relations, as_of)
    sql = ("WITH RECURSIVE walk(node, depth) AS (SELECT CAST(? AS TEXT), 0 UNION "
           "SELECT e.dst_id, w.depth + 1 FROM walk AS w JOIN memory_links AS e ON e.src_id = w.node "
           f"WHERE w.depth < ? AND {valid}), "
           "dist AS (SELECT node, min(depth) AS d FROM walk GROUP BY node) "
           "SELECT node, d FROM dist WHERE d > 0 ORDER BY d, node LIMIT ?")
    rows = conn.execute(sql, [start, depth, *vparams, limit]).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def edges_into(conn: Conn, dst_ids: Iterable[str], relations: Sequence[str] | None, as_of: int) -> list[Edge]:
    """Links valid at ``as_of`` whose destination is one of ``dst_ids``."""
    valid, vparams = _valid("e", relations, as_of)
    ids = list(dict.fromkeys(dst_ids))
    out: list[Edge] = []
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i:i + _CHUNK]
        rows = conn.execute(f"SELECT e.link_id, e.src_id, e.dst_id, e.relation FROM memory_links AS e "
                            f"WHERE e.dst_id IN ({','.join('?' * len(chunk))}) AND {valid}", [*chunk, *vparams])
        out.extend(Edge(*r) for r in rows)
    return out


def paths(conn: Conn, src: str, dst: str, max_depth: int, relations: Sequence[str] | None, as_of: int,
          cap: int) -> list[list[str]]:
    """Simple paths (no memory twice) from ``src`` to ``dst`` of 1..``max_depth`` links, as lists of
    link ids, shortest first; at most ``cap`` of them (the caller sorts and reports truncation).

    The forward walk only steps onto memories from which ``dst`` is still reachable in the hops left
    (a backward walk from ``dst`` gives those distances), so it never enumerates dead ends.
    """
    valid, vparams = _valid("e", relations, as_of)
    sql = ("WITH RECURSIVE back(node, depth) AS (SELECT CAST(? AS TEXT), 0 UNION "
           "SELECT e.src_id, b.depth + 1 FROM back AS b JOIN memory_links AS e ON e.dst_id = b.node "
           f"WHERE b.depth < ? AND {valid}), "
           "togo AS (SELECT node, min(depth) AS d FROM back GROUP BY node), "
           "fwd(node, depth, nodes, links) AS ("
           "SELECT CAST(? AS TEXT), 0, ',' || CAST(? AS TEXT) || ',', CAST('' AS TEXT) UNION ALL "
           "SELECT e.dst_id, f.depth + 1, f.nodes || e.dst_id || ',', f.links || e.link_id || ',' "
           "FROM fwd AS f JOIN memory_links AS e ON e.src_id = f.node JOIN togo AS t ON t.node = e.dst_id "
           f"WHERE f.node <> ? AND f.depth + 1 + t.d <= ? AND f.nodes NOT LIKE '%,' || e.dst_id || ',%' AND {valid}) "
           "SELECT links FROM fwd WHERE node = ? AND depth > 0 ORDER BY depth LIMIT ?")
    params = [dst, max_depth, *vparams, src, src, dst, max_depth, *vparams, dst, cap]
    return [str(r[0]).rstrip(",").split(",") for r in conn.execute(sql, params)]


def links_of(conn: Conn, memory_id: str, limit: int) -> list[tuple[Any, ...]]:
    """Rows (link_id, src_id, dst_id, relation, observed_by, valid_from, valid_until, attest_level) of the
    links touching ``memory_id``, oldest first (ties by link_id); at most ``limit``."""
    sql = ("SELECT link_id, src_id, dst_id, relation, observed_by, valid_from, valid_until, attest_level "
           "FROM memory_links WHERE src_id = ? OR dst_id = ? ORDER BY valid_from, link_id LIMIT ?")
    return [tuple(r) for r in conn.execute(sql, [memory_id, memory_id, limit])]


# ---- invalidations ----------------------------------------------------------------------------

def _inv_row(r: Sequence[Any]) -> InvalidationRow:
    return InvalidationRow(inval_id=r[0], link_id=r[1], observed_by=r[2], valid_until=int(r[3]),
                           signature=None if r[4] is None else bytes(r[4]), attest_level=str(r[5]),
                           signed_by=r[6], received_from=r[7], created_at=int(r[8]))


def insert_invalidation(conn: Conn, row: InvalidationRow) -> None:
    """Store an invalidation; an existing inval_id raises StorageError('duplicate_invalidation')."""
    if get_invalidation(conn, row.inval_id) is not None:
        raise StorageError(StorageCode.DUPLICATE_INVALIDATION, f"invalidation {row.inval_id} is already stored")
    conn.execute(f"INSERT INTO link_invalidations ({_INV_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", (
        row.inval_id, row.link_id, row.observed_by, row.valid_until, row.signature, row.attest_level,
        row.signed_by, row.received_from, row.created_at))


def get_invalidation(conn: Conn, inval_id: str) -> InvalidationRow | None:
    r = conn.execute(f"SELECT {_INV_COLUMNS} FROM link_invalidations WHERE inval_id = ?", (inval_id,)).fetchone()
    return _inv_row(r) if r else None


def invalidations_of(conn: Conn, link_ids: Iterable[str]) -> list[InvalidationRow]:
    """Invalidations of the given links, earliest end first."""
    ids = list(dict.fromkeys(link_ids))
    out: list[InvalidationRow] = []
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i:i + _CHUNK]
        rows = conn.execute(f"SELECT {_INV_COLUMNS} FROM link_invalidations "
                            f"WHERE link_id IN ({','.join('?' * len(chunk))})", chunk)
        out.extend(_inv_row(r) for r in rows)
    return sorted(out, key=lambda v: (v.valid_until, v.inval_id))


def effective_end(conn: Conn, link_id: str) -> int | None:
    """When the link stops being valid (unix ms): the earliest of its own valid_until and its invalidations."""
    r = conn.execute("SELECT l.valid_until, (SELECT min(i.valid_until) FROM link_invalidations AS i "
                     "WHERE i.link_id = l.link_id) FROM memory_links AS l WHERE l.link_id = ?", (link_id,)).fetchone()
    if r is None:
        return None
    ends = [int(v) for v in r if v is not None]
    return min(ends) if ends else None
