"""Idle FTS5 merging (storage/db.py ``fts_merge_pages``): on real SQLite files, merging all the full-text
segments into one never changes what recall returns, a write arriving mid-merge commits, and close does
not wait for the merge."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path

import pytest
from storage_helpers import make_memory

from storage import Database, StorageError, memories
from storage.db import _SEGMENT_PAGES_SQL

WORDS = [f"w{i}" for i in range(300)]
QUERIES = ["w0", "w1 w2", "w3 w250", "w0 w1", "w299", "w7 w8 w9", "w0 w1 w2", "nothing"]


def _segments(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return len(conn.execute(_SEGMENT_PAGES_SQL).fetchall())
    finally:
        conn.close()


async def _fill(db: Database, commits: int, per_commit: int, seed: int = 7, pgsz: int | None = None) -> None:
    """``commits`` write transactions (one segment each, before FTS5's automerge) of Zipf-ish text; ``pgsz``
    shrinks FTS5's pages (bytes) so that a merge of one page a step takes many steps."""
    rng = random.Random(seed)
    if pgsz is not None:
        await db.write(lambda conn: conn.execute("INSERT INTO memories_fts(memories_fts, rank) VALUES('pgsz', ?)",
                                                 (pgsz,)))

    def text(n: int) -> str:
        return " ".join(WORDS[min(int(rng.paretovariate(1.1)) - 1, len(WORDS) - 1)] for _ in range(n))

    for _ in range(commits):
        rows = [make_memory(title=text(3), content=text(30), tags=(text(1),)) for _ in range(per_commit)]
        await db.write_per_commit(lambda conn, rows=rows: [memories.insert(conn, r) for r in rows])


async def _wait(cond, what: str, limit_s: float = 60.0) -> None:
    """Poll ``cond`` (bounded): a hang guard, not a timing claim."""
    for _ in range(int(limit_s / 0.005)):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def _results(db: Database) -> list[list[tuple[str, float]]]:
    out = []
    for q in QUERIES:
        hits = await db.read(memories.recall, q, 10)
        out.append([(m.id, score) for m, score in hits])
    return out


async def test_a_full_idle_merge_leaves_one_segment_and_recall_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with await Database.open(path, synchronous="normal") as db:  # merging off
        await _fill(db, commits=40, per_commit=25, pgsz=512)
        before = await _results(db)
        assert db.merge_stats == {"pages_per_step": 0, "steps": 0, "merges": 0, "merging": False,
                                  "seconds": 0.0, "max_step_ms": 0.0}
    assert _segments(path) > 1
    async with await Database.open(path, synchronous="normal", fts_merge_pages=8) as db:
        await _wait(lambda: db.merge_stats["merges"] >= 1 and not db.merge_stats["merging"], "the merge")
        assert db.merge_stats["steps"] > 1  # bounded steps, not one optimize
        assert _segments(path) == 1
        after = await _results(db)
    assert after == before  # same ids, same order, same scores to the bit
    assert any(after)


async def test_a_write_arriving_mid_merge_commits_and_the_merge_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with await Database.open(path, synchronous="normal") as db:
        await _fill(db, commits=60, per_commit=30, pgsz=64)
    async with await Database.open(path, synchronous="normal", fts_merge_pages=1) as db:
        await _wait(lambda: db.merge_stats["merging"], "the merge to start")
        row = make_memory(title="arrived mid merge", content="zzunique")
        await asyncio.wait_for(db.write(memories.insert, row), 30)
        assert await db.read(memories.get, row.id) == row
        await _wait(lambda: not db.merge_stats["merging"], f"the merge to finish ({db.merge_stats})")
        assert [m.id for m, _ in await db.read(memories.recall, "zzunique", 10)] == [row.id]
        assert db.merge_stats["steps"] > 10
    conn = sqlite3.connect(path)
    try:
        conn.execute("INSERT INTO memories_fts(memories_fts) VALUES('integrity-check')")
    finally:
        conn.close()


async def test_close_does_not_wait_for_the_merge_and_leaves_a_sound_index(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with await Database.open(path, synchronous="normal") as db:
        await _fill(db, commits=60, per_commit=30, pgsz=64)
        before = await _results(db)
    db = await Database.open(path, synchronous="normal", fts_merge_pages=1)
    # A step taken (a count, which a poll cannot miss as it can miss a moment of "merging" on a loaded machine).
    await _wait(lambda: db.merge_stats["steps"] >= 1, "the merge's first step")
    await asyncio.wait_for(db.close(), 30)  # a hang guard: close runs at most one more step
    assert db.merge_stats["merges"] == 0, db.merge_stats  # it stopped mid merge
    conn = sqlite3.connect(path)
    try:
        conn.execute("INSERT INTO memories_fts(memories_fts) VALUES('integrity-check')")
    finally:
        conn.close()
    async with await Database.open(path, synchronous="normal") as db:
        assert await _results(db) == before


async def test_a_negative_merge_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError) as e:
        await Database.open(tmp_path / "memory.db", fts_merge_pages=-1)
    assert e.value.code == "bad_setting"
