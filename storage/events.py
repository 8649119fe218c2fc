"""signed_events: the append-only, hash-chained audit log of signed writes.

Chain formula (hex digests, UTF-8/ASCII bytes)::

    event_hash = sha256(json.dumps(
        [prev_hash, seq, event_type, link_id, agent_id, payload_hash, signature_hex, created_at],
        separators=(",", ":"), ensure_ascii=True).encode("ascii")).hexdigest()

where ``signature_hex`` is ``signature.hex()`` or null, ``link_id`` may be null, and ``prev_hash``
is the previous row's ``event_hash`` (the first row uses ``GENESIS_HASH``, 64 '0'). UPDATE and
DELETE are refused by triggers; the chain makes an edit behind the triggers' back evident. Removing
only the newest rows is not detectable from the chain alone (anchor the head elsewhere for that).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from storage.errors import StorageCode, StorageError
from storage.rows import Row

GENESIS_HASH = "0" * 64

_COLUMNS = "seq, event_type, link_id, agent_id, payload_hash, signature, prev_hash, event_hash, created_at"


@dataclass(frozen=True, kw_only=True, slots=True)
class EventRow:
    seq: int
    event_type: str
    link_id: str | None
    agent_id: str
    payload_hash: str
    signature: bytes | None
    prev_hash: str
    event_hash: str
    created_at: int   # unix ms


@dataclass(frozen=True, slots=True)
class ChainReport:
    ok: bool
    checked: int                  # rows examined
    first_bad_seq: int | None
    reason: str | None


def event_hash(prev_hash: str, seq: int, event_type: str, link_id: str | None, agent_id: str,
               payload_hash: str, signature: bytes | None, created_at: int) -> str:
    """The chain hash of one event (formula in the module docstring)."""
    encoded = json.dumps(
        [prev_hash, seq, event_type, link_id, agent_id, payload_hash,
         None if signature is None else bytes(signature).hex(), created_at],
        separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return hashlib.sha256(encoded).hexdigest()


def _row(r: Row) -> EventRow:
    return EventRow(seq=r[0], event_type=r[1], link_id=r[2], agent_id=r[3], payload_hash=r[4],
                    signature=None if r[5] is None else bytes(r[5]), prev_hash=r[6], event_hash=r[7],
                    created_at=r[8])


def append(conn: sqlite3.Connection, event_type: str, link_id: str | None, agent_id: str, payload_hash: str,
           signature: bytes | None, created_at: int, *, after: EventRow | None = None) -> EventRow:
    """Append one event, chained to the newest row. A second 'link' event for the same link_id raises
    StorageError('duplicate_link'). Must run on the writer (db.write) so appends are serialized.
    ``after``: the newest row when the caller holds it (the event it appended last in this same write job,
    nothing appended since), saving the read of the chain's head; a stale one collides on ``seq`` and fails."""
    last = append_many(conn, event_type, [(link_id, agent_id, payload_hash, signature, created_at)], after=after)
    assert last is not None
    return last


# One event to append: link_id, agent_id, payload_hash, signature, created_at.
EventItem = tuple[str | None, str, str, bytes | None, int]


def append_many(conn: sqlite3.Connection, event_type: str, items: Sequence[EventItem], *,
                after: EventRow | None = None) -> EventRow | None:
    """``append`` for each item in order, each chained to the one before, in one statement (the writer of a
    links.put stores a hundred); the last event appended, or ``after`` when there are none. Raises as ``append``
    does; the events before the one that failed are undone only when the error leaves the caller's job (its
    savepoint)."""
    if not items:
        return after
    if after is not None:
        seq, prev = after.seq + 1, after.event_hash
    else:
        last = conn.execute("SELECT seq, event_hash FROM signed_events ORDER BY seq DESC LIMIT 1").fetchone()
        seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
    rows = []
    for link_id, agent_id, payload_hash, signature, created_at in items:
        h = event_hash(prev, seq, event_type, link_id, agent_id, payload_hash, signature, created_at)
        rows.append((seq, event_type, link_id, agent_id, payload_hash, signature, prev, h, created_at))
        seq, prev = seq + 1, h
    try:
        conn.executemany(f"INSERT INTO signed_events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", rows)
    except sqlite3.IntegrityError as e:
        if "signed_events.link_id" in str(e):
            which = f"link {rows[0][2]}" if len(rows) == 1 else f"one of {len(rows)} links"
            raise StorageError(StorageCode.DUPLICATE_LINK, f"a signed event for {which} already exists") from e
        raise
    return _row(rows[-1])  # its columns in _COLUMNS' order


def get_by_link(conn: sqlite3.Connection, link_id: str) -> EventRow | None:
    r = conn.execute(f"SELECT {_COLUMNS} FROM signed_events WHERE link_id = ? AND event_type = 'link'",
                     (link_id,)).fetchone()
    return _row(r) if r else None


def head(conn: sqlite3.Connection) -> EventRow | None:
    r = conn.execute(f"SELECT {_COLUMNS} FROM signed_events ORDER BY seq DESC LIMIT 1").fetchone()
    return _row(r) if r else None


def verify_chain(conn: sqlite3.Connection) -> ChainReport:
    """Recompute every event hash in seq order; report the first row whose link or hash is wrong."""
    prev = GENESIS_HASH
    checked = 0
    for r in conn.execute(f"SELECT {_COLUMNS} FROM signed_events ORDER BY seq"):
        e = _row(r)
        checked += 1
        if e.prev_hash != prev:
            return ChainReport(False, checked, e.seq,
                               f"seq {e.seq}: prev_hash does not match the event_hash of the row before it")
        want = event_hash(e.prev_hash, e.seq, e.event_type, e.link_id, e.agent_id, e.payload_hash,
                          e.signature, e.created_at)
        if want != e.event_hash:
            return ChainReport(False, checked, e.seq,
                               f"seq {e.seq}: event_hash does not match the row's contents")
        prev = e.event_hash
    return ChainReport(True, checked, None, None)
