"""The database handle: one writer thread with group commit, a small pool of read-only readers.

Not aiosqlite for the writer: it hops threads once per statement, which would defeat group commit.

Writes: ``await db.write(fn, *args)`` queues a SYNC ``fn(conn, *args)``. The writer thread takes
up to ``batch_max`` queued jobs, opens ONE transaction (BEGIN IMMEDIATE), runs each job inside its
own SAVEPOINT (a job that raises is rolled back alone and only its caller sees the exception),
COMMITs, and only then resolves the callers' futures: a resolved write is durable (WAL,
synchronous=FULL by default: a commit survives an OS crash; NORMAL, when chosen, a process crash only).
Jobs must not BEGIN/COMMIT themselves. A cancelled ``write`` may still commit.

Reads: ``await db.read(fn, *args)`` runs ``fn(conn, *args)`` on a thread of a small pool, each with
its own read-only connection, inside one read transaction (one consistent snapshot per call).

Faults: a write or read that meets a full disk or a damaged page sets ``db.health``'s ``storage_full`` or
``storage_corrupt`` (logged once when it begins) and its caller gets that code, retryable. While the file is
damaged writes are refused before they reach it (writing into a damaged b-tree can spread the damage);
``check_integrity`` runs SQLite's own check and sets or clears ``storage_corrupt``; ``recheck_full`` clears
``storage_full`` once the filesystem has room and a small write commits (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import os
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from storage import integrity, migrations
from storage.errors import StorageCode, StorageError, translate
from storage.health import Health

T = TypeVar("T")
log = logging.getLogger("storage")

# How long a connection waits on a lock held by another process (e.g. the CLI) before 'busy'.
BUSY_TIMEOUT_MS = 5_000
# Reader connections map this much of the database file into memory (PRAGMA mmap_size): a recall reads a few
# hundred scattered rows and FTS5 leaves, and through the default 2 MB page cache each was a read() and a
# copy into the cache; mapped, SQLite reads the OS page cache in place (recall p50 -10% at 100k memories,
# docs/perf-history.md, "Recall at 100k"). Read-only mappings: a reader cannot write through them. Pages still in
# the WAL are read as before.
READER_MMAP_BYTES = 256 * 1024 * 1024
# Reader connections keep SQLite's transient tables (a recall's materialized window, its IN list, its sorter:
# a few hundred rows each) in memory rather than behind a temporary-file pager, which they stay small enough
# to never spill to anyway: recall p50 -5 to -9% at 100k memories, p95 about the same (docs/perf-history.md "Recall
# at 100k"). A reader's larger sorts (none on its paths is unbounded) would take memory, not temp files.
READER_TEMP_STORE = "MEMORY"
# ``bytes_used`` stats the file and its WAL at most this often (seconds): every memory a peer sends asks, and a
# stat here took ~20 us (two per memory were ~11% of a catch-up's CPU per memory); the budget it guards moves by
# at most what is written in that time.
SIZE_FRESH_S = 0.1
# PRAGMA synchronous values by setting name.
SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
# Idle FTS5 merging (``fts_merge_pages``): each write transaction adds a segment to the full-text index and
# FTS5's automerge leaves ~10 of them at 100k memories; every recall walks all of them, and on one segment
# recall measured p50 -8 to -11%, p95 -14 to -22%, same results (docs/perf-history.md, "Recall at 100k"). After
# the writer has had no job for IDLE_MERGE_S it merges, one bounded step (one short transaction) at a time,
# so a write arriving waits for at most one step. A full merge rewrites the whole index, so it starts only
# when the segments other than the largest hold at least MERGE_WHEN_FRACTION of the largest's pages: the
# rewriting then costs at most ~1/fraction pages per page written, not a whole index per trickled write.
IDLE_MERGE_S = 0.2
MERGE_WHEN_FRACTION = 0.125
# Steps one merge may take before it is given up until the next write (a bound, far above any real index).
MAX_MERGE_STEPS = 1_000_000
# An FTS5 data rowid is (segment id << 37) + (dlidx << 36) + (height << 31) + page (fts5_index.c, the file
# format): the pages of each segment, counted from the rowids alone.
_SEGMENT_PAGES_SQL = ("SELECT id >> 37, count(*) FROM memories_fts_data WHERE id >= (1 << 37) "
                      "GROUP BY id >> 37")
# While the disk is full, the store is writable again once its filesystem has this much free (statvfs, for an
# unprivileged writer) and a small write commits (``recheck_full``): room for a few batches' WAL frames.
FULL_CLEAR_FREE_BYTES = 1024 * 1024
# An SQLite file shorter than its header has lost its first page (truncated).
SQLITE_HEADER_BYTES = 100
# The errors that say something about the store as a whole (its condition), not about one write.
_CONDITION_CODES = (StorageCode.STORAGE_FULL, StorageCode.STORAGE_CORRUPT, StorageCode.STORAGE_UNAVAILABLE)


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    per_commit: bool = False
    # Filled by the writer thread; delivered once the batch's fate is known.
    result: Any = None
    error: BaseException | None = field(default=None)


_STOP = object()


class Database:
    """An open attested-mesh database. Create with ``await Database.open(path)``."""

    # How the knowledge-graph walks run on this backend (storage/kg_ops.py).
    kg_backend = "sqlite-cte"

    def __init__(self, path: Path, batch_max: int, readers: int) -> None:
        self._synchronous = "full"
        # Pages of FTS5 merge work per idle step; 0 = no idle merging (see IDLE_MERGE_S).
        self._fts_merge_pages = 0
        # True from when an idle merge starts until a step finds nothing left to merge.
        self._merging = False
        self._steps_this_merge = 0
        # True after a commit, until the next idle check: only writes can give the merge work.
        self._wrote = True
        self._merge_steps = 0
        self._merges_done = 0
        self._merge_s = 0.0
        self._merge_step_max_s = 0.0
        if batch_max < 1 or readers < 1:
            raise ValueError("batch_max and readers must be >= 1")
        self.path = path
        self._wal_path = path.with_name(path.name + "-wal")
        # bytes_used's last answer and when (time.monotonic()).
        self._size = (0, float("-inf"))
        self._batch_max = batch_max
        self._readers_n = readers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._writer_done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._reader_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._reader_conns: list[sqlite3.Connection] = []
        self._reader_local = threading.local()
        self._reader_lock = threading.Lock()
        self._schema_version = 0
        self._commits = 0
        self._committed_jobs = 0
        # time.monotonic() when the writer took up its current batch; None while it waits for work.
        self._batch_started: float | None = None
        self._closed = False
        self._close_task: asyncio.Future[None] | None = None
        # What is wrong with the store now (away, damaged, full): the node's readiness reads it.
        self.health = Health()
        # The file the writer opened (device, inode), so ``check_file`` sees it deleted or replaced underneath.
        self._file_id: tuple[int, int] | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: Path, *, batch_max: int = 512, readers: int = 2,
                   synchronous: str = "full", fts_merge_pages: int = 0) -> Database:
        """Open (creating it and its parent directory if needed) and migrate the database at ``path``.

        ``synchronous`` "full" (default) fsyncs each commit, so a committed write survives an OS crash or
        power loss; "normal" survives a process crash only and commits faster. ``fts_merge_pages`` > 0 merges
        the full-text index's segments while the writer is idle, at most that many pages a step (0: never).

        Raises StorageError not_a_database / foreign_database / schema_too_new, leaving the file unchanged.
        """
        if synchronous not in SYNCHRONOUS:
            raise StorageError(StorageCode.BAD_SETTING,
                               f"synchronous must be one of {sorted(SYNCHRONOUS)}, got {synchronous!r}")
        if fts_merge_pages < 0:
            raise StorageError(StorageCode.BAD_SETTING, f"fts_merge_pages must be >= 0, got {fts_merge_pages!r}")
        db = cls(Path(path), batch_max, readers)
        db._synchronous = synchronous
        db._fts_merge_pages = fts_merge_pages
        db._loop = asyncio.get_running_loop()
        opened: concurrent.futures.Future[int] = concurrent.futures.Future()
        db._writer = threading.Thread(target=db._writer_main, args=(opened,),
                                      name=f"storage-writer:{db.path.name}", daemon=True)
        db._writer.start()
        try:
            db._schema_version = await asyncio.wrap_future(opened)
        except StorageError as e:
            if e.code == StorageCode.STORAGE_CORRUPT:
                raise integrity.corrupt_error(db.path, f"found when opening it: {e.message}") from e
            raise
        db._reader_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=readers, thread_name_prefix=f"storage-reader:{db.path.name}")
        st = os.stat(db.path)
        db._file_id = (st.st_dev, st.st_ino)
        return db

    @property
    def schema_version(self) -> int:
        return self._schema_version

    @property
    def writer_thread_id(self) -> int | None:
        """The writer thread's native id (None before it starts)."""
        return self._writer.native_id if self._writer is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def writer_busy_s(self) -> float:
        """Seconds the writer thread has spent in its current batch (0 while idle); inf once it has died."""
        if self._writer_done.done() and not self._closed:
            return float("inf")
        started = self._batch_started
        return 0.0 if started is None else time.monotonic() - started

    def bytes_used(self) -> int:
        """Bytes the database holds on disk now, as of at most SIZE_FRESH_S ago: the file and its WAL (what
        ``limits.max_db_bytes`` bounds)."""
        size, at = self._size
        now = time.monotonic()
        if now - at >= SIZE_FRESH_S:
            size = _size(self.path) + _size(self._wal_path)
            self._size = (size, now)
        return size

    def _after_commit(self, conn: Any) -> None:
        """Called on the writer thread after each successful COMMIT (a backend's bookkeeping)."""

    @property
    def commit_stats(self) -> tuple[int, int]:
        """(write transactions committed, jobs committed in them) since open: their ratio is the mean batch."""
        return self._commits, self._committed_jobs

    @property
    def merge_stats(self) -> dict[str, Any]:
        """Idle FTS5 merging: the pages per step (0 = off), steps run and full merges finished since open,
        whether one is under way, the writer's seconds in them and its longest step (what a write may wait)."""
        return {"pages_per_step": self._fts_merge_pages, "steps": self._merge_steps,
                "merges": self._merges_done, "merging": self._merging, "seconds": round(self._merge_s, 3),
                "max_step_ms": round(self._merge_step_max_s * 1000, 2)}

    async def close(self) -> None:
        """Drain every queued write, then close all connections. Idempotent."""
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        self._queue.put(_STOP)
        await asyncio.wrap_future(self._writer_done)
        if self._reader_pool is not None:
            await asyncio.to_thread(self._reader_pool.shutdown, True)
        with self._reader_lock:
            for conn in self._reader_conns:
                conn.close()
            self._reader_conns.clear()

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- writes ----------------------------------------------------------------------------

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run sync ``fn(conn, *args)`` on the writer thread inside a group-commit batch; return its result
        once the batch has committed."""
        return await self._submit(fn, args, per_commit=False)

    async def write_per_commit(self, fn: Callable[..., T], *args: Any) -> T:
        """Like ``write`` but in a transaction of its own. For the benchmark's commit-per-row baseline only."""
        return await self._submit(fn, args, per_commit=True)

    async def _submit(self, fn: Callable[..., T], args: tuple[Any, ...], per_commit: bool) -> T:
        if self._closed:
            raise StorageError(StorageCode.CLOSED, "the database is closed; no further writes are accepted")
        if StorageCode.STORAGE_CORRUPT in self.health:
            raise StorageError(StorageCode.STORAGE_CORRUPT, f"writes are refused: {self._corrupt_message()}")
        assert self._loop is not None
        fut: asyncio.Future[T] = self._loop.create_future()
        # The job runs in its caller's context (who a call acts as is a context variable: node/agents/acting.py).
        self._queue.put(_Job(functools.partial(contextvars.copy_context().run, fn), args, fut, per_commit))
        return await fut

    def _writer_main(self, opened: concurrent.futures.Future[int]) -> None:
        try:
            conn = self._open_writer_conn()
        except BaseException as e:  # noqa: BLE001 - delivered to the opener
            opened.set_exception(e)
            self._writer_done.set_result(None)
            return
        opened.set_result(self._stored_schema_version(conn))
        pending: deque[Any] = deque()
        try:
            while True:
                if not pending:
                    pending.append(self._next_job(conn))
                while len(pending) < self._batch_max:
                    try:
                        pending.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                head = pending[0]
                if head is _STOP:
                    break  # close() enqueues _STOP last, so everything before it has run
                self._batch_started = time.monotonic()
                if head.per_commit:
                    self._run_batch(conn, [pending.popleft()])
                else:
                    batch: list[_Job] = []
                    while pending and len(batch) < self._batch_max and pending[0] is not _STOP \
                            and not pending[0].per_commit:
                        batch.append(pending.popleft())
                    self._run_batch(conn, batch)
                self._batch_started = None
        finally:
            try:
                conn.execute("PRAGMA optimize")
            except sqlite3.Error:
                pass  # best effort: statistics only
            conn.close()
            self._writer_done.set_result(None)

    def _next_job(self, conn: sqlite3.Connection) -> Any:
        """The next queued job; while none comes, merge the FTS5 index one bounded step at a time."""
        if self._fts_merge_pages <= 0:
            return self._wait_for_job(conn)
        while True:
            if self._wrote:
                # Writes are (or were just) coming: merge only once none has come for IDLE_MERGE_S.
                try:
                    return self._queue.get(timeout=IDLE_MERGE_S)
                except queue.Empty:
                    self._wrote = False
                if not self._merging:
                    self._merging = self._merge_due(conn)
                    self._steps_this_merge = 0
            elif not self._merging:
                return self._queue.get()
            else:
                try:
                    return self._queue.get_nowait()
                except queue.Empty:
                    pass
            if self._merging:
                self._merge_step(conn)

    def _merge_due(self, conn: sqlite3.Connection) -> bool:
        """Whether the segments besides the largest hold MERGE_WHEN_FRACTION of its pages (worth a rewrite)."""
        try:
            pages = [int(n) for _, n in conn.execute(_SEGMENT_PAGES_SQL)]
        except sqlite3.Error:
            return False  # no FTS5 index here (or unreadable): nothing to merge
        if len(pages) < 2:
            return False
        largest = max(pages)
        return sum(pages) - largest >= largest * MERGE_WHEN_FRACTION

    def _merge_step(self, conn: sqlite3.Connection) -> None:
        """One transaction merging at most ``fts_merge_pages`` pages (a negative N: every segment into one);
        FTS5 changes fewer than 2 rows when it found nothing to merge, which ends the merge."""
        started = self._batch_started = time.monotonic()
        try:
            before = conn.total_changes
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO memories_fts(memories_fts, rank) VALUES('merge', ?)",
                         (-self._fts_merge_pages,))
            conn.execute("COMMIT")
            self._merge_steps += 1
            self._steps_this_merge += 1
            if self._steps_this_merge >= MAX_MERGE_STEPS:
                self._merging = False
            elif conn.total_changes - before < 2:
                self._merging = False
                self._merges_done += 1
        except sqlite3.Error:
            # Best effort (e.g. disk full): the index stays as it was; try again after the next write.
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            self._merging = False
        finally:
            took = time.monotonic() - started
            self._merge_s += took
            self._merge_step_max_s = max(self._merge_step_max_s, took)
            self._batch_started = None

    # The backend seam: storage/pg.py overrides these for Postgres.

    def _wait_for_job(self, conn: Any) -> Any:
        """The next queued job, however long it takes (Postgres meanwhile reconnects after an outage)."""
        return self._queue.get()

    def _open_writer_conn(self) -> sqlite3.Connection:
        return _open_writer(self.path, self._synchronous)

    def _stored_schema_version(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def _open_reader_conn(self) -> sqlite3.Connection:
        return _open_reader(self.path)

    def _run_batch(self, conn: sqlite3.Connection, jobs: list[_Job]) -> None:
        """Run ``jobs`` in one transaction, one savepoint each; deliver results after COMMIT."""
        if not self._begin_batch(conn, jobs):
            return
        done: list[_Job] = []      # jobs whose outcome is final (delivered after this batch)
        uncommitted: list[_Job] = []  # jobs that succeeded inside the open transaction
        for job in jobs:
            if not _open_savepoint(conn, job):
                done.append(job)
                continue
            failure = _run_in_savepoint(conn, job)
            if failure is None:
                uncommitted.append(job)
                continue
            done.append(job)
            if conn.in_transaction:
                _roll_back_savepoint(conn)
            else:
                # SQLite rolled the whole transaction back (e.g. disk full): earlier jobs are gone too.
                done.extend(_lost_with_transaction(uncommitted, job.error or failure))
                uncommitted = []
                _reopen_transaction(conn)
        self._commit_batch(conn, uncommitted)
        self._deliver(done + uncommitted)

    def _begin_batch(self, conn: sqlite3.Connection, jobs: list[_Job]) -> bool:
        """BEGIN IMMEDIATE; when it fails every job gets the error (delivered now) and the batch is off."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            err = translate(e, "starting a write transaction")
            for j in jobs:
                j.error = err
            self._deliver(jobs)
            return False
        return True

    def _commit_batch(self, conn: sqlite3.Connection, uncommitted: list[_Job]) -> None:
        """COMMIT; when it fails, the jobs that had succeeded get 'commit_failed' instead of a result."""
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            err = _commit_error(e)
            for j in uncommitted:
                j.error = err
                j.result = None
        else:
            self._commits += 1
            self._committed_jobs += len(uncommitted)
            self._wrote = True
            self._after_commit(conn)

    def _deliver(self, jobs: list[_Job]) -> None:
        assert self._loop is not None
        for job in jobs:
            if isinstance(job.error, StorageError):
                job.error = self._noted(job.error)
        try:
            self._loop.call_soon_threadsafe(_resolve_all, jobs)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    # ---- reads -----------------------------------------------------------------------------

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run sync ``fn(conn, *args)`` on a read-only connection in a thread pool, in one snapshot."""
        if self._closed or self._reader_pool is None:
            raise StorageError(StorageCode.CLOSED, "the database is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader_pool, contextvars.copy_context().run, self._run_read, fn, args)

    def _run_read(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        conn: sqlite3.Connection | None = getattr(self._reader_local, "conn", None)
        try:
            if conn is None:
                conn = self._open_reader_conn()
                self._reader_local.conn = conn
                with self._reader_lock:
                    self._reader_conns.append(conn)
            conn.execute("BEGIN")
            try:
                return fn(conn, *args)
            finally:
                conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            raise self._noted(translate(e)) from e

    # ---- the store's condition: damaged, full -------------------------------------------

    async def check_integrity(self, *, full: bool = False) -> integrity.Findings | None:
        """SQLite's own check of the file (quick_check; ``full``: integrity_check) on a connection of its own
        beside the readers and the writer: sets storage_corrupt (logged once) when it finds damage, clears it
        when a later check finds none. None where the backend has no such check."""
        job = integrity.FileCheck(self.path, full=full)
        try:
            findings = await asyncio.to_thread(job.run)
        except asyncio.CancelledError:
            job.interrupt()
            raise
        except sqlite3.Error as e:
            raise self._noted(translate(e, f"checking {self.path}")) from e
        if findings.ok:
            self._clear(StorageCode.STORAGE_CORRUPT, "storage_intact")
        else:
            self._damaged(findings.summary(), findings.messages)
        return findings

    def check_file(self) -> bool:
        """Whether the file the node opened is still the one at its path, whole: deleted, replaced or truncated
        under the running node (the open connections would go on writing into a file nobody will read again),
        it sets storage_corrupt, which refuses writes and makes the node not ready. A cheap stat, each tick."""
        if self._file_id is None or StorageCode.STORAGE_CORRUPT in self.health:
            return StorageCode.STORAGE_CORRUPT not in self.health
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            what = "the file was deleted under the running node"
        except OSError as e:
            what = f"the file cannot be looked at ({e.strerror})"
        else:
            if (st.st_dev, st.st_ino) != self._file_id:
                what = "the file was replaced under the running node (another file is at its path now)"
            elif st.st_size < SQLITE_HEADER_BYTES:
                what = f"the file was truncated under the running node ({st.st_size} bytes)"
            else:
                return True
        self._damaged(f"{what}; writes since then would be lost", ())
        return False

    async def recheck_full(self) -> bool:
        """While storage_full is in force: clear it (logged once) when the file's filesystem has room again and a
        small write commits. Returns whether it is still in force."""
        if StorageCode.STORAGE_FULL not in self.health:
            return False
        if not self._has_room():
            return True
        try:
            await self.write(_probe_write)
        except StorageError:
            return StorageCode.STORAGE_FULL in self.health
        self._clear(StorageCode.STORAGE_FULL, "storage_space_available")
        return False

    def _has_room(self) -> bool:
        """Whether the file's filesystem has FULL_CLEAR_FREE_BYTES free for an unprivileged writer."""
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return True  # nothing to measure: the probe write decides
        return st.f_bavail * st.f_frsize >= FULL_CLEAR_FREE_BYTES

    def _noted(self, err: StorageError) -> StorageError:
        """``err`` as the store's condition: a full disk or a damaged page sets it (logged once when it begins)
        and the caller gets an error naming the file and what to do; any other error is returned as it is."""
        if err.code == StorageCode.IO_ERROR and not self._has_room():
            # ENOSPC can surface as an I/O error (the -shm file growing, an fsync): the disk is what is full.
            err = StorageError(StorageCode.STORAGE_FULL, err.message)
        if err.code == StorageCode.STORAGE_FULL:
            message = self._full_message()
            self._set(StorageCode.STORAGE_FULL, message, "storage_full", {"error": err.message})
            return StorageError(StorageCode.STORAGE_FULL, f"{err.message}: {message}")
        if err.code == StorageCode.STORAGE_CORRUPT:
            if StorageCode.STORAGE_CORRUPT not in self.health:  # a check's naming of the damage says more
                self._damaged(f"met by a read or write: {err.message}", ())
            return StorageError(StorageCode.STORAGE_CORRUPT, self._corrupt_message())
        return err

    def _full_message(self) -> str:
        """The storage_full condition's sentence: where space ran out and what to do (a backend's own words)."""
        return (f"no space left for {self.path} on its filesystem: writes are refused until space is freed there "
                "(nothing stored is lost; clients may retry)")

    def _damaged(self, what: str, messages: tuple[str, ...]) -> None:
        self._set(StorageCode.STORAGE_CORRUPT, integrity.corrupt_error(self.path, what).message, "storage_corrupt",
                  {"damaged": what, "sqlite": list(messages[:3])})

    def _corrupt_message(self) -> str:
        """The storage_corrupt condition's sentence (what was found first, and the recovery)."""
        held = next((c for c in self.health.conditions() if c.code == StorageCode.STORAGE_CORRUPT), None)
        return held.message if held is not None else integrity.corrupt_error(self.path, "found earlier").message

    def _set(self, code: StorageCode, message: str, event: str, fields: dict[str, Any]) -> None:
        if self.health.set(code, message):
            log.error(event, extra={"ev": {"path": str(self.path), "message": message, **fields}})

    def _clear(self, code: StorageCode, event: str) -> None:
        ended = self.health.clear(code)
        if ended is not None:
            log.warning(event, extra={"state_change": True, "ev": {
                "path": str(self.path), "after_s": round(time.monotonic() - ended.since, 3)}})


def _size(path: Path) -> int:
    """A file's size, 0 when it does not exist (one stat: every memory_store asks, on the event loop)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _probe_write(conn: Any) -> None:
    """A small write that leaves nothing behind (a row into ``counters`` and out): its pages still reach the disk."""
    conn.execute("INSERT INTO counters (name, value) VALUES ('storage_probe', 0)")
    conn.execute("DELETE FROM counters WHERE name = 'storage_probe'")


def _commit_error(e: sqlite3.Error) -> StorageError:
    """A failed COMMIT: the store's condition where it names one (full, damaged, an I/O error), else
    commit_failed."""
    err = translate(e, "committing a write batch")
    if err.code in (*_CONDITION_CODES, StorageCode.IO_ERROR):
        return err
    return StorageError(StorageCode.COMMIT_FAILED, f"the batch could not be committed: {e}")


def _open_savepoint(conn: sqlite3.Connection, job: _Job) -> bool:
    try:
        conn.execute("SAVEPOINT job")
    except sqlite3.Error as e:
        job.error = translate(e, "opening a savepoint")
        return False
    return True


def _run_in_savepoint(conn: sqlite3.Connection, job: _Job) -> BaseException | None:
    """Run the job and release its savepoint; on failure the job holds the error and it is returned."""
    try:
        job.result = job.fn(conn, *job.args)
        conn.execute("RELEASE job")
    except BaseException as e:  # noqa: BLE001 - delivered to this job's caller only
        job.error = translate(e) if isinstance(e, sqlite3.Error) else e
        return e
    return None


def _roll_back_savepoint(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK TO job")
        conn.execute("RELEASE job")
    except sqlite3.Error:
        pass  # the transaction state is re-checked at COMMIT


def _lost_with_transaction(uncommitted: list[_Job], cause: BaseException) -> list[_Job]:
    """Mark jobs that had succeeded in a transaction SQLite has since rolled back; returns them. A cause that is
    the store's condition (the disk full) is theirs too: they were not stored for the same reason."""
    code = cause.code if isinstance(cause, StorageError) and cause.code in _CONDITION_CODES \
        else StorageCode.TRANSACTION_ABORTED
    for lost in uncommitted:
        lost.error = StorageError(code, f"the batch transaction was rolled back by a later job's error: {cause}")
    return uncommitted


def _reopen_transaction(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error:
        pass  # later jobs then fail on their savepoint, each with its own error


def _resolve_all(jobs: list[_Job]) -> None:
    for job in jobs:
        if job.future.cancelled():
            continue
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.result)


def _open_writer(path: Path, synchronous: str = "full") -> sqlite3.Connection:
    """Guard the file (read-only), then open it read-write, set the pragmas and migrate."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    migrations.guard(path)
    _owner_only(path)
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as e:
        raise translate(e, f"opening {path}") from e
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StorageError(StorageCode.SQL_ERROR, f"could not switch {path} to WAL (journal_mode is {mode})")
        conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[synchronous]}")
        conn.execute("PRAGMA foreign_keys = ON")
        migrations.migrate(conn)
        return conn
    except sqlite3.Error as e:
        conn.close()
        raise translate(e, f"preparing {path}") from e
    except BaseException:
        conn.close()
        raise


def _owner_only(path: Path) -> None:
    """The database holds every memory: create it 0600 (SQLite gives its -wal and -shm the same mode), and
    take group and other access away from files an older version left readable."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if p.stat().st_mode & 0o077:
                p.chmod(0o600)
        except FileNotFoundError:
            continue
        except PermissionError as e:
            raise StorageError(StorageCode.FILE_MODE,
                               f"{p} is readable by others and cannot be made 0600: {e}") from None


def _open_reader(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                           isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
    conn.execute("PRAGMA query_only = ON")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(f"PRAGMA mmap_size = {READER_MMAP_BYTES:d}")
    conn.execute(f"PRAGMA temp_store = {READER_TEMP_STORE}")
    return conn
