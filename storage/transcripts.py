"""memory_transcripts: conversation trails as zstd level-3 frames, the spans memories cite, and their lifecycle.

A transcript lives in ``memory_transcripts`` (hot) until its namespace's TTL, then moves whole to
``memory_transcripts_archive`` (still replayable), and is deleted with its span links after a second
period. ``memory_transcript_links`` rows cite ``[span_start, span_end)`` in Unicode code points of the
text. Statements run unchanged on SQLite and Postgres. Sync functions taking ``conn`` first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import zstandard

from storage.errors import StorageCode, StorageError
from storage.rows import Row
from storage.sqlconn import Conn

# zstd level 3: the library's default, a good ratio at well over 100 MB/s on one core.
ZSTD_LEVEL = 3

_COLUMNS = ("id, namespace, agent, created_at, body, raw_bytes, stored_bytes, content_hash, signature, "
            "attest_level, signed_by, received_from")
_TABLES = ("memory_transcripts", "memory_transcripts_archive")


class Span(NamedTuple):
    """One cited span: ``text[start:end]`` in Unicode code points of the transcript ``memory_id`` draws on."""

    memory_id: str
    start: int
    end: int


@dataclass(frozen=True, kw_only=True, slots=True)
class TranscriptRow:
    id: str                          # UUIDv4
    namespace: str
    agent: str                       # the writer, who signed it
    created_at: int                  # unix ms
    body: bytes                      # zstd frame of the UTF-8 text
    raw_bytes: int                   # UTF-8 length of the text
    stored_bytes: int                # length of ``body``
    content_hash: str                # hex SHA-256 of the UTF-8 text
    signature: bytes | None = None
    attest_level: str                # unsigned | self_signed | peer_attested
    signed_by: str | None = None
    received_from: str | None = None
    archived_at: int | None = None   # unix ms; set once it has moved to the archive table


def compress(text: str) -> tuple[bytes, int, str]:
    """(zstd frame, UTF-8 byte length, hex SHA-256 of the UTF-8 bytes) of ``text``."""
    raw = text.encode("utf-8")
    frame = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(raw)
    return frame, len(raw), hashlib.sha256(raw).hexdigest()


def decompress(row: TranscriptRow) -> str:
    """The text of ``row``; StorageError('transcript_corrupt') when the frame does not decode to exactly the
    stored size and hash (a damaged BLOB), never a partial or wrong text."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(row.body, max_output_size=row.raw_bytes)
    except zstandard.ZstdError as e:
        raise StorageError(StorageCode.TRANSCRIPT_CORRUPT,
                           f"transcript {row.id}: its stored zstd frame does not decode "
                           f"({e}); the stored bytes are left as they are") from None
    if len(raw) != row.raw_bytes or hashlib.sha256(raw).hexdigest() != row.content_hash:
        raise StorageError(StorageCode.TRANSCRIPT_CORRUPT,
                           f"transcript {row.id}: its stored frame decodes to text that "
                           "does not match the stored size and content hash")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StorageError(StorageCode.TRANSCRIPT_CORRUPT, f"transcript {row.id}: stored text is not UTF-8") from None


def _row(r: Row, archived_at: int | None = None) -> TranscriptRow:
    return TranscriptRow(id=r[0], namespace=r[1], agent=r[2], created_at=r[3], body=bytes(r[4]), raw_bytes=r[5],
                         stored_bytes=r[6], content_hash=r[7], signature=None if r[8] is None else bytes(r[8]),
                         attest_level=r[9], signed_by=r[10], received_from=r[11], archived_at=archived_at)


def insert(conn: Conn, row: TranscriptRow, spans: Sequence[Span]) -> None:
    """Store a transcript and its span links (the caller checked the memories exist: the FK insists)."""
    conn.execute(f"INSERT INTO memory_transcripts ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", (
        row.id, row.namespace, row.agent, row.created_at, row.body, row.raw_bytes, row.stored_bytes,
        row.content_hash, row.signature, row.attest_level, row.signed_by, row.received_from))
    for s in spans:
        conn.execute("INSERT INTO memory_transcript_links (memory_id, transcript_id, span_start, span_end) "
                     "VALUES (?,?,?,?) ON CONFLICT DO NOTHING", (s.memory_id, row.id, s.start, s.end))


def get(conn: Conn, transcript_id: str) -> TranscriptRow | None:
    """The transcript, hot or archived (``archived_at`` set), or None once pruned or never stored."""
    r = conn.execute(f"SELECT {_COLUMNS} FROM memory_transcripts WHERE id = ?", (transcript_id,)).fetchone()
    if r is not None:
        return _row(r)
    r = conn.execute(f"SELECT {_COLUMNS}, archived_at FROM memory_transcripts_archive WHERE id = ?",
                     (transcript_id,)).fetchone()
    return _row(r, r[12]) if r is not None else None


def spans_of_memory(conn: Conn, memory_id: str) -> list[tuple[str, int, int]]:
    """(transcript_id, start, end) cited by ``memory_id``, in transcript then span order."""
    rows = conn.execute("SELECT transcript_id, span_start, span_end FROM memory_transcript_links "
                        "WHERE memory_id = ? ORDER BY transcript_id, span_start, span_end", (memory_id,)).fetchall()
    return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]


def spans_of_transcript(conn: Conn, transcript_id: str) -> list[Span]:
    rows = conn.execute("SELECT memory_id, span_start, span_end FROM memory_transcript_links "
                        "WHERE transcript_id = ? ORDER BY memory_id, span_start, span_end",
                        (transcript_id,)).fetchall()
    return [Span(str(r[0]), int(r[1]), int(r[2])) for r in rows]


def archive_older(conn: Conn, namespace: str, created_before: int, now: int, limit: int) -> list[str]:
    """Move up to ``limit`` hot transcripts of ``namespace`` created before ``created_before`` (unix ms) to the
    archive table, in one transaction with the caller; returns their ids."""
    ids = [str(r[0]) for r in conn.execute(
        "SELECT id FROM memory_transcripts WHERE namespace = ? AND created_at < ? ORDER BY created_at, id LIMIT ?",
        (namespace, created_before, limit)).fetchall()]
    for tid in ids:
        conn.execute(f"INSERT INTO memory_transcripts_archive ({_COLUMNS}, archived_at) "
                     f"SELECT {_COLUMNS}, ? FROM memory_transcripts WHERE id = ?", (now, tid))
        conn.execute("DELETE FROM memory_transcripts WHERE id = ?", (tid,))
    return ids


def prune_older(conn: Conn, namespace: str, archived_before: int, limit: int) -> list[str]:
    """Delete up to ``limit`` archived transcripts of ``namespace`` archived before ``archived_before`` (unix ms),
    with their span links; returns their ids."""
    ids = [str(r[0]) for r in conn.execute(
        "SELECT id FROM memory_transcripts_archive WHERE namespace = ? AND archived_at < ? "
        "ORDER BY archived_at, id LIMIT ?", (namespace, archived_before, limit)).fetchall()]
    for tid in ids:
        conn.execute("DELETE FROM memory_transcript_links WHERE transcript_id = ?", (tid,))
        conn.execute("DELETE FROM memory_transcripts_archive WHERE id = ?", (tid,))
    return ids


def counts(conn: Conn) -> dict[str, int]:
    """Transcripts held: hot, archived, and span links."""
    out = {}
    for name, table in (("hot", _TABLES[0]), ("archived", _TABLES[1]), ("links", "memory_transcript_links")):
        r = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        out[name] = int(r[0]) if r else 0
    return out


def namespaces(conn: Conn) -> list[str]:
    """Namespaces with any transcript, hot or archived."""
    rows: Iterable[Row] = conn.execute(
        "SELECT namespace FROM memory_transcripts UNION SELECT namespace FROM memory_transcripts_archive").fetchall()
    return sorted(str(r[0]) for r in rows)
