"""change_log (the pageable feed a returning peer syncs from), peer_state, counters, and the sync items a pull
could not apply yet (pending, then parked)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from storage.rows import inserted_id, scalar_int

ChangeKind = Literal["memory", "link"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ChangeRow:
    seq: int
    kind: str          # 'memory' | 'link'
    ref_id: str        # memory id or link_id
    version: int
    created_at: int    # unix ms


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerState:
    peer: str
    last_sync_seq: int
    last_ack_at: int | None   # unix ms


def append(conn: sqlite3.Connection, kind: ChangeKind, ref_id: str, version: int, created_at: int,
           author: str | None = None) -> int:
    """Record a local or applied change; returns its seq (strictly increasing, never reused). ``author``: who wrote
    it as the item names it (a memory version's writer, a link's observer); None where not recorded."""
    cur = conn.execute("INSERT INTO change_log (kind, ref_id, version, created_at, author) VALUES (?,?,?,?,?)",
                       (kind, ref_id, version, created_at, author))
    return inserted_id(cur)


def append_many(conn: sqlite3.Connection, kind: ChangeKind, items: Sequence[tuple[str, int, int]],
                authors: Sequence[str | None] | None = None) -> None:
    """``append`` for each (ref_id, version, created_at), in order, in one statement; ``authors``: each one's
    author (None: none recorded)."""
    if not items:
        return
    who = list(authors) if authors is not None else [None] * len(items)
    if len(who) != len(items):
        raise ValueError(f"{len(items)} changes and {len(who)} authors")
    conn.executemany("INSERT INTO change_log (kind, ref_id, version, created_at, author) VALUES (?,?,?,?,?)",
                     [(kind, ref_id, version, created_at, author)
                      for (ref_id, version, created_at), author in zip(items, who, strict=True)])


def page(conn: sqlite3.Connection, since_seq: int, limit: int, *, skip: Collection[str] = (),
         upto: int | None = None) -> list[ChangeRow]:
    """Changes with seq > ``since_seq`` (and <= ``upto``), oldest first, at most ``limit``; without those whose
    recorded author is one of ``skip`` (a change with no author recorded is always in)."""
    where: list[str] = ["seq > ?"]
    args: list[object] = [since_seq]
    if upto is not None:
        where.append("seq <= ?")
        args.append(upto)
    if skip:
        where.append(f"(author IS NULL OR author NOT IN ({','.join('?' * len(skip))}))")
        args += [*sorted(skip)]
    rows = conn.execute(f"SELECT seq, kind, ref_id, version, created_at FROM change_log WHERE {' AND '.join(where)} "
                        "ORDER BY seq LIMIT ?", (*args, limit))
    return [ChangeRow(seq=r[0], kind=r[1], ref_id=r[2], version=r[3], created_at=r[4]) for r in rows]


def last_seq(conn: sqlite3.Connection) -> int:
    return scalar_int(conn, "SELECT coalesce(max(seq), 0) FROM change_log")


def start_seq_after(conn: sqlite3.Connection, seq: int) -> None:
    """The next change appended gets a seq above ``seq`` (a restored node's change log starts past every cursor
    its peers kept on the log it lost). Only moves the sequence forward."""
    if seq <= last_seq(conn):
        return
    if getattr(conn, "dialect", "sqlite") == "postgres":
        conn.execute("SELECT setval(pg_get_serial_sequence('change_log', 'seq'), ?)", (seq,))
        return
    # AUTOINCREMENT keeps its high-water mark in sqlite_sequence, one row per table once it has inserted.
    if conn.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'change_log'", (seq,)).rowcount == 0:
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('change_log', ?)", (seq,))


# What a store holds, by table: a restore starts only from a store where each is 0.
HELD_TABLES = ("memories", "memory_links", "link_invalidations", "memory_transcripts", "signed_events", "change_log")


def held(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows in each of ``HELD_TABLES`` (counted up to 1,000,000 each: a restore only asks whether any)."""
    return {t: scalar_int(conn, f"SELECT count(*) FROM (SELECT 1 FROM {t} LIMIT 1000000) AS x")
            for t in HELD_TABLES}


def get_peer_state(conn: sqlite3.Connection, peer: str) -> PeerState | None:
    r = conn.execute("SELECT peer, last_sync_seq, last_ack_at FROM peer_state WHERE peer = ?", (peer,)).fetchone()
    return PeerState(peer=r[0], last_sync_seq=r[1], last_ack_at=r[2]) if r else None


def set_peer_state(conn: sqlite3.Connection, peer: str, *, last_sync_seq: int | None = None,
                   last_ack_at: int | None = None) -> PeerState:
    """Upsert the given fields of ``peer``'s state (None leaves a field as it is); returns the new state."""
    conn.execute(
        "INSERT INTO peer_state (peer, last_sync_seq, last_ack_at) VALUES (?, coalesce(?, 0), ?) "
        "ON CONFLICT (peer) DO UPDATE SET last_sync_seq = coalesce(?, peer_state.last_sync_seq), "
        "last_ack_at = coalesce(?, peer_state.last_ack_at)",
        (peer, last_sync_seq, last_ack_at, last_sync_seq, last_ack_at))
    state = get_peer_state(conn, peer)
    assert state is not None
    return state


def set_peer_accepts(conn: sqlite3.Connection, peer: str, kinds: Sequence[str]) -> None:
    """Record what ``peer``'s last sync page said it reads beyond the common kinds."""
    conn.execute("INSERT INTO peer_state (peer, last_sync_seq, accepts) VALUES (?, 0, ?) "
                 "ON CONFLICT (peer) DO UPDATE SET accepts = excluded.accepts", (peer, json.dumps(sorted(kinds))))


def peer_accepts(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Every peer's recorded kinds (``set_peer_accepts``); a peer never heard from is absent."""
    out: dict[str, list[str]] = {}
    for peer, raw in conn.execute("SELECT peer, accepts FROM peer_state WHERE accepts IS NOT NULL"):
        kinds = json.loads(raw)
        out[peer] = [k for k in kinds if isinstance(k, str)] if isinstance(kinds, list) else []
    return out


def list_peer_states(conn: sqlite3.Connection) -> list[PeerState]:
    return [PeerState(peer=r[0], last_sync_seq=r[1], last_ack_at=r[2])
            for r in conn.execute("SELECT peer, last_sync_seq, last_ack_at FROM peer_state ORDER BY peer")]


def incr(conn: sqlite3.Connection, name: str, by: int = 1) -> int:
    """Add ``by`` to counter ``name`` (created at 0); returns the new value."""
    return scalar_int(conn, "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT (name) "
                      "DO UPDATE SET value = counters.value + excluded.value RETURNING value", (name, by))


def get_counter(conn: sqlite3.Connection, name: str) -> int:
    r = conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
    return r[0] if r else 0


def all_counters(conn: sqlite3.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT name, value FROM counters ORDER BY name"))


@dataclass(frozen=True, kw_only=True, slots=True)
class PendingItem:
    """A sync item pulled from ``peer`` that could not be applied yet (``item`` is its CBOR bytes)."""

    peer: str
    seq: int
    kind: str
    ref_id: str
    code: str
    rounds: int
    item: bytes
    parked: bool


# One sync item to park: its seq, kind, what it names, its CBOR bytes.
ParkItem = tuple[int, str, str, bytes]


def park_many(conn: sqlite3.Connection, peer: str, items: Sequence[ParkItem], code: str, now_ms: int,
              cap: int) -> list[bool]:
    """Park sync items from ``peer`` at once with ``code`` (e.g. ``unknown_key``: they wait for a key, not for more
    rounds), in order; each answer False, and nothing written for it, when it is not kept yet and ``peer``
    already has ``cap`` items parked with ``code``."""
    count = parked_count(conn, peer, code=code)
    out = []
    for seq, kind, ref_id, item in items:
        kept = conn.execute("SELECT 1 FROM sync_pending WHERE peer = ? AND seq = ?", (peer, seq)).fetchone()
        if kept is None and count >= cap:
            out.append(False)
            continue
        conn.execute(
            "INSERT INTO sync_pending (peer, seq, kind, ref_id, code, rounds, item, parked, updated_at) "
            "VALUES (?,?,?,?,?,1,?,1,?) ON CONFLICT (peer, seq) DO UPDATE SET parked = 1, code = excluded.code, "
            "updated_at = excluded.updated_at",
            (peer, seq, kind, ref_id, code, item, now_ms))
        count += kept is None
        out.append(True)
    return out


def unpark(conn: sqlite3.Connection, peer: str, seq: int, code: str, now_ms: int) -> None:
    """Put a parked item back among those retried each round, from its first round, now waiting on ``code``."""
    conn.execute("UPDATE sync_pending SET parked = 0, rounds = 0, code = ?, updated_at = ? WHERE peer = ? AND seq = ?",
                 (code, now_ms, peer, seq))


def note_pending(conn: sqlite3.Connection, peer: str, seq: int, kind: str, ref_id: str, code: str, item: bytes,
                 park_after: int, now_ms: int) -> PendingItem:
    """Count one more failed round for a sync item; it is parked once it failed ``park_after`` rounds."""
    conn.execute(
        "INSERT INTO sync_pending (peer, seq, kind, ref_id, code, rounds, item, parked, updated_at) "
        "VALUES (?,?,?,?,?,1,?,0,?) ON CONFLICT (peer, seq) DO UPDATE SET rounds = sync_pending.rounds + 1, "
        "code = excluded.code, updated_at = excluded.updated_at",
        (peer, seq, kind, ref_id, code, item, now_ms))
    conn.execute("UPDATE sync_pending SET parked = 1 WHERE peer = ? AND seq = ? AND rounds >= ?",
                 (peer, seq, park_after))
    row = _pending(conn, "WHERE peer = ? AND seq = ?", (peer, seq))
    return row[0]


def pending(conn: sqlite3.Connection, peer: str, limit: int) -> list[PendingItem]:
    """Items from ``peer`` still to retry (not parked), oldest first."""
    return _pending(conn, "WHERE peer = ? AND parked = 0 ORDER BY seq LIMIT ?", (peer, limit))


def parked(conn: sqlite3.Connection, peer: str | None = None, limit: int = 100, *, code: str | None = None,
           after_seq: int = 0) -> list[PendingItem]:
    """Parked items (``peer``'s, those parked with ``code``), oldest first, past ``after_seq`` when a peer is
    given (to walk them in pages)."""
    by_code, args = ("AND code = ? ", (code,)) if code is not None else ("", ())
    if peer is None:
        return _pending(conn, f"WHERE parked = 1 {by_code}ORDER BY peer, seq LIMIT ?", (*args, limit))
    return _pending(conn, f"WHERE peer = ? AND parked = 1 AND seq > ? {by_code}ORDER BY seq LIMIT ?",
                    (peer, after_seq, *args, limit))


def drop_pending(conn: sqlite3.Connection, peer: str, seq: int) -> None:
    conn.execute("DELETE FROM sync_pending WHERE peer = ? AND seq = ?", (peer, seq))


def drop_pending_many(conn: sqlite3.Connection, peer: str, seqs: Sequence[int]) -> None:
    """``drop_pending`` for each seq, in one statement (a pulled page's items that are done)."""
    conn.executemany("DELETE FROM sync_pending WHERE peer = ? AND seq = ?", [(peer, seq) for seq in seqs])


def parked_count(conn: sqlite3.Connection, peer: str | None = None, *, code: str | None = None) -> int:
    """Parked items (``peer``'s; those parked with ``code``)."""
    where, args = ["parked = 1"], []
    for column, value in (("peer", peer), ("code", code)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    return scalar_int(conn, f"SELECT count(*) FROM sync_pending WHERE {' AND '.join(where)}", args)


def _pending(conn: sqlite3.Connection, where: str, args: tuple[object, ...]) -> list[PendingItem]:
    rows = conn.execute("SELECT peer, seq, kind, ref_id, code, rounds, item, parked FROM sync_pending " + where, args)
    return [PendingItem(peer=r[0], seq=r[1], kind=r[2], ref_id=r[3], code=r[4], rounds=r[5], item=bytes(r[6]),
                        parked=bool(r[7])) for r in rows]
