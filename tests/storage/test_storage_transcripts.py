"""memory_transcripts on both backends: zstd round trip, the span links' foreign key, archive and prune."""

from __future__ import annotations

import random
import uuid

import pytest

from storage import Database, StorageError, memories, transcripts
from storage.transcripts import Span, TranscriptRow
from tests.storage.storage_helpers import Raw, make_memory


def make_transcript(text: str, *, namespace: str = "default", created_at: int = 1_000) -> TranscriptRow:
    body, raw_bytes, digest = transcripts.compress(text)
    return TranscriptRow(id=str(uuid.uuid4()), namespace=namespace, agent="ai:node-1@lab", created_at=created_at,
                         body=body, raw_bytes=raw_bytes, stored_bytes=len(body), content_hash=digest,
                         signature=bytes(64), attest_level="self_signed", signed_by="ai:node-1@lab")


def _mixed_text(n: int) -> str:
    rnd = random.Random(13)
    alphabet = "abc xyz\n\t\u00e9\u00df\u4e2d\u6587\U0001f600\u0000\u200d"
    return "".join(rnd.choice(alphabet) for _ in range(n))


async def test_transcript_round_trips_through_zstd_byte_for_byte(db: Database):
    text = _mixed_text(50_000)
    row = make_transcript(text)
    await db.write(transcripts.insert, row, [])
    got = await db.read(transcripts.get, row.id)
    assert got is not None and got.body == row.body and got.signature == bytes(64)
    assert transcripts.decompress(got).encode("utf-8") == text.encode("utf-8")
    assert got.raw_bytes == len(text.encode("utf-8")) and got.stored_bytes == len(row.body)


async def test_span_links_need_a_stored_memory(db: Database):
    m = make_memory()
    await db.write(memories.insert, m)
    row = make_transcript("hello world")
    await db.write(transcripts.insert, row, [Span(m.id, 0, 5)])
    assert await db.read(transcripts.spans_of_memory, m.id) == [(row.id, 0, 5)]
    other = make_transcript("again")
    with pytest.raises(StorageError) as err:
        await db.write(transcripts.insert, other, [Span(str(uuid.uuid4()), 0, 1)])
    assert err.value.code == "constraint"
    assert await db.read(transcripts.get, other.id) is None  # the whole write rolled back


async def test_archive_moves_then_prune_deletes_with_links(db: Database):
    m = make_memory()
    await db.write(memories.insert, m)
    old, new = make_transcript("old", created_at=100), make_transcript("new", created_at=900)
    await db.write(transcripts.insert, old, [Span(m.id, 0, 3)])
    await db.write(transcripts.insert, new, [])
    assert await db.write(transcripts.archive_older, "default", 500, 1_000, 10) == [old.id]
    archived = await db.read(transcripts.get, old.id)
    assert archived is not None and archived.archived_at == 1_000 and transcripts.decompress(archived) == "old"
    assert await db.read(transcripts.counts) == {"hot": 1, "archived": 1, "links": 1}
    assert await db.write(transcripts.prune_older, "default", 1_000, 10) == []
    assert await db.write(transcripts.prune_older, "default", 1_001, 10) == [old.id]
    assert await db.read(transcripts.get, old.id) is None
    assert await db.read(transcripts.counts) == {"hot": 1, "archived": 0, "links": 0}


async def test_a_damaged_blob_reads_as_transcript_corrupt(db: Database):
    row = make_transcript(_mixed_text(2_000))
    await db.write(transcripts.insert, row, [])
    raw = Raw(db)
    try:
        damaged = bytearray(row.body)
        damaged[len(damaged) // 2] ^= 0xFF
        raw.execute("UPDATE memory_transcripts SET body = ? WHERE id = ?", (bytes(damaged), row.id))
    finally:
        raw.close()
    got = await db.read(transcripts.get, row.id)
    assert got is not None
    with pytest.raises(StorageError) as err:
        transcripts.decompress(got)
    assert err.value.code == "transcript_corrupt" and row.id in err.value.message
