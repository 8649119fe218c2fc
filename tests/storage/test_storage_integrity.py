"""A damaged SQLite file: pages in the middle of a filled store overwritten (never the header), then SQLite's own
check names what is damaged, the store says so once and refuses writes, and a read that meets the damage is
``storage_corrupt``, never a bare ``corrupt`` or a traceback."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import Database, memories
from storage.errors import StorageCode, StorageError, translate
from storage.integrity import FTS_TABLE, FileCheck
from storage.watch import StoreWatch
from tests.faults import damage, poll, put_back
from tests.storage.storage_helpers import MEMORIES, make_memory


def test_a_sound_store_passes_both_checks(store: Path) -> None:
    for full in (False, True):
        found = FileCheck(store, full=full).run()
        assert found.ok and found.damaged == () and found.messages == ()


@pytest.mark.parametrize(("name", "table", "rows_readable"), [
    ("memories", "memories", False),
    ("memories_ns_created", "memories", True),
    ("sqlite_autoindex_memories_1", "memories", True),
    ("memories_fts_data", FTS_TABLE, True),
])
def test_damaged_pages_are_named_by_their_table_and_whether_its_rows_still_read(
        store: Path, name: str, table: str, rows_readable: bool) -> None:
    damage(store, name, pages=2)
    for full in (False, True):
        found = FileCheck(store, full=full).run()
        assert not found.ok and found.messages
        assert [(d.table, d.rows_readable) for d in found.damaged] == [(table, rows_readable)]
        assert found.rebuildable is rows_readable


async def test_a_damaged_store_logs_once_refuses_writes_and_reads_through_what_is_sound(
        store: Path, filled: tuple[Path, list[str]], caplog: pytest.LogCaptureFixture) -> None:
    damage(store, "memories_fts_data", pages=2)
    db = await Database.open(store)
    try:
        with caplog.at_level(logging.INFO, logger="storage"):
            for _ in range(3):
                found = await db.check_integrity()
                assert found is not None and not found.ok
            with pytest.raises(StorageError) as refused:
                await db.write(memories.insert, make_memory())
            assert await db.read(memories.get, filled[1][0]) is not None  # the memories themselves read
        assert refused.value.code == StorageCode.STORAGE_CORRUPT and refused.value.http_status == 503
        assert str(store) in refused.value.message and "ai-memory repair" in refused.value.message
        assert [c.code for c in db.health.conditions()] == [StorageCode.STORAGE_CORRUPT]
        logged = [r for r in caplog.records if r.getMessage() == "storage_corrupt"]
        assert len(logged) == 1
        ev = logged[0].ev  # type: ignore[attr-defined]
        assert ev["path"] == str(store) and "full-text index" in ev["damaged"]
        assert "ai-memory repair" in ev["message"] and "from the mesh" in ev["message"]
    finally:
        await db.close()


async def test_a_read_that_meets_a_damaged_page_is_storage_corrupt_and_sets_the_condition(
        store: Path, caplog: pytest.LogCaptureFixture) -> None:
    damage(store, "memories", pages=2)
    db = await Database.open(store)
    try:
        with caplog.at_level(logging.INFO, logger="storage"), pytest.raises(StorageError) as met:
            await db.read(memories.list_, None, MEMORIES)
        assert met.value.code == StorageCode.STORAGE_CORRUPT and str(store) in met.value.message
        assert StorageCode.STORAGE_CORRUPT in db.health
        assert [r.getMessage() for r in caplog.records] == ["storage_corrupt"]
    finally:
        await db.close()


async def test_a_check_that_finds_the_file_sound_again_clears_the_condition(
        store: Path, caplog: pytest.LogCaptureFixture) -> None:
    sound = await asyncio.to_thread(store.read_bytes)
    pages = damage(store, "memories_ns_created")
    db = await Database.open(store)
    try:
        with caplog.at_level(logging.INFO, logger="storage"):
            assert not (await db.check_integrity()).ok  # type: ignore[union-attr]
            put_back(store, sound, pages)  # as a disk block restored from its mirror would be
            assert (await db.check_integrity()).ok  # type: ignore[union-attr]
            await db.write(memories.insert, make_memory())
        assert db.health.conditions() == []
        assert [r.getMessage() for r in caplog.records] == ["storage_corrupt", "storage_intact"]
    finally:
        await db.close()


async def test_a_store_damaged_where_it_is_opened_refuses_to_open_naming_the_recovery(store: Path) -> None:
    damage(store, "sqlite_master")
    with pytest.raises(StorageError) as refused:
        await Database.open(store)
    assert refused.value.code == StorageCode.STORAGE_CORRUPT
    assert str(store) in refused.value.message and "ai-memory repair" in refused.value.message


def test_sqlite_full_and_corrupt_translate_to_the_stores_conditions(tmp_path: Path, store: Path) -> None:
    conn = sqlite3.connect(tmp_path / "small.db", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("PRAGMA max_page_count = 2")  # SQLite's own SQLITE_FULL at the third page
    with pytest.raises(sqlite3.Error) as full:
        conn.execute("INSERT INTO t VALUES (zeroblob(10000))")
    conn.close()
    damage(store, "memories")
    conn = sqlite3.connect(store)
    with pytest.raises(sqlite3.Error) as corrupt:
        conn.execute("SELECT * FROM memories NOT INDEXED").fetchall()
    conn.close()
    assert translate(full.value).code == StorageCode.STORAGE_FULL
    assert translate(corrupt.value).code == StorageCode.STORAGE_CORRUPT


async def test_the_watch_checks_when_due_and_finds_damage_done_while_the_store_is_open(
        store: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    db = await Database.open(store)
    watch = StoreWatch(db, integrity_every_s=600.0, tick_s=0.01, clock=lambda: now[0])
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.to_thread(damage, store, "memories_fts_data", 2)
        with caplog.at_level(logging.INFO, logger="storage"):
            now[0] = 600.0
            await poll(lambda: _true(watch.checks == 1), "the check that was due")
        assert watch.last is not None and not watch.last.ok
        assert [c.code for c in db.health.conditions()] == [StorageCode.STORAGE_CORRUPT]
        assert [r.getMessage() for r in caplog.records] == ["storage_corrupt"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await db.close()


async def _true(value: bool) -> bool:
    return value


def _replace(path: Path) -> None:
    """Another file at ``path``: a copy put in its place, as a restore over a running node does."""
    copy = path.with_name("other.db")
    copy.write_bytes(path.read_bytes())
    copy.replace(path)


@pytest.mark.parametrize(("fault", "said"), [
    (lambda p: [f.unlink() for f in p.parent.glob(p.name + "*")], "deleted"),
    (lambda p: p.open("r+b").truncate(0), "truncated"),
    (_replace, "replaced"),
])
async def test_a_file_deleted_replaced_or_truncated_under_the_node_stops_its_writes(
        store: Path, fault: Callable[[Path], object], said: str, caplog: pytest.LogCaptureFixture) -> None:
    """The open connections would go on committing into a file no one reads again (acked writes lost): the watch's
    next tick sees the file is not the one opened, and the store refuses writes, not ready, logged once."""
    db = await Database.open(store)
    watch = StoreWatch(db, integrity_every_s=0, tick_s=0.01)
    task = asyncio.create_task(watch.run())
    try:
        await db.write(memories.insert, make_memory())
        with caplog.at_level(logging.INFO, logger="storage"):
            fault(store)
            await poll(lambda: _true(StorageCode.STORAGE_CORRUPT in db.health), "the watch to see the file")
            with pytest.raises(StorageError) as refused:
                await db.write(memories.insert, make_memory())
        assert refused.value.code == StorageCode.STORAGE_CORRUPT and said in refused.value.message
        assert str(store) in refused.value.message
        assert [r.getMessage() for r in caplog.records] == ["storage_corrupt"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await db.close()


async def test_a_sound_file_passes_the_look_each_tick(store: Path) -> None:
    db = await Database.open(store)
    try:
        assert all(db.check_file() for _ in range(3))
        assert db.health.conditions() == []
    finally:
        await db.close()
