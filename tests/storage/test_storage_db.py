"""The concurrency contract: group commit, per-job savepoints, drain on close, durability across reopen."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from pathlib import Path

import pytest
from storage_helpers import make_memory

from storage import Database, StorageError, memories


async def test_200_concurrent_writes_are_all_committed(db: Database):
    rows = [make_memory(content=f"row {i}") for i in range(200)]
    await asyncio.gather(*(db.write(memories.insert, r) for r in rows))
    assert await db.read(memories.count) == 200
    assert set(await db.read(memories.get_many, [r.id for r in rows])) == {r.id for r in rows}


async def test_writes_queued_behind_a_busy_writer_commit_as_one_batch(db: Database):
    gate = threading.Event()
    blocker = asyncio.ensure_future(db.write(lambda conn: gate.wait(5)))
    await asyncio.sleep(0)
    commits_before, _ = db.commit_stats
    queued = [asyncio.ensure_future(db.write(memories.insert, make_memory())) for _ in range(100)]
    await asyncio.sleep(0)  # every write is now in the queue, behind the blocked job
    gate.set()
    await asyncio.gather(blocker, *queued)
    commits_after, _ = db.commit_stats
    # The blocker's own batch, then (at most) one batch holding all 100 queued writes.
    assert commits_after - commits_before <= 2
    assert await db.read(memories.count) == 100


async def test_batch_max_bounds_the_jobs_per_transaction(db_path: Path):
    db = await Database.open(db_path, batch_max=10)
    try:
        gate = threading.Event()
        blocker = asyncio.ensure_future(db.write(lambda conn: gate.wait(5)))
        await asyncio.sleep(0)
        queued = [asyncio.ensure_future(db.write(memories.insert, make_memory())) for _ in range(100)]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(blocker, *queued)
        commits, jobs = db.commit_stats
        assert jobs == 101
        assert commits >= 11
    finally:
        await db.close()


async def test_one_failing_job_does_not_lose_the_others_in_its_batch(db: Database):
    good = [make_memory(content=f"good {i}") for i in range(50)]

    def failing(conn: sqlite3.Connection) -> None:
        memories.insert(conn, make_memory(content="this row must be rolled back"))
        raise ValueError("boom")

    results = await asyncio.gather(
        *(db.write(memories.insert, r) for r in good[:25]),
        db.write(failing),
        *(db.write(memories.insert, r) for r in good[25:]),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    assert await db.read(memories.count) == 50
    assert await db.read(memories.recall, "rolled back") == []


async def test_sql_error_in_a_job_becomes_storage_error_for_that_caller_only(db: Database):
    row = make_memory()
    await db.write(memories.insert, row)
    other = make_memory()
    dup, ok = await asyncio.gather(db.write(memories.insert, row), db.write(memories.insert, other),
                                   return_exceptions=True)
    assert isinstance(dup, StorageError) and dup.code == "duplicate_memory"
    assert ok is None
    assert await db.read(memories.count) == 2

    def bad_sql(conn: sqlite3.Connection) -> None:
        conn.execute("SELECT * FROM no_such_table")

    with pytest.raises(StorageError) as err:
        await db.write(bad_sql)
    assert err.value.code == "sql_error"


async def test_write_returns_the_job_result(db: Database):
    assert await db.write(lambda conn, a, b: a + b, 2, 3) == 5


async def test_reads_are_read_only(db: Database):
    def sneaky(conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM memories")

    with pytest.raises(StorageError) as err:
        await db.read(sneaky)
    assert err.value.code in ("read_only", "sql_error")



@pytest.mark.parametrize("backend", ["sqlite"])  # a SQLite pragma
async def test_readers_map_the_file_and_still_see_every_commit(db: Database):
    from storage.db import READER_MMAP_BYTES

    assert await db.read(lambda conn: conn.execute("PRAGMA mmap_size").fetchone()[0]) == READER_MMAP_BYTES
    first = [make_memory(content=f"first {i}") for i in range(50)]
    await asyncio.gather(*(db.write(memories.insert, r) for r in first))
    assert await db.read(memories.count) == 50
    # ~5 MB more: past the WAL's autocheckpoint (1,000 pages), so the file grows past what was mapped before.
    more = [make_memory(content="more " + "x" * 10_000) for _ in range(500)]
    await asyncio.gather(*(db.write(memories.insert, r) for r in more))
    assert await db.read(memories.count) == 550
    assert set(await db.read(memories.get_many, [r.id for r in more])) == {r.id for r in more}


@pytest.mark.parametrize("backend", ["sqlite"])  # a SQLite pragma
async def test_readers_keep_transient_tables_in_memory_and_recall_through_them(db: Database):
    assert await db.read(lambda conn: conn.execute("PRAGMA temp_store").fetchone()[0]) == 2  # MEMORY
    rows = [make_memory(content=f"common word {'rare' if i % 3 == 0 else 'x'} {i}") for i in range(30)]
    await asyncio.gather(*(db.write(memories.insert, r) for r in rows))
    # "common rare": the window is a materialized table filtering the ranking; it still ranks every match.
    hits = await db.read(memories.recall, "common rare", 20, None, memories.DocFreqs())
    assert {m.id for m, _ in hits} == {r.id for i, r in enumerate(rows) if i % 3 == 0}


async def test_close_drains_pending_writes(db_path: Path):
    db = await Database.open(db_path)
    rows = [make_memory() for _ in range(300)]
    pending = [asyncio.ensure_future(db.write(memories.insert, r)) for r in rows]
    await asyncio.sleep(0)  # let every write enqueue
    await db.close()
    await asyncio.gather(*pending)
    db2 = await Database.open(db_path)
    try:
        assert await db2.read(memories.count) == 300
    finally:
        await db2.close()


async def test_close_is_idempotent_and_refuses_later_writes(db: Database):
    await db.close()
    await db.close()
    with pytest.raises(StorageError) as err:
        await db.write(memories.insert, make_memory())
    assert err.value.code == "closed"
    with pytest.raises(StorageError):
        await db.read(memories.count)


async def test_data_survives_reopen(db_path: Path):
    row = make_memory(title="durable", content="survives a restart", tags=("x", "y"))
    db = await Database.open(db_path)
    await db.write(memories.insert, row)
    await db.close()
    db = await Database.open(db_path)
    try:
        assert await db.read(memories.get, row.id) == row
        assert [m for m, _ in await db.read(memories.recall, "restart")] == [row]
    finally:
        await db.close()


async def test_write_per_commit_commits_each_job(db: Database):
    rows = [make_memory() for _ in range(20)]
    await asyncio.gather(*(db.write_per_commit(memories.insert, r) for r in rows),
                         *(db.write(memories.insert, make_memory()) for _ in range(20)))
    assert await db.read(memories.count) == 40


async def test_failing_per_commit_job_rolls_back_alone(db: Database):
    def failing(conn: sqlite3.Connection) -> None:
        memories.insert(conn, make_memory())
        raise RuntimeError("nope")

    with pytest.raises(RuntimeError):
        await db.write_per_commit(failing)
    assert await db.read(memories.count) == 0


async def test_reads_run_concurrently_on_their_own_threads_and_deliver_errors(db: Database):
    # Two reads meet inside the pool (each waits for the other), so they ran on two threads at once.
    met = threading.Barrier(2, timeout=10)

    def meet(conn: object) -> str:
        met.wait()
        return threading.current_thread().name

    names = await asyncio.gather(db.read(meet), db.read(meet))
    assert len(set(names)) == 2 and all(n.startswith("storage-reader:") for n in names)

    def boom(conn: object) -> None:
        raise KeyError("from the reader")

    with pytest.raises(KeyError, match="from the reader"):
        await db.read(boom)
    assert await db.read(memories.count) == 0  # the threads outlive a job's exception


async def test_a_read_cancelled_before_it_starts_is_skipped_and_close_waits_for_queued_reads(db: Database):
    gate, ran = threading.Event(), []

    def hold(conn: object) -> None:
        gate.wait(10)

    def note(conn: object, tag: str) -> str:
        ran.append(tag)
        return tag

    held = [asyncio.ensure_future(db.read(hold)) for _ in range(2)]  # both reader threads busy
    skipped = asyncio.ensure_future(db.read(note, "cancelled"))
    queued = asyncio.ensure_future(db.read(note, "queued"))
    await asyncio.sleep(0.05)
    skipped.cancel()
    # The executor's job is cancelled by a callback of the cancelled future, one loop turn later: let it run
    # before a reader thread is freed, or that thread may take the job first.
    with contextlib.suppress(asyncio.CancelledError):
        await skipped
    gate.set()
    assert await queued == "queued"
    await asyncio.gather(*held)
    assert ran == ["queued"]
    late = asyncio.ensure_future(db.read(note, "late"))
    await asyncio.sleep(0)
    await db.close()
    assert await late == "late"
