"""``storage.repair``: a damaged index or full-text index is rebuilt and the store answers again with every row it
held; a damaged table is named, left as it was, and pointed at a backup or the mesh; a store in use is refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from storage import Database, memories
from storage.errors import StorageCode, StorageError
from storage.repair import repair
from tests.faults import btree_pages, damage
from tests.storage.storage_helpers import make_memory

# Every table whose rows a repair must keep, with the columns that say the row is the same.
KEPT = ("memories", "memory_links", "signed_events", "change_log", "counters", "sqlite_sequence",
        "writer_bytes")  # derived by triggers: rebuilt, not copied, to the same rows


def rows(path: Path) -> dict[str, list[tuple]]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return {t: sorted(conn.execute(f"SELECT * FROM {t} NOT INDEXED").fetchall()) for t in KEPT}
    finally:
        conn.close()


async def recall_ids(path: Path, query: str) -> list[str]:
    db = await Database.open(path)
    try:
        return [m.id for m, _ in await db.read(memories.recall, query, 10)]
    finally:
        await db.close()


def test_a_sound_store_is_left_as_it_is(store: Path) -> None:
    before = store.read_bytes()
    done = repair(store)
    assert done.outcome == "sound" and done.done == [] and done.kept is None
    assert store.read_bytes()[100:] == before[100:]  # the header says "rollback journal" now: the WAL is folded


async def test_a_damaged_full_text_index_is_rebuilt_and_recall_answers_again(
        store: Path, filled: tuple[Path, list[str]]) -> None:
    held = rows(store)
    damage(store, "memories_fts_data", pages=len(btree_pages(store, "memories_fts_data")))  # every page
    db = await Database.open(store)
    try:
        with pytest.raises(StorageError) as met:
            await db.read(memories.recall, "needle7", 10)
        assert met.value.code == StorageCode.STORAGE_CORRUPT
    finally:
        await db.close()

    done = repair(store)
    assert done.outcome == "repaired", done.as_dict()
    assert done.after is not None and done.after.ok
    assert any("full-text index" in d for d in done.done)
    assert done.kept is not None and done.kept.exists() and (done.kept.stat().st_mode & 0o777) == 0o600
    assert rows(store) == held
    ids = filled[1]
    for i in range(0, 2_000, 7):
        assert await recall_ids(store, f"needle{i}") == [ids[i]]


async def test_a_damaged_index_is_rebuilt_and_queries_through_it_answer(
        store: Path, filled: tuple[Path, list[str]]) -> None:
    held = rows(store)
    damage(store, "memories_ns_created", pages=2)
    done = repair(store)
    assert done.outcome == "repaired", done.as_dict()
    assert [d.describe() for d in done.before.damaged] == ["the indexes of table memories"]
    assert rows(store) == held
    db = await Database.open(store)
    try:
        listed = await db.read(memories.list_, "ns3", 10_000)
        assert len(listed) == 400
        await db.write(memories.insert, make_memory(namespace="ns3"))
        assert (await db.check_integrity(full=True)).ok  # type: ignore[union-attr]
    finally:
        await db.close()


async def test_a_full_text_index_out_of_step_with_the_memories_is_rebuilt_in_place(store: Path) -> None:
    # A memory written while the index's trigger was away: sound pages, an index that lacks it.
    conn = sqlite3.connect(store, isolation_level=None)
    (trigger,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memories_fts_ai'").fetchone()
    conn.execute("DROP TRIGGER memories_fts_ai")
    m = make_memory(content="unindexed haystack")
    conn.execute("INSERT INTO memories (id, namespace, title, content, origin, created_at, updated_at) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?)", (m.id, m.namespace, m.title, m.content, m.origin, m.created_at,
                                                  m.updated_at))
    conn.execute(trigger)
    conn.close()
    assert await recall_ids(store, "haystack") == []

    done = repair(store)
    assert done.outcome == "repaired", done.as_dict()
    assert [d.describe() for d in done.before.damaged] == ["the full-text index (memories_fts)"]
    assert any("REINDEX" in d for d in done.done) and done.kept is None  # in place: no copy needed
    assert await recall_ids(store, "haystack") == [m.id]


def test_a_damaged_table_is_named_and_left_as_it_was(store: Path) -> None:
    pages = damage(store, "memories", pages=2)
    before = store.read_bytes()
    done = repair(store)
    assert done.outcome == "not_repaired" and done.done == [] and done.kept is None
    assert len(done.not_done) == 1 and done.not_done[0].startswith("table memories")
    assert "from a backup, or from the mesh" in done.not_done[0]
    size = 4096
    after = store.read_bytes()
    assert [after[(p - 1) * size:p * size] for p in pages] == [before[(p - 1) * size:p * size] for p in pages]
    assert after[100:] == before[100:]


async def test_a_store_open_elsewhere_is_refused(store: Path) -> None:
    db = await Database.open(store)
    try:
        with pytest.raises(StorageError) as refused:
            repair(store)
        assert refused.value.code == StorageCode.IN_USE and "ai-memory repair" in refused.value.message
        await db.write(memories.insert, make_memory())  # the holder goes on as if nothing happened
    finally:
        await db.close()
