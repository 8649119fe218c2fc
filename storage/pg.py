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
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
from psycopg import pq
from psycopg_pool import ConnectionPool

from storage import migrations
from storage.db import Database
from storage.errors import StorageCode, StorageError
from storage.migrations import MAX_SUPPORTED_SCHEMA, Migration

# Arbitrary but fixed: the advisory lock every write transaction takes ('AMSH').
WRITE_LOCK_KEY = 0x414D5348
# Bound on connecting to the server; a DSN that does not answer is a clear error, not a hang.
CONNECT_TIMEOUT_S = 10
# How stale the database size behind limits.max_db_bytes may be (it costs one query on the writer).
SIZE_EVERY_S = 1.0

log = logging.getLogger("storage.pg")
# Tables of ours besides the migrations' (the schema version).
_META = "am_schema"


class PgCursor:
    """The slice of the sqlite3 cursor the table modules use."""

    def __init__(self, cur: psycopg.Cursor[Any] | None, raw: psycopg.Connection[Any]) -> None:
        self._cur = cur
        self._raw = raw

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
        r = self._raw.execute("SELECT lastval()").fetchone()
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
    """A psycopg connection (autocommit; transactions are explicit) that runs the modules' statements."""

    dialect = "postgres"

    def __init__(self, raw: psycopg.Connection[Any], *, readonly: bool = False) -> None:
        self.raw = raw
        self.readonly = readonly
        # Run inside each write transaction just before COMMIT (keeps the AGE graph in step).
        self.before_commit: Callable[[PgConn], object] | None = None

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != pq.TransactionStatus.IDLE

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> PgCursor:
        head = sql.lstrip()[:16].upper()
        try:
            if head.startswith("PRAGMA"):
                return PgCursor(None, self.raw)  # SQLite tuning: nothing to do here
            if sql == "BEGIN IMMEDIATE":
                self.raw.execute("BEGIN")
                self.raw.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
                return PgCursor(None, self.raw)
            if sql == "BEGIN" and self.readonly:
                # One consistent snapshot per read, as a SQLite read transaction gives.
                return PgCursor(self.raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"), self.raw)
            if sql == "COMMIT" and self.before_commit is not None and self.in_transaction:
                self.before_commit(self)
            sql = _WRITER_STATEMENTS.get(sql, sql)
            return PgCursor(self.raw.execute(_to_psycopg(sql), tuple(parameters)), self.raw)
        except psycopg.Error as e:
            raise as_dbapi_error(e) from e

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /) -> None:
        """One statement for each parameter row, in order (the table modules' INSERTs of a batch)."""
        try:
            with self.raw.cursor() as cur:
                cur.executemany(_to_psycopg(sql), [tuple(p) for p in seq_of_parameters])
        except psycopg.Error as e:
            raise as_dbapi_error(e) from e

    def close(self) -> None:
        self.raw.close()


def as_dbapi_error(e: psycopg.Error) -> sqlite3.Error:
    """psycopg's error as the sqlite3 error the table modules handle (same wording where they match on it)."""
    if isinstance(e, psycopg.errors.UniqueViolation):
        m = re.search(r"Key \((.*?)\)=", e.diag.message_detail or "")
        cols = m.group(1) if m else "?"
        return sqlite3.IntegrityError(f"UNIQUE constraint failed: {e.diag.table_name}.{cols}")
    if isinstance(e, (psycopg.errors.IntegrityError, psycopg.errors.RaiseException)):
        return sqlite3.IntegrityError(e.diag.message_primary or str(e))
    return sqlite3.OperationalError(f"postgres: {e.diag.message_primary or e}")


def connect(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """Open a connection to ``dsn``; StorageError('cannot_connect') naming the DSN when it fails."""
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as e:
        raise StorageError(StorageCode.CANNOT_CONNECT,
                           f"cannot connect to postgres at {dsn!r}: {str(e).strip()}") from e


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
    return out


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
                           f"the database at {dsn!r} was written by schema {version}, this build supports up to "
                           f"{MAX_SUPPORTED_SCHEMA}; upgrade attested-mesh to open it (left unchanged)")
    if version is None:
        names = [r[0] for r in raw.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1").fetchall()]
        if names:
            raise StorageError(StorageCode.FOREIGN_DATABASE,
                               f"the database at {dsn!r} holds tables of another application "
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

class PgDatabase(Database):
    """Database over Postgres: the same writer loop and group commit, psycopg connections underneath."""

    def __init__(self, dsn: str, batch_max: int, readers: int) -> None:
        super().__init__(Path("postgres"), batch_max, readers)
        self.dsn = dsn
        self.kg_backend = "postgres-cte"
        self._age_mode = "off"
        self._pool: ConnectionPool[Any] | None = None
        # pg_database_size, measured by the writer at open and at most every SIZE_EVERY_S after a commit.
        self._bytes = 0
        self._bytes_at = 0.0

    @classmethod
    async def open_pg(cls, dsn: str, *, batch_max: int = 512, readers: int = 2, age: str = "off") -> PgDatabase:
        """Connect, guard, migrate; then choose the graph walks: AGE when ``age`` is "on" (required) or
        "auto" (when installed), else recursive CTEs. Raises StorageError cannot_connect / schema_too_new /
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
            db._pool = ConnectionPool(dsn, min_size=1, max_size=readers, open=False,
                                      kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
                                      configure=db._configure_reader)
            await asyncio.to_thread(db._pool.open, True, CONNECT_TIMEOUT_S)
        except BaseException:
            await db.close()
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
            conn = PgConn(raw)
            migrate(conn)
            self._choose_kg_backend(conn)
            return conn
        except psycopg.Error as e:
            raw.close()
            raise StorageError(StorageCode.SQL_ERROR, f"preparing the postgres schema: {e}") from e
        except BaseException:
            raw.close()
            raise

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
        age.prepare_session(conn.raw)
        age.setup(conn)
        conn.before_commit = age.sync
        self.kg_backend = "postgres-age"

    async def check_integrity(self, *, full: bool = False) -> None:
        """None: the server checks its own pages (data checksums, amcheck); SQLite's file check has no part here."""
        return None

    def _has_room(self) -> bool:
        return True  # the server's disk is not ours to measure: the probe write decides

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
            log.warning("pg_size_unavailable", extra={"ev": {"error": str(e)}})
            return
        self._bytes = int(row[0]) if row else 0
        self._bytes_at = time.monotonic()

    def _run_read(self, fn: Any, args: tuple[Any, ...]) -> Any:
        assert self._pool is not None
        try:
            with self._pool.connection() as raw:
                conn = PgConn(raw, readonly=True)
                conn.execute("BEGIN")
                try:
                    return fn(conn, *args)
                finally:
                    raw.execute("ROLLBACK")
        except psycopg.Error as e:
            raise StorageError(StorageCode.SQL_ERROR, f"postgres read: {e}") from e
        except sqlite3.Error as e:
            from storage.errors import translate
            raise translate(e) from e

    async def _close(self) -> None:
        await super()._close()
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)
