"""a2a_outbox and a2a_dead_letters: messages waiting for a peer's ACK, and those that gave up.

One row per (correlation_id, peer). The mesh sender reads ``due``/``pending_for_peer``, records
each attempt with ``mark_attempt``, deletes on ACK with ``remove``, and moves exhausted rows with
``to_dead_letter``. All times are unix ms.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from storage.errors import StorageCode, StorageError
from storage.rows import Row, inserted_id, scalar_int

# Ids per IN (...) statement: under SQLite's default bound of 999 variables.
_CHUNK = 500
_OUT = ("id, correlation_id, peer, kind, envelope, expires_at, attempts, next_attempt_at, last_error, "
        "created_at, replayed_from")
_DEAD = "id, correlation_id, peer, kind, envelope, expires_at, attempts, last_error, created_at, dead_at"
# The counter of dead-letter ids: the last id given (first set from the highest id in the table). Ids are never
# given twice: SQLite's rowid gives max(id) + 1 again once the newest dead letter is replayed or cleared, and
# `a2a dead-letters --replay ID` would then name another message.
_DEAD_ID_COUNTER = "dead_letter_id"


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxRow:
    id: int
    correlation_id: str
    peer: str
    kind: str
    envelope: bytes
    expires_at: int
    attempts: int
    next_attempt_at: int
    last_error: str | None
    created_at: int
    # The dead letter this row was replayed from (``a2a dead-letters --replay``); None for a message queued anew.
    replayed_from: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetterRow:
    id: int
    correlation_id: str
    peer: str
    kind: str
    envelope: bytes
    expires_at: int
    attempts: int
    last_error: str | None
    created_at: int
    dead_at: int


def _out(r: Row) -> OutboxRow:
    return OutboxRow(id=r[0], correlation_id=r[1], peer=r[2], kind=r[3], envelope=bytes(r[4]), expires_at=r[5],
                     attempts=r[6], next_attempt_at=r[7], last_error=r[8], created_at=r[9], replayed_from=r[10])


def _dead(r: Row) -> DeadLetterRow:
    return DeadLetterRow(id=r[0], correlation_id=r[1], peer=r[2], kind=r[3], envelope=bytes(r[4]),
                         expires_at=r[5], attempts=r[6], last_error=r[7], created_at=r[8], dead_at=r[9])


def enqueue(conn: sqlite3.Connection, correlation_id: str, peer: str, kind: str, envelope: bytes,
            expires_at: int, next_attempt_at: int, created_at: int) -> int:
    """Queue ``envelope`` for ``peer``; returns the outbox id. Re-queuing the same (correlation_id, peer)
    is a no-op returning the existing id (the first envelope is kept)."""
    conn.execute(f"INSERT INTO a2a_outbox ({_OUT}) VALUES (NULL,?,?,?,?,?,0,?,NULL,?,NULL) "
                 "ON CONFLICT (correlation_id, peer) DO NOTHING",
                 (correlation_id, peer, kind, envelope, expires_at, next_attempt_at, created_at))
    return scalar_int(conn, "SELECT id FROM a2a_outbox WHERE correlation_id = ? AND peer = ?", (correlation_id, peer))


def enqueue_row(conn: sqlite3.Connection, correlation_id: str, peer: str, kind: str, envelope: bytes,
                expires_at: int, next_attempt_at: int, created_at: int) -> OutboxRow | None:
    """As ``enqueue``, returning the queued row (what a fresh write hands the sender once committed);
    None when that (correlation_id, peer) was queued already (the first envelope is kept)."""
    cur = conn.execute(f"INSERT INTO a2a_outbox ({_OUT}) VALUES (NULL,?,?,?,?,?,0,?,NULL,?,NULL) "
                       "ON CONFLICT (correlation_id, peer) DO NOTHING",
                       (correlation_id, peer, kind, envelope, expires_at, next_attempt_at, created_at))
    if cur.rowcount != 1:
        return None
    return OutboxRow(id=inserted_id(cur), correlation_id=correlation_id, peer=peer, kind=kind, envelope=envelope,
                     expires_at=expires_at, attempts=0, next_attempt_at=next_attempt_at, last_error=None,
                     created_at=created_at)


def get(conn: sqlite3.Connection, id: int) -> OutboxRow | None:
    r = conn.execute(f"SELECT {_OUT} FROM a2a_outbox WHERE id = ?", (id,)).fetchone()
    return _out(r) if r else None


def due(conn: sqlite3.Connection, now_ms: int, limit: int = 100) -> list[OutboxRow]:
    """Rows whose next attempt is at or before ``now_ms``, soonest first (expired ones included:
    the sender decides to dead-letter them)."""
    rows = conn.execute(f"SELECT {_OUT} FROM a2a_outbox WHERE next_attempt_at <= ? "
                        "ORDER BY next_attempt_at, id LIMIT ?", (now_ms, limit))
    return [_out(r) for r in rows]


def due_for_peer(conn: sqlite3.Connection, peer: str, now_ms: int, limit: int = 100,
                 exclude: Sequence[int] = ()) -> list[OutboxRow]:
    """``peer``'s rows whose next attempt is at or before ``now_ms``, soonest first, leaving out the ids in
    ``exclude`` (the sender's rows in flight or handed to it in memory: without it each read re-reads,
    blobs and all, every row it already holds)."""
    marks = ",".join("?" * len(exclude))
    skip = f" AND id NOT IN ({marks})" if exclude else ""
    rows = conn.execute(f"SELECT {_OUT} FROM a2a_outbox WHERE peer = ? AND next_attempt_at <= ?{skip} "
                        "ORDER BY next_attempt_at, id LIMIT ?", (peer, now_ms, *exclude, limit))
    return [_out(r) for r in rows]


def peers_due(conn: sqlite3.Connection, now_ms: int, scan: int) -> frozenset[str] | None:
    """The peers holding a row whose next attempt is at or before ``now_ms``, read from at most ``scan`` such
    rows (through the due index); None when there are more (then any peer may hold one)."""
    rows = conn.execute("SELECT peer FROM a2a_outbox WHERE next_attempt_at <= ? LIMIT ?",
                        (now_ms, scan + 1)).fetchall()
    if len(rows) > scan:
        return None
    return frozenset(r[0] for r in rows)


def pending_for_peer(conn: sqlite3.Connection, peer: str, limit: int = 100) -> list[OutboxRow]:
    """Everything queued for ``peer``, oldest first (e.g. to flush on reconnect)."""
    rows = conn.execute(f"SELECT {_OUT} FROM a2a_outbox WHERE peer = ? ORDER BY id LIMIT ?", (peer, limit))
    return [_out(r) for r in rows]


def due_now(conn: sqlite3.Connection, peer: str, now_ms: int, error_prefix: str) -> int:
    """Make ``peer``'s rows waiting for a retry after a failure whose error starts with ``error_prefix`` due at
    ``now_ms`` (what they waited for is back: a link came up); returns how many."""
    return conn.execute("UPDATE a2a_outbox SET next_attempt_at = ? WHERE peer = ? AND next_attempt_at > ? "
                        "AND substr(last_error, 1, ?) = ?",
                        (now_ms, peer, now_ms, len(error_prefix), error_prefix)).rowcount


def mark_attempt(conn: sqlite3.Connection, id: int, attempts: int, next_attempt_at: int,
                 last_error: str | None) -> bool:
    """Record a failed attempt; False when the row is gone (ACKed meanwhile)."""
    cur = conn.execute("UPDATE a2a_outbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
                       (attempts, next_attempt_at, last_error, id))
    return cur.rowcount > 0


def remove_many(conn: sqlite3.Connection, peer: str, correlation_ids: Sequence[str]) -> int:
    """Delete ``peer``'s rows for the ACKed ``correlation_ids``; returns how many there were. One statement
    per ``_CHUNK`` ids (a group's ACKs: one DELETE each cost ~5 us a row on the sender's writer thread)."""
    wanted = list(dict.fromkeys(correlation_ids))
    removed = 0
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i:i + _CHUNK]
        marks = ",".join("?" * len(chunk))
        removed += conn.execute(f"DELETE FROM a2a_outbox WHERE peer = ? AND correlation_id IN ({marks})",
                                (peer, *chunk)).rowcount
    return removed


def remove(conn: sqlite3.Connection, correlation_id: str, peer: str) -> bool:
    """Delete the row on ACK; False when there was none (a duplicate or late ACK)."""
    cur = conn.execute("DELETE FROM a2a_outbox WHERE correlation_id = ? AND peer = ?", (correlation_id, peer))
    return cur.rowcount > 0


def _dead_ids(conn: sqlite3.Connection, n: int) -> int:
    """Take ``n`` dead-letter ids never given before; returns the first (the others follow it)."""
    last = scalar_int(conn, "INSERT INTO counters (name, value) SELECT ?, coalesce(max(id), 0) + ? "
                      "FROM a2a_dead_letters WHERE true ON CONFLICT (name) "
                      "DO UPDATE SET value = counters.value + ? RETURNING value",
                      (_DEAD_ID_COUNTER, n, n))
    return last - n + 1


_TO_DEAD = ("INSERT INTO a2a_dead_letters (id, correlation_id, peer, kind, envelope, expires_at, attempts, "
            "last_error, created_at, dead_at) SELECT ? + row_number() OVER (ORDER BY id) - 1, correlation_id, peer, "
            "kind, envelope, expires_at, attempts, ?, created_at, ? FROM a2a_outbox WHERE ")


def to_dead_letter(conn: sqlite3.Connection, id: int, last_error: str | None, dead_at: int) -> int | None:
    """Move outbox row ``id`` to the dead letters; returns the dead-letter id, None if the row is gone."""
    if conn.execute("SELECT 1 FROM a2a_outbox WHERE id = ?", (id,)).fetchone() is None:
        return None
    dead_id = _dead_ids(conn, 1)
    conn.execute(_TO_DEAD + "id = ?", (dead_id, last_error, dead_at, id))
    conn.execute("DELETE FROM a2a_outbox WHERE id = ?", (id,))
    return dead_id


def dead_letter_peers_except(conn: sqlite3.Connection, peers: list[str], last_error: str, dead_at: int) -> int:
    """Move every outbox row whose peer is not in ``peers`` to the dead letters; returns how many."""
    marks = ",".join("?" * len(peers))
    where = f"peer NOT IN ({marks})" if peers else "1 = 1"
    n = scalar_int(conn, f"SELECT count(*) FROM a2a_outbox WHERE {where}", peers)
    if n == 0:
        return 0
    conn.execute(_TO_DEAD + where, (_dead_ids(conn, n), last_error, dead_at, *peers))
    conn.execute(f"DELETE FROM a2a_outbox WHERE {where}", peers)
    return n


def depth(conn: sqlite3.Connection, peer: str | None = None) -> int:
    if peer is None:
        return scalar_int(conn, "SELECT count(*) FROM a2a_outbox")
    return scalar_int(conn, "SELECT count(*) FROM a2a_outbox WHERE peer = ?", (peer,))


def dead_letters(conn: sqlite3.Connection, peer: str | None = None, limit: int = 100,
                 offset: int = 0) -> list[DeadLetterRow]:
    """Dead letters oldest first, optionally for one peer."""
    if peer is None:
        rows = conn.execute(f"SELECT {_DEAD} FROM a2a_dead_letters ORDER BY id LIMIT ? OFFSET ?", (limit, offset))
    else:
        rows = conn.execute(f"SELECT {_DEAD} FROM a2a_dead_letters WHERE peer = ? ORDER BY id LIMIT ? OFFSET ?",
                            (peer, limit, offset))
    return [_dead(r) for r in rows]


def undelivered_count(conn: sqlite3.Connection, correlation_ids: list[str]) -> int:
    """How many of ``correlation_ids`` are still in the outbox or dead letters (i.e. not ACKed)."""
    if not correlation_ids:
        return 0
    marks = ",".join("?" * len(correlation_ids))
    q = (f"SELECT (SELECT count(*) FROM a2a_outbox WHERE correlation_id IN ({marks})) + "
         f"(SELECT count(*) FROM a2a_dead_letters WHERE correlation_id IN ({marks}))")
    return scalar_int(conn, q, (*correlation_ids, *correlation_ids))


def get_dead_letter(conn: sqlite3.Connection, id: int) -> DeadLetterRow | None:
    r = conn.execute(f"SELECT {_DEAD} FROM a2a_dead_letters WHERE id = ?", (id,)).fetchone()
    return _dead(r) if r else None


def dead_letter_count(conn: sqlite3.Connection, peer: str | None = None) -> int:
    if peer is None:
        return scalar_int(conn, "SELECT count(*) FROM a2a_dead_letters")
    return scalar_int(conn, "SELECT count(*) FROM a2a_dead_letters WHERE peer = ?", (peer,))


def replay_dead_letter(conn: sqlite3.Connection, id: int, now_ms: int, new_expires_at: int, *,
                       envelope: bytes | None = None, correlation_id: str | None = None) -> int:
    """Move dead letter ``id`` back to the outbox, due at ``now_ms`` with attempts reset and ``replayed_from`` set
    (the node logs the replay when it sends the row); returns the outbox id. The caller may supply a fresh
    envelope and correlation id (a resent message normally needs both, since ``expires_at`` is inside the envelope).
    Raises 'not_found', or 'already_queued' when the outbox already holds that (correlation_id, peer)."""
    r = conn.execute(f"SELECT {_DEAD} FROM a2a_dead_letters WHERE id = ?", (id,)).fetchone()
    if r is None:
        raise StorageError(StorageCode.NOT_FOUND, f"no dead letter with id {id}")
    d = _dead(r)
    cid = correlation_id or d.correlation_id
    try:
        cur = conn.execute(f"INSERT INTO a2a_outbox ({_OUT}) VALUES (NULL,?,?,?,?,?,0,?,NULL,?,?)",
                           (cid, d.peer, d.kind, d.envelope if envelope is None else envelope,
                            new_expires_at, now_ms, now_ms, id))
    except sqlite3.IntegrityError as e:
        raise StorageError(StorageCode.ALREADY_QUEUED,
                           f"message {cid} for {d.peer} is already in the outbox; not replayed") from e
    conn.execute("DELETE FROM a2a_dead_letters WHERE id = ?", (id,))
    return inserted_id(cur)


def clear_dead_letters(conn: sqlite3.Connection, peer: str | None = None,
                       kinds: tuple[str, ...] | None = None, dead_before: int | None = None) -> int:
    """Delete dead letters (all, or one peer's, optionally only of ``kinds`` and dead at or before
    ``dead_before`` unix ms); returns how many."""
    where: list[str] = []
    params: list[int | str] = []
    if dead_before is not None:
        where.append("dead_at <= ?")
        params.append(dead_before)
    if peer is not None:
        where.append("peer = ?")
        params.append(peer)
    if kinds is not None:
        where.append(f"kind IN ({','.join('?' * len(kinds))})")
        params.extend(kinds)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return conn.execute(f"DELETE FROM a2a_dead_letters{clause}", params).rowcount
