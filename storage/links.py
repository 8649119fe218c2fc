"""The memory_links table: attested links between memories. Sync functions taking ``conn`` first."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from storage.errors import StorageCode, StorageError
from storage.rows import Row


class AttestLevel(StrEnum):
    UNSIGNED = "unsigned"            # no key, or signer unknown to this node: accepted and flagged
    SELF_SIGNED = "self_signed"      # written here with this node's key
    PEER_ATTESTED = "peer_attested"  # received, signature verified against the observer's .pub


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkRow:
    link_id: str                     # hex sha256 of the canonical CBOR payload
    src_id: str
    dst_id: str
    relation: str
    observed_by: str
    valid_from: int                  # unix ms
    valid_until: int | None = None   # unix ms
    confidence: float | None = None
    signature: bytes | None = None
    attest_level: str = AttestLevel.UNSIGNED
    signed_by: str | None = None
    received_from: str | None = None
    created_at: int                  # unix ms


# Ids per IN (...) query: under SQLite's default bound of 999 variables.
_CHUNK = 500
_COLUMNS = ("link_id, src_id, dst_id, relation, observed_by, valid_from, valid_until, confidence, "
            "signature, attest_level, signed_by, received_from, created_at")


def _row(r: Row) -> LinkRow:
    return LinkRow(link_id=r[0], src_id=r[1], dst_id=r[2], relation=r[3], observed_by=r[4], valid_from=r[5],
                   valid_until=r[6], confidence=r[7], signature=None if r[8] is None else bytes(r[8]),
                   attest_level=AttestLevel(r[9]), signed_by=r[10], received_from=r[11], created_at=r[12])


def insert(conn: sqlite3.Connection, link: LinkRow) -> None:
    """Store a link; an existing link_id raises StorageError('duplicate_link')."""
    insert_many(conn, [link])


def insert_many(conn: sqlite3.Connection, rows: Sequence[LinkRow]) -> None:
    """``insert`` for each row, in one statement; a link_id stored already (or twice among ``rows``) raises as
    ``insert`` does; the rows before it are undone only when the error leaves the caller's job (its savepoint)."""
    if not rows:
        return
    try:
        conn.executemany(f"INSERT INTO memory_links ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", [(
            link.link_id, link.src_id, link.dst_id, link.relation, link.observed_by, link.valid_from,
            link.valid_until, link.confidence, link.signature, str(link.attest_level), link.signed_by,
            link.received_from, link.created_at) for link in rows])
    except sqlite3.IntegrityError as e:
        if "memory_links.link_id" in str(e):
            which = f"link {rows[0].link_id} is" if len(rows) == 1 else f"one of {len(rows)} links is"
            raise StorageError(StorageCode.DUPLICATE_LINK, f"{which} already stored") from e
        raise


def get(conn: sqlite3.Connection, link_id: str) -> LinkRow | None:
    r = conn.execute(f"SELECT {_COLUMNS} FROM memory_links WHERE link_id = ?", (link_id,)).fetchone()
    return _row(r) if r else None


def stored_ids(conn: sqlite3.Connection, link_ids: Iterable[str]) -> set[str]:
    """Those of ``link_ids`` already stored (one query per ``_CHUNK`` ids: a batch's duplicate check)."""
    wanted = list(dict.fromkeys(link_ids))
    found: set[str] = set()
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i:i + _CHUNK]
        marks = ",".join("?" * len(chunk))
        found.update(r[0] for r in conn.execute(f"SELECT link_id FROM memory_links WHERE link_id IN ({marks})", chunk))
    return found


def list_(conn: sqlite3.Connection, attest_level: str | None = None, limit: int = 50,
          offset: int = 0) -> list[LinkRow]:
    """Links newest first, optionally of one attest level."""
    if attest_level is None:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM memory_links ORDER BY created_at DESC, rowid DESC "
                            "LIMIT ? OFFSET ?", (limit, offset))
    else:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM memory_links WHERE attest_level = ? "
                            "ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?",
                            (str(attest_level), limit, offset))
    return [_row(r) for r in rows]


def for_memory(conn: sqlite3.Connection, memory_id: str, limit: int = 100) -> list[LinkRow]:
    """Links whose source or destination is ``memory_id``."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM memory_links WHERE src_id = ? UNION "
                        f"SELECT {_COLUMNS} FROM memory_links WHERE dst_id = ? LIMIT ?",
                        (memory_id, memory_id, limit))
    return [_row(r) for r in rows]


def counts_by_attest_level(conn: sqlite3.Connection) -> dict[str, int]:
    """Number of links per attest level; every level is present, zero when none."""
    counts = {str(level): 0 for level in AttestLevel}
    for level, n in conn.execute("SELECT attest_level, count(*) FROM memory_links GROUP BY attest_level"):
        counts[level] = n
    return counts
