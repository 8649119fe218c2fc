"""The Postgres backend: the same Database (group-commit writer thread, read pool) over psycopg 3.

The table modules are written once, for both engines: ``PgConn`` takes their ``?`` statements, turns
the placeholders into psycopg's, maps the few SQLite-only statements the writer issues (BEGIN
IMMEDIATE, SAVEPOINT release/rollback, PRAGMA), and raises psycopg's errors as the DB-API errors the
modules already handle (a unique violation reads ``UNIQUE constraint failed: table.column``, as in
SQLite), so ``storage.errors.translate`` gives them the same codes.

Schema: the numbered migrations of storage/migrations.py, translated statement by statement
(``pg_statements``): types (INTEGER -> BIGINT, BLOB -> BYTEA, REAL -> DOUBLE PRECISION), integer
primary keys to sequences, FTS5 to a weighted tsvector column with a GIN index, SQLite triggers to
plpgsql ones, ``ALTER TABLE ... ADD COLUMN`` to ``... ADD COLUMN IF NOT EXISTS``. The version lives in
``am_schema``; a database written by a newer schema, or one holding tables of another application, is
refused unchanged. Writers from several processes serialize on one advisory lock per transaction (what
BEGIN IMMEDIATE does for SQLite), so the signed_events chain never forks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
from psycopg import conninfo, pq
from psycopg_pool import ConnectionPool, PoolTimeout

from storage import migrations
from storage.db import Database
from storage.errors import EngineError, StorageCode, StorageError, translate
from storage.migrations import MAX_SUPPORTED_SCHEMA, Migration
from storage.pglink import (
    COMMITS_TABLE,
    IDLE_CHECK_S,
    IN_DOUBT_WAIT_S,
    LOCK_AND_MARK,
    MARKER_KEEP,
    Outage,
    Reconnect,
    batch_committed,
    engine_error,
    is_lost,
    one_line,
    redact,
    scrub,
)

# Arbitrary but fixed: the advisory lock every write transaction takes ('AMSH').
WRITE_LOCK_KEY = 0x414D5348
# Bound on connecting to the server; a DSN that does not answer is a clear error, not a hang.
CONNECT_TIMEOUT_S = 10
# Added to every connection where the DSN does not say otherwise (``connect_kwargs``): keepalive probes after
# 10 s idle, every 5 s, 3 missed end the connection; unacknowledged sends end it after 30 s.
_CONNECT_DEFAULTS = {"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 10,
                     "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 30_000}
# How stale the database size behind limits.max_db_bytes may be (it costs one query on the writer).
SIZE_EVERY_S = 1.0
# A read waits for a connection in slices of READ_WAIT_AWAY_S, up to CONNECT_TIMEOUT_S; once an outage is known,
# only READ_WAIT_KNOWN_AWAY_S (a connection the pool has made back is taken at once): a client hears
# storage_unavailable at once, and a flood of reads (a peer's messages applied meanwhile) does not queue on the
# readers half a second each, holding up every other read; the reader pool gives up a failing reconnect after
# POOL_RECONNECT_S (the next read asks again).
READ_WAIT_AWAY_S = 0.5
READ_WAIT_KNOWN_AWAY_S = 0.02
POOL_RECONNECT_S = 2.0

log = logging.getLogger("storage.pg")
# psycopg_pool logs each failed reconnect of the readers; our storage_unavailable / storage_available lines say
# it once per outage.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
# Tables of ours besides the migrations' (the schema version).
_META = "am_schema"


class PgCursor:
    """The slice of the sqlite3 cursor the table modules use."""

    def __init__(self, cur: psycopg.Cursor[Any] | None, conn: PgConn) -> None:
        self._cur = cur
        self._conn = conn

    def fetchone(self) -> Any:
        return self._cur.fetchone() if self._cur is not None and self._cur.description else None

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall() if self._cur is not None and self._cur.description else []

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount if self._cur is not None else -1

    @property
    def lastrowid(self) -> int | None:
        # Every integer key is filled from its sequence, so the session's last value is the new row's key.
        r = self._conn.execute("SELECT lastval()").fetchone()
        return int(r[0]) if r else None


@functools.lru_cache(maxsize=1024)
def _to_psycopg(sql: str) -> str:
    """``?`` placeholders to ``%s`` (literal ``%`` doubled); SQLite's bare ``WHERE 1`` to ``WHERE true``."""
    sql = re.sub(r"\bWHERE 1(?=\s*$|\s*\))", "WHERE true", sql)
    return sql.replace("%", "%%").replace("?", "%s")


_WRITER_STATEMENTS = {
    "RELEASE job": "RELEASE SAVEPOINT job",
    "ROLLBACK TO job": "ROLLBACK TO SAVEPOINT job",
}


class PgConn:
    """A psycopg connection (autocommit; transactions are explicit) that runs the modules' statements.

    The writer's (``reconnect`` given) outlives its connection: a write transaction that finds the connection
    lost opens a new one first (storage/pglink.py: at most one attempt per backoff delay while the server is
    away), and each transaction records the batch's marker. A COMMIT whose answer was lost leaves its batch in ``doubt``
    until a connection works again: the marker then says whether it was stored, and ``settled(batch, committed)``
    is told."""

    dialect = "postgres"

    def __init__(self, raw: psycopg.Connection[Any], *, readonly: bool = False, dsn: str = "",
                 reconnect: Reconnect | None = None, settled: Callable[[int, bool], None] | None = None) -> None:
        self.raw = raw
        self.readonly = readonly
        self.dsn = dsn
        self.reconnect = reconnect
        self.settled = settled
        # The writer's batch in its transaction now (its marker's number), and the batch whose COMMIT lost its
        # answer, until settled.
        self.batch = 0
        self.doubt: int | None = None
        # Run inside each write transaction just before COMMIT (keeps the AGE graph in step).
        self.before_commit: Callable[[PgConn], object] | None = None

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != pq.TransactionStatus.IDLE

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> PgCursor:
        head = sql.lstrip()[:16].upper()
        try:
            if head.startswith("PRAGMA"):
                return PgCursor(None, self)  # SQLite tuning: nothing to do here
            if sql == "BEGIN IMMEDIATE":
                self._begin_write()
                return PgCursor(None, self)
            if sql == "BEGIN" and self.readonly:
                # One consistent snapshot per read, as a SQLite read transaction gives.
                return PgCursor(self.raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"), self)
            if sql == "COMMIT" and self.before_commit is not None and self.in_transaction:
                self.before_commit(self)
            if sql == "COMMIT" and self.reconnect is not None:
                self._commit_write()
                return PgCursor(None, self)
            sql = _WRITER_STATEMENTS.get(sql, sql)
            return PgCursor(self.raw.execute(_to_psycopg(sql), tuple(parameters)), self)
        except psycopg.Error as e:
            raise as_dbapi_error(e, self.raw, self.dsn, writing=not self.readonly) from e

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /) -> None:
        """One statement for each parameter row, in order (the table modules' INSERTs of a batch)."""
        try:
            with self.raw.cursor() as cur:
                cur.executemany(_to_psycopg(sql), [tuple(p) for p in seq_of_parameters])
        except psycopg.Error as e:
            raise as_dbapi_error(e, self.raw, self.dsn, writing=not self.readonly) from e

    def _begin_write(self) -> None:
        """BEGIN, the write lock and (the writer's) the batch's marker. The writer's connection found lost here (it
        died while idle, or in an earlier batch) is opened again, once: nothing of this batch has run yet."""
        if self.reconnect is not None and self.raw.closed:
            self._reopen(self.reconnect)
        try:
            self._begin_locked()
        except psycopg.Error as e:
            if self.reconnect is None or not is_lost(e, self.raw, writing=True):
                raise
            self.raw.close()
            self._reopen(self.reconnect)
            self._begin_locked()

    def _begin_locked(self) -> None:
        self.raw.execute("BEGIN")
        if self.reconnect is None:
            self.raw.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
            return
        self.settle()  # first: this transaction's marker would stand for the batch in doubt too
        # The lock and the marker in one statement (prepared after a few batches): no round trip of its own.
        self.batch = self.reconnect.next_batch()
        self.raw.execute(LOCK_AND_MARK, (self.reconnect.writer, self.batch, WRITE_LOCK_KEY))

    def _reopen(self, reconnect: Reconnect) -> None:
        if not reconnect.due():
            raise reconnect.outage.unavailable("this write (not stored)")
        self.raw = reconnect.open()

    def _commit_write(self) -> None:
        """COMMIT (the batch's marker went in at BEGIN). A COMMIT whose answer is lost leaves the batch in
        ``doubt``, settled by its marker at the next connection that works (``settle``)."""
        if self.raw.closed:
            raise EngineError(StorageCode.STORAGE_UNAVAILABLE, f"postgres at {redact(self.dsn)} went away before "
                                                               "this batch was committed; nothing of it was stored")
        try:
            self.raw.execute("COMMIT", ())
        except psycopg.Error as e:
            if not is_lost(e, self.raw, writing=True):
                raise
            self.raw.close()
            self.doubt = self.batch
            raise EngineError(StorageCode.STORAGE_UNAVAILABLE,
                              f"postgres at {redact(self.dsn)} went away during this batch's COMMIT; whether it "
                              "was stored is known once the server answers again") from None

    def settle(self) -> None:
        """The batch in ``doubt`` settled by its marker on this (working) connection, and ``settled`` told."""
        if self.doubt is None or self.reconnect is None:
            return
        committed = batch_committed(self.raw, self.reconnect.writer, self.doubt)
        batch, self.doubt = self.doubt, None
        log.warning("commit_in_doubt_settled", extra={"ev": {"batch": batch, "committed": committed}})
        if self.settled is not None:
            self.settled(batch, committed)

    def close(self) -> None:
        self.raw.close()


def as_dbapi_error(e: psycopg.Error, raw: psycopg.Connection[Any] | None = None, dsn: str = "", *,
                   writing: bool = False) -> sqlite3.Error:
    """psycopg's error as the sqlite3 error the table modules handle (same wording where they match on it); the
    server away or its disk full as an EngineError carrying storage_unavailable / storage_full."""
    engine = engine_error(e, raw, dsn, writing=writing)
    if engine is not None:
        return engine
    if isinstance(e, psycopg.errors.UniqueViolation):
        m = re.search(r"Key \((.*?)\)=", e.diag.message_detail or "")
        cols = m.group(1) if m else "?"
        return sqlite3.IntegrityError(f"UNIQUE constraint failed: {e.diag.table_name}.{cols}")
    if isinstance(e, (psycopg.errors.IntegrityError, psycopg.errors.RaiseException)):
        return sqlite3.IntegrityError(e.diag.message_primary or str(e))
    return sqlite3.OperationalError(f"postgres: {scrub(e.diag.message_primary or str(e), dsn)}")


def connect(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """Open a connection to ``dsn``; StorageError('storage_unavailable') naming the DSN (its password redacted)
    when it fails (retryable: the server may be starting, restarting or failing over)."""
    try:
        return psycopg.connect(dsn, autocommit=autocommit, **connect_kwargs(dsn))
    except psycopg.Error as e:
        raise StorageError(StorageCode.STORAGE_UNAVAILABLE,
                           f"cannot connect to postgres at {redact(dsn)}: {scrub(one_line(e), dsn)}") from None


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """The connection parameters we add where ``dsn`` does not set them: a bounded connect, and TCP keepalives
    and a send timeout, so a server host that vanishes (a failover) breaks its connections in seconds, not at the
    kernel's TCP timeout."""
    try:
        given = conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        given = {}
    return {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in given}


# ---- schema ---------------------------------------------------------------------------------

_FUNCTIONS = (
    """CREATE OR REPLACE FUNCTION am_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$""",
    # An explicit NULL key (as SQLite's INTEGER PRIMARY KEY takes it) gets the next value of the sequence.
    """CREATE OR REPLACE FUNCTION am_fill_serial() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF to_jsonb(NEW) -> TG_ARGV[0] = 'null'::jsonb THEN
            NEW := jsonb_populate_record(NEW, jsonb_build_object(TG_ARGV[0], nextval(TG_ARGV[1])));
        END IF;
        RETURN NEW;
    END $$""",
    f"CREATE TABLE IF NOT EXISTS {_META} (version BIGINT NOT NULL)",
    # Each writer's last committed batch (storage/pglink.py): how a COMMIT whose answer was lost is settled.
    f"CREATE TABLE IF NOT EXISTS {COMMITS_TABLE} (writer TEXT PRIMARY KEY, batch BIGINT NOT NULL, "
    "at TIMESTAMPTZ NOT NULL)",
)

_FTS = (
    # Title weighs most, then tags, then content (ts_rank weights in recall: D, C, B, A).
    """ALTER TABLE memories ADD COLUMN IF NOT EXISTS fts tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('simple', title), 'A') || setweight(to_tsvector('simple', tags), 'B')
        || setweight(to_tsvector('simple', content), 'C')) STORED""",
    "CREATE INDEX IF NOT EXISTS memories_fts_gin ON memories USING gin (fts)",
)

_SERIAL_PK = re.compile(r"\b(\w+) INTEGER PRIMARY KEY(?: AUTOINCREMENT)?")
_CREATE_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)")
_TRIGGER = re.compile(r"CREATE TRIGGER IF NOT EXISTS (\w+) BEFORE (UPDATE|DELETE) ON (\w+)", re.S)
_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (?!IF NOT EXISTS)", re.I)


def _types(sql: str) -> str:
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    sql = re.sub(r"\bBLOB\b", "BYTEA", sql)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)


def pg_statements(migration: Migration) -> list[str]:
    """The Postgres form of one SQLite migration, every statement safe to repeat."""
    out: list[str] = []
    for sql in migration.statements:
        s = sql.strip()
        if s.startswith("PRAGMA") or s.startswith("INSERT INTO memories_fts"):
            continue
        if "USING fts5" in s:
            out.extend(_FTS)
            continue
        trig = _TRIGGER.match(s)
        if trig is not None:
            name, event, table = trig.groups()
            if "append-only" in s:
                out.append(f"CREATE OR REPLACE TRIGGER {name} BEFORE {event} ON {table} "
                           "FOR EACH ROW EXECUTE FUNCTION am_append_only()")
                out.append(f"CREATE OR REPLACE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                           "FOR EACH STATEMENT EXECUTE FUNCTION am_append_only()")
            continue
        if s.startswith("CREATE TRIGGER"):
            continue  # the FTS5 triggers: the tsvector column is generated instead
        table = _CREATE_TABLE.match(s)
        if table is not None:
            name = table.group(1)
            pk = _SERIAL_PK.search(s)
            out.append(_types(_SERIAL_PK.sub(r"\1 BIGSERIAL PRIMARY KEY", s)))
            if pk is not None:
                col = pk.group(1)
                out.append(f"CREATE OR REPLACE TRIGGER {name}_{col}_fill BEFORE INSERT ON {name} "
                           f"FOR EACH ROW EXECUTE FUNCTION am_fill_serial('{col}', '{name}_{col}_seq')")
            else:
                # Insertion order, which the modules read as SQLite's rowid.
                out.append(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS rowid BIGSERIAL")
                out.append(f"CREATE UNIQUE INDEX IF NOT EXISTS {name}_rowid ON {name} (rowid)")
            continue
        out.append(_types(_ADD_COLUMN.sub(r"ALTER TABLE \1 ADD COLUMN IF NOT EXISTS ", s)))
    return out + list(migration.postgres)


def _stored_version(raw: psycopg.Connection[Any]) -> int | None:
    if raw.execute("SELECT to_regclass(%s)", (_META,)).fetchone() == (None,):
        return None
    r = raw.execute(f"SELECT max(version) FROM {_META}").fetchone()
    return int(r[0]) if r and r[0] is not None else 0


def guard(raw: psycopg.Connection[Any], dsn: str) -> None:
    """Refuse, changing nothing, a database of a newer schema or of another application."""
    version = _stored_version(raw)
    if version is not None and version > MAX_SUPPORTED_SCHEMA:
        raise StorageError(StorageCode.SCHEMA_TOO_NEW,
                           f"the database at {redact(dsn)} was written by schema {version}, this build supports up to "
                           f"{MAX_SUPPORTED_SCHEMA}; upgrade attested-mesh to open it (left unchanged)")
    if version is None:
        names = [r[0] for r in raw.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1").fetchall()]
        if names:
            raise StorageError(StorageCode.FOREIGN_DATABASE,
                               f"the database at {redact(dsn)} holds tables of another application "
                               f"({', '.join(names[:5])}); left unchanged")


def migrate(conn: PgConn) -> int:
    """Bring the database up to MAX_SUPPORTED_SCHEMA, one transaction per migration; returns the version."""
    raw = conn.raw
    for m in migrations.MIGRATIONS:
        with raw.transaction():
            raw.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
            for sql in _FUNCTIONS:
                raw.execute(sql)
            current = _stored_version(raw) or 0
            if current > MAX_SUPPORTED_SCHEMA:
                raise StorageError(StorageCode.SCHEMA_TOO_NEW,
                                   f"schema {current} appeared while migrating; left unchanged")
            if current >= m.version:
                continue
            for sql in pg_statements(m):
                raw.execute(sql)
            raw.execute(f"DELETE FROM {_META}")
            raw.execute(f"INSERT INTO {_META} (version) VALUES (%s)", (m.version,))
    return _stored_version(raw) or 0


def age_installed(raw: psycopg.Connection[Any]) -> bool:
    return raw.execute("SELECT 1 FROM pg_extension WHERE extname = 'age'").fetchone() is not None


# ---- the database ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Held:
    """The batch whose COMMIT lost its answer: its jobs and their results, held until ``until`` (monotonic)."""

    batch: int
    jobs: list[Any]
    results: list[Any]
    until: float


class PgDatabase(Database):
    """Database over Postgres: the same writer loop and group commit, psycopg connections underneath. It outlives
    the server going away (storage/pglink.py): writes and reads meanwhile fail with storage_unavailable at once,
    ``health`` holds the outage, and the writer reconnects on its own (following a failover where the DSN names
    several hosts with ``target_session_attrs=read-write``)."""

    def __init__(self, dsn: str, batch_max: int, readers: int) -> None:
        super().__init__(Path("postgres"), batch_max, readers)
        self.dsn = dsn
        self.kg_backend = "postgres-cte"
        self._age_mode = "off"
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._outage = Outage(self.health, dsn)
        # The jobs of the batch whose COMMIT lost its answer: not answered until its marker says (writer thread).
        self._held: _Held | None = None
        # pg_database_size, measured by the writer at open and at most every SIZE_EVERY_S after a commit.
        self._bytes = 0
        self._bytes_at = 0.0

    @classmethod
    async def open_pg(cls, dsn: str, *, batch_max: int = 512, readers: int = 2, age: str = "off") -> PgDatabase:
        """Connect, guard, migrate; then choose the graph walks: AGE when ``age`` is "on" (required) or
        "auto" (when installed), else recursive CTEs. Raises StorageError storage_unavailable / schema_too_new /
        foreign_database / age_unavailable."""
        db = cls(dsn, batch_max, readers)
        db._age_mode = age
        db._loop = asyncio.get_running_loop()
        opened: concurrent.futures.Future[int] = concurrent.futures.Future()
        db._writer = threading.Thread(target=db._writer_main, args=(opened,), name="storage-writer:postgres",
                                      daemon=True)
        db._writer.start()
        db._schema_version = await asyncio.wrap_future(opened)
        try:
            # Each reader thread holds at most one connection (max_size = readers), so a reader waiting for one
            # means the server cannot be reached. A connection is checked when handed out; the pool gives up on
            # a failing reconnect after POOL_RECONNECT_S, and a later read asks for a fresh one at once.
            db._pool = ConnectionPool(dsn, min_size=1, max_size=readers, open=False, name="storage-readers",
                                      kwargs={"autocommit": True, **connect_kwargs(dsn)},
                                      configure=db._configure_reader, check=ConnectionPool.check_connection,
                                      reconnect_timeout=POOL_RECONNECT_S)
            await asyncio.to_thread(db._pool.open, True, CONNECT_TIMEOUT_S)
        except BaseException as e:
            await db.close()
            if is_lost(e):
                raise StorageError(StorageCode.STORAGE_UNAVAILABLE,
                                   f"cannot connect to postgres at {redact(dsn)} for reading: {scrub(one_line(e), dsn)}"
                                   ) from None
            raise
        db._reader_pool = concurrent.futures.ThreadPoolExecutor(max_workers=readers,
                                                                thread_name_prefix="storage-reader:postgres")
        return db

    def _configure_reader(self, raw: psycopg.Connection[Any]) -> None:
        if self.kg_backend == "postgres-age":
            from storage import age
            age.prepare_session(raw)

    def _open_writer_conn(self) -> Any:
        raw = connect(self.dsn)
        try:
            guard(raw, self.dsn)
            conn = PgConn(raw, dsn=self.dsn, reconnect=Reconnect(self._reopen_writer, self._outage),
                          settled=self._settled)
            migrate(conn)
            self._choose_kg_backend(conn)
            raw.execute(f"DELETE FROM {COMMITS_TABLE} WHERE at < now() - interval '{MARKER_KEEP}'")
            return conn
        except psycopg.Error as e:
            raw.close()
            raise StorageError(StorageCode.SQL_ERROR,
                               f"preparing the postgres schema: {scrub(str(e), self.dsn)}") from None
        except BaseException:
            raw.close()
            raise

    def _reopen_writer(self) -> psycopg.Connection[Any]:
        """The writer's connection again after an outage: the same database checks, the session prepared (its
        errors as psycopg raises them: the outage names the cause, once)."""
        raw = psycopg.connect(self.dsn, autocommit=True, **connect_kwargs(self.dsn))
        try:
            guard(raw, self.dsn)
            if self.kg_backend == "postgres-age":
                from storage import age
                age.prepare_session(raw)
            if self._pool is not None:
                self._pool.check()  # the readers' idle connections died with the writer's: replace them now
            return raw
        except BaseException:
            raw.close()
            raise

    def _wait_for_job(self, conn: Any) -> Any:
        """The next queued job. While none comes the writer looks at its connection every IDLE_CHECK_S (one empty
        query) and, while it is lost, tries a new one at the backoff's pace: an outage is found, and ends (a
        batch in doubt settled), without waiting for a write."""
        while True:
            self._give_up_held(time.monotonic())
            wait_s = conn.reconnect.wait_s() if conn.raw.closed else IDLE_CHECK_S
            if self._held is not None:
                wait_s = min(wait_s, max(0.0, self._held.until - time.monotonic()))
            try:
                return self._queue.get(timeout=wait_s)
            except queue.Empty:
                self._probe(conn)

    def _probe(self, conn: PgConn) -> None:
        if conn.raw.closed and conn.reconnect is not None and conn.reconnect.due():
            try:
                conn.raw = conn.reconnect.open()
            except EngineError:
                return  # the outage goes on (logged once when it began)
        if conn.raw.closed:
            return
        try:
            conn.raw.execute("")
            conn.settle()
        except psycopg.Error:
            conn.raw.close()  # gone while idle: a new one at the next probe
        else:
            self._outage.end()  # (a reader's outage) this connection answers

    # ---- a COMMIT whose answer was lost: its callers wait for the marker (storage/pglink.py) --------------

    def _commit_batch(self, conn: Any, uncommitted: list[Any]) -> None:
        results = [job.result for job in uncommitted]
        super()._commit_batch(conn, uncommitted)
        if conn.doubt is not None and uncommitted:
            self._held = _Held(conn.doubt, uncommitted, results, time.monotonic() + IN_DOUBT_WAIT_S)

    def _deliver(self, jobs: list[Any]) -> None:
        held = self._held
        super()._deliver(jobs if held is None else [job for job in jobs if job not in held.jobs])

    def _settled(self, batch: int, committed: bool) -> None:
        """The marker's word on the batch in doubt: its callers get their results, or storage_unavailable."""
        held = self._held
        if held is None or held.batch != batch:
            return  # its callers were already told it is not known
        self._held = None
        for job, result in zip(held.jobs, held.results, strict=True):
            job.result, job.error = (result, None) if committed else (None, StorageError(
                StorageCode.STORAGE_UNAVAILABLE, f"postgres at {redact(self.dsn)} went away during this write's "
                                                 "COMMIT, which was not stored; retry"))
        if committed:
            self._commits += 1
            self._committed_jobs += len(held.jobs)
        self._deliver(held.jobs)

    def _give_up_held(self, now: float) -> None:
        """Past IN_DOUBT_WAIT_S the held callers are told that it is not known (the marker still logs the truth)."""
        held = self._held
        if held is None or now < held.until:
            return
        self._held = None
        log.error("commit_in_doubt", extra={"ev": {"batch": held.batch, "waited_s": IN_DOUBT_WAIT_S}})
        for job in held.jobs:
            job.result, job.error = None, StorageError(StorageCode.STORAGE_UNAVAILABLE, (
                f"postgres at {redact(self.dsn)} went away during this write's COMMIT and did not answer within "
                f"{IN_DOUBT_WAIT_S:g} s: whether it was stored is not known"))
        self._deliver(held.jobs)

    def _choose_kg_backend(self, conn: PgConn) -> None:
        """AGE when asked for ("on": required, "auto": if installed); keep its graph in step from here on."""
        if self._age_mode == "off":
            return
        if not age_installed(conn.raw):
            if self._age_mode == "on":
                raise StorageError(StorageCode.AGE_UNAVAILABLE,
                                   "storage.age is \"on\" but the database has no 'age' "
                                   "extension (CREATE EXTENSION age; build it from the AGE source)")
            return
        from storage import age
        problem = age.access_problem(conn.raw)
        if problem is not None:
            if self._age_mode == "on":
                raise StorageError(StorageCode.AGE_UNAVAILABLE, f"storage.age is \"on\" but {problem} "
                                   "(docs/operations.md, \"Apache AGE with the node's role\")")
            log.warning("age_not_usable", extra={"ev": {
                "reason": problem, "effect": "knowledge-graph walks use recursive CTEs (storage.age = \"auto\")",
                "fix": "docs/operations.md, \"Apache AGE with the node's role\""}})
            return
        age.setup(conn)
        conn.before_commit = age.sync
        self.kg_backend = "postgres-age"

    async def check_integrity(self, *, full: bool = False) -> None:
        """None: the server checks its own pages (data checksums, amcheck); SQLite's file check has no part here."""
        return None

    def _has_room(self) -> bool:
        return True  # the server's disk is not ours to measure: the probe write decides

    def _full_message(self) -> str:
        return (f"postgres at {redact(self.dsn)} has no space left: writes are refused until space is freed on the "
                "server (nothing stored is lost; clients may retry)")

    def _stored_schema_version(self, conn: Any) -> int:
        self._measure(conn)
        return _stored_version(conn.raw) or 0

    def bytes_used(self) -> int:
        """The database's size on disk (pg_database_size) as last measured by the writer."""
        return self._bytes

    def _after_commit(self, conn: Any) -> None:
        if time.monotonic() - self._bytes_at >= SIZE_EVERY_S:
            self._measure(conn)

    def _measure(self, conn: PgConn) -> None:
        try:
            row = conn.raw.execute("SELECT pg_database_size(current_database())").fetchone()
        except psycopg.Error as e:
            log.warning("pg_size_unavailable", extra={"ev": {"error": scrub(one_line(e), self.dsn)}})
            return
        self._bytes = int(row[0]) if row else 0
        self._bytes_at = time.monotonic()

    def _run_read(self, fn: Any, args: tuple[Any, ...]) -> Any:
        """One read on a pooled connection; the server away is storage_unavailable (the outage begun)."""
        started = time.monotonic()
        try:
            raw = self._reader_conn(started)
        except psycopg.Error as e:  # the pool's timeout (no connection could be made), or the pool closing
            self._outage.begin(e, started)
            raise StorageError(StorageCode.STORAGE_UNAVAILABLE, str(self._outage.unavailable("this read"))) from None
        assert self._pool is not None
        try:
            conn = PgConn(raw, readonly=True, dsn=self.dsn)
            conn.execute("BEGIN")
            try:
                return fn(conn, *args)
            finally:
                if not raw.closed:
                    conn.execute("ROLLBACK")
        except (psycopg.Error, sqlite3.Error) as e:  # psycopg's own: a module that used it directly (the AGE walks)
            err = translate(as_dbapi_error(e, raw, self.dsn) if isinstance(e, psycopg.Error) else e)
            if err.code == StorageCode.STORAGE_UNAVAILABLE:
                self._outage.begin(err.message, started)
            raise self._noted(err) from None
        finally:
            self._pool.putconn(raw)

    def _reader_conn(self, started: float) -> psycopg.Connection[Any]:
        """A pooled connection (checked), waited for up to CONNECT_TIMEOUT_S, or READ_WAIT_KNOWN_AWAY_S once an
        outage is known; PoolTimeout when none came."""
        assert self._pool is not None
        while True:
            try:
                return self._pool.getconn(timeout=READ_WAIT_KNOWN_AWAY_S if self._outage.away else READ_WAIT_AWAY_S)
            except PoolTimeout:
                if self._outage.away or time.monotonic() - started >= CONNECT_TIMEOUT_S:
                    raise

    async def _close(self) -> None:
        await super()._close()
        self._give_up_held(float("inf"))  # the writer has ended: nobody will settle it now
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)
