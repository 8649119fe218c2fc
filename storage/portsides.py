"""The two ends of ``ai-memory migrate`` (storage/port.py): an SQLite file or a Postgres database, each on one
connection of its own that holds the store for the run, read and written table by table.

- The source is only read. An SQLite file is held in SQLite's exclusive locking mode for the whole run: a process
  that has it open (a node, ``ai-memory mcp``) makes the run refuse (``in_use``), and none can open it meanwhile.
  A Postgres source is refused while another client is connected to its database, and the run holds the node's
  write lock (``storage.pg.WRITE_LOCK_KEY``) so nothing writes there meanwhile.
- On the target each batch is one transaction that also records how far the copy got (``am_migrate``); the
  indexes are dropped at the start and built once at the end, from the definitions the catalog gave.
"""

from __future__ import annotations

import json
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors

from storage import events
from storage.errors import StorageCode, StorageError, translate
from storage.events import ChainReport
from storage.integrity import FTS_TABLE

# Every table of a store, in an order that keeps its one foreign key satisfied (memory_transcript_links after
# memories). A table a migration adds goes here too: tests/storage/test_port.py holds the list to the schema.
TABLES = ("memories", "memory_links", "link_invalidations", "signed_events", "change_log", "peer_state", "counters",
          "sync_pending", "a2a_outbox", "a2a_dead_letters", "permission_rules", "pending_actions", "subscriptions",
          "subscription_deliveries", "memory_transcripts", "memory_transcripts_archive", "memory_transcript_links",
          "agent_delegations", "agent_revocations")
# The target's record of a run under way; its '*' row holds the source's fingerprint.
MARKS = "am_migrate"
RUN_ROW = "*"
# How long a store held by another process (an SQLite file open, a Postgres client connected or holding the write
# lock) is waited for before the run says it is in use (ms).
LOCK_WAIT_MS = 2_000
# SQLite's page cache for a run's connection (KiB): a store's random-keyed b-trees (uuid ids) stay in memory while
# they fill, where the default 2 MiB cache reads and writes their pages again and again.
CACHE_KIB = 256 * 1024
# Where a Postgres store keeps its schema version (storage/pg.py's migrations write it).
PG_VERSION_TABLE = "am_schema"


@dataclass(frozen=True)
class Store:
    """Where a store lives: the SQLite file at ``path`` or the Postgres database at ``dsn``."""

    engine: str  # "sqlite" | "postgres"
    path: Path = Path()
    dsn: str = ""

    def where(self) -> str:
        """The store as a message names it (a DSN without its password)."""
        if self.engine == "sqlite":
            return str(self.path)
        from storage.pglink import redact
        return f"postgres at {redact(self.dsn)}"


@dataclass(frozen=True)
class Shape:
    """A table as the copy sees it: its columns (``rowid`` among them where the engine keeps the insertion order
    apart from the key) and the integer column the rows are read in order of."""

    table: str
    columns: tuple[str, ...]
    key: str

    @property
    def key_index(self) -> int:
        return self.columns.index(self.key)


@dataclass(frozen=True)
class Mark:
    """How far one table's copy got: the last source key copied, rows copied, whether it is done."""

    last_key: int = 0
    copied: int = 0
    done: bool = False


@dataclass(frozen=True)
class TargetState:
    """What a target holds before a run (read-only): its schema version (0: no store yet), rows per table, and
    the record of a run under way (None: none)."""

    schema: int
    rows: dict[str, int] = field(default_factory=dict)
    marks: dict[str, Mark] | None = None
    fingerprint: dict[str, Any] | None = None

    @property
    def held(self) -> dict[str, int]:
        return {t: n for t, n in self.rows.items() if n}


# ---- the two engines ------------------------------------------------------------------------------

class Side(ABC):
    """One end of a run, on one connection of its own."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @abstractmethod
    def version(self) -> int:
        """The store's schema version (0: no store here)."""

    @abstractmethod
    def tables(self) -> set[str]:
        """The names of the tables the store has."""

    @abstractmethod
    def shape(self, table: str) -> Shape: ...

    @abstractmethod
    def count(self, table: str) -> int: ...

    @abstractmethod
    def read(self, shape: Shape, after: int, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` rows of ``shape``'s columns whose key is above ``after``, in key order."""

    @abstractmethod
    def high_water(self, shape: Shape) -> int:
        """The highest key the table's sequence has handed out (0 where it keeps none)."""

    @abstractmethod
    def marks(self) -> dict[str, Mark] | None:
        """The record of a run under way (None: none); the '*' row's fingerprint is ``fingerprint``."""

    @abstractmethod
    def fingerprint(self) -> dict[str, Any] | None: ...

    @abstractmethod
    def start(self, fingerprint: dict[str, Any]) -> None:
        """Create the run's record, with a row per table, in one transaction."""

    @abstractmethod
    def write(self, shape: Shape, rows: Sequence[tuple[Any, ...]], mark: Mark) -> None:
        """Insert ``rows`` and record ``mark`` for the table, in one transaction."""

    @abstractmethod
    def finish(self, high_waters: dict[str, int], shapes: Sequence[Shape]) -> None:
        """Carry the sequences' high-water marks, refresh the statistics and drop the run's record, in one
        transaction (the run's end)."""

    @abstractmethod
    def close(self) -> None: ...

    @property
    @abstractmethod
    def conn(self) -> Any:
        """The connection, for the table modules' readers (``events.verify_chain``)."""

    def head(self) -> tuple[int, str] | None:
        """The audit chain's newest event: (seq, event_hash)."""
        r = self.read_head()
        return None if r is None else (int(r[0]), str(r[1]))

    def read_head(self) -> tuple[Any, ...] | None:
        return self.conn.execute(  # type: ignore[no-any-return]
            "SELECT seq, event_hash FROM signed_events ORDER BY seq DESC LIMIT 1").fetchone()

    def verify_chain(self) -> ChainReport:
        return events.verify_chain(self.conn)

    def counts(self) -> dict[str, int]:
        have = self.tables()
        return {t: self.count(t) if t in have else 0 for t in TABLES}


def _mark_rows(marks: list[tuple[Any, ...]]) -> tuple[dict[str, Mark], dict[str, Any] | None]:
    out: dict[str, Mark] = {}
    fingerprint = None
    for name, last_key, copied, done, note in marks:
        if name == RUN_ROW:
            fingerprint = json.loads(note)
        elif name != DEFERRED_ROW:
            out[str(name)] = Mark(int(last_key), int(copied), bool(done))
    return out, fingerprint


# The indexes (and SQLite's full-text insert trigger) a run drops at its start and makes again at its end, from the
# definitions the catalog gave: each is built once from all the rows, as pg_restore does, rather than kept up row
# by row. Read as (kind, name, the statement that makes it again). The writer_bytes trigger stays: its one row a
# writer is kept as the memories land (migration 20).
_SQLITE_DEFERRED = (
    "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
    f"AND tbl_name IN ({', '.join('?' * len(TABLES))}) "
    f"AND (type = 'index' OR (type = 'trigger' AND tbl_name = 'memories' AND name LIKE 'memories_fts%' "
    f"AND sql LIKE '%AFTER INSERT ON memories%')) "
    "ORDER BY type, name")
# Postgres: every index that backs no constraint (the primary keys and UNIQUE constraints stay).
_PG_DEFERRED = (
    "SELECT 'index', ic.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
    "JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
    "JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = current_schema() AND t.relname = ANY(%s) "
    "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) ORDER BY ic.relname")
DEFERRED_ROW = "~"


def _mark_inserts(fingerprint: dict[str, Any], deferred: Sequence[tuple[Any, ...]]) -> list[tuple[str, str]]:
    """The run record's rows: the source's fingerprint, what was deferred, and one row per table."""
    return [(RUN_ROW, json.dumps(fingerprint)), (DEFERRED_ROW, json.dumps([list(d) for d in deferred])),
            *((t, "") for t in TABLES)]


def _deferred_of(marks: list[tuple[Any, ...]]) -> list[tuple[str, str, str]]:
    note = next((r[4] for r in marks if r[0] == DEFERRED_ROW), "[]")
    return [(str(k), str(n), str(sql)) for k, n, sql in json.loads(note)]


class SqliteSide(Side):
    """An SQLite file, held in exclusive locking mode from open to close (nobody else can open it meanwhile)."""

    def __init__(self, store: Store, *, create: bool = False) -> None:
        super().__init__(store)
        path = store.path
        if not create and not path.is_file():
            raise StorageError(StorageCode.NOT_FOUND, f"no SQLite store at {path}")
        try:
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise translate(e, f"opening {path}") from e
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {LOCK_WAIT_MS:d}")
            self._conn.execute(f"PRAGMA cache_size = -{CACHE_KIB:d}")
            self._conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            self._conn.execute("BEGIN EXCLUSIVE")  # takes the file now, and keeps it until close
            self._conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            self._conn.close()
            err = translate(e, f"taking {path} for the migration")
            if err.code == StorageCode.BUSY:
                raise StorageError(StorageCode.IN_USE, f"{path} is open in another process (a running node, "
                                                       "`ai-memory mcp`, another command): stop it, then run "
                                                       "`ai-memory migrate` again") from e
            raise err from e

    @property
    def conn(self) -> sqlite3.Connection:
        return self._conn

    def _run(self, doing: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except sqlite3.Error as e:
            raise translate(e, f"{doing} ({self.store.path})") from e

    def version(self) -> int:
        return int(self._run("reading the schema version",
                             lambda: self._conn.execute("PRAGMA user_version").fetchone()[0]))

    def tables(self) -> set[str]:
        return {str(r[0]) for r in self._run("listing the tables", lambda: self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall())}

    def shape(self, table: str) -> Shape:
        info = self._run(f"reading the columns of {table}",
                         lambda: self._conn.execute(f'PRAGMA table_info("{table}")').fetchall())
        names = tuple(str(r[1]) for r in info)
        pk = [r for r in info if r[5]]
        if len(pk) == 1 and str(pk[0][2]).upper() == "INTEGER":
            return Shape(table, names, str(pk[0][1]))  # the rowid's own name
        return Shape(table, ("rowid", *names), "rowid")

    def count(self, table: str) -> int:
        return int(self._run(f"counting {table}",
                             lambda: self._conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]))

    def read(self, shape: Shape, after: int, limit: int) -> list[tuple[Any, ...]]:
        sql = f'SELECT {", ".join(shape.columns)} FROM "{shape.table}" WHERE {shape.key} > ? ORDER BY {shape.key} ' \
              "LIMIT ?"
        return self._run(f"reading {shape.table}",  # type: ignore[no-any-return]
                         lambda: self._conn.execute(sql, (after, limit)).fetchall())

    def high_water(self, shape: Shape) -> int:
        if "sqlite_sequence" not in self.tables():
            return 0
        r = self._run("reading sqlite_sequence", lambda: self._conn.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = ?", (shape.table,)).fetchone())
        return int(r[0]) if r else 0

    def marks(self) -> dict[str, Mark] | None:
        return None if MARKS not in self.tables() else _mark_rows(self._marks())[0]

    def fingerprint(self) -> dict[str, Any] | None:
        return None if MARKS not in self.tables() else _mark_rows(self._marks())[1]

    def _marks(self) -> list[tuple[Any, ...]]:
        return self._run("reading the migration's record", lambda: self._conn.execute(  # type: ignore[no-any-return]
            f"SELECT name, last_key, copied, done, note FROM {MARKS}").fetchall())

    def _transaction(self, doing: str, fn: Callable[[sqlite3.Connection], None]) -> None:
        def go() -> None:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                fn(self._conn)
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        self._run(doing, go)

    def start(self, fingerprint: dict[str, Any]) -> None:
        # The copy's batches are atomic (WAL); a power cut may lose the newest of them, cursor and rows together.
        # The last transaction (``finish``) is made durable.
        self._run("setting synchronous", lambda: self._conn.execute("PRAGMA synchronous = NORMAL"))

        def go(c: sqlite3.Connection) -> None:
            deferred = c.execute(_SQLITE_DEFERRED, TABLES).fetchall()
            c.execute(f"CREATE TABLE {MARKS} (name TEXT PRIMARY KEY, last_key INTEGER NOT NULL, "
                      "copied INTEGER NOT NULL, done INTEGER NOT NULL, note TEXT NOT NULL)")
            c.executemany(f"INSERT INTO {MARKS} VALUES (?, 0, 0, 0, ?)", _mark_inserts(fingerprint, deferred))
            for kind, name, _ in deferred:
                c.execute(f'DROP {kind.upper()} "{name}"')
        self._transaction("recording the migration", go)

    def write(self, shape: Shape, rows: Sequence[tuple[Any, ...]], mark: Mark) -> None:
        sql = f'INSERT INTO "{shape.table}" ({", ".join(shape.columns)}) VALUES ({", ".join("?" * len(shape.columns))})'

        def go(c: sqlite3.Connection) -> None:
            c.executemany(sql, rows)
            c.execute(f"UPDATE {MARKS} SET last_key = ?, copied = ?, done = ? WHERE name = ?",
                      (mark.last_key, mark.copied, int(mark.done), shape.table))
        self._transaction(f"writing {shape.table}", go)

    def finish(self, high_waters: dict[str, int], shapes: Sequence[Shape]) -> None:
        self._run("setting synchronous", lambda: self._conn.execute("PRAGMA synchronous = FULL"))
        deferred = self.deferred()

        def go(c: sqlite3.Connection) -> None:
            for table, seq in high_waters.items():
                # AUTOINCREMENT keeps its high-water mark here, one row per table once it has inserted.
                if seq and c.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?",
                                     (seq, table)).rowcount == 0:
                    c.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq))
            for _, _, sql in deferred:
                c.execute(sql)
            # The full-text index from the memories at once, rather than row by row through its trigger.
            c.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES('rebuild')")
            c.execute(f"DROP TABLE {MARKS}")
            c.execute("ANALYZE")
        self._transaction("ending the migration", go)

    def deferred(self) -> list[tuple[str, str, str]]:
        """The indexes and the trigger this run dropped at its start, to be made again at its end."""
        return _deferred_of(self._marks())

    def close(self) -> None:
        self._conn.close()


class PgSide(Side):
    """A Postgres database, on one autocommit connection that holds the node's write lock from open to close."""

    def __init__(self, store: Store, *, alone: bool) -> None:
        super().__init__(store)
        from storage.pg import WRITE_LOCK_KEY, connect
        self._raw = connect(store.dsn)
        try:
            if alone:
                self._refuse_others()
            # Waited for a while, as SQLite's busy timeout waits: the session of a run killed a moment ago may
            # not have ended yet on the server.
            self._raw.execute(f"SET lock_timeout = {LOCK_WAIT_MS:d}")
            self._raw.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK_KEY,))
            self._raw.execute("SET lock_timeout = 0")
        except psycopg.errors.LockNotAvailable:
            self._raw.close()
            raise StorageError(StorageCode.IN_USE, f"{store.where()} is being written by another process (it holds "
                                                   "the node's write lock): stop it, then run `ai-memory migrate` "
                                                   "again") from None
        except psycopg.Error as e:
            self._raw.close()
            raise self._error(e, "taking the database for the migration") from None
        except BaseException:
            self._raw.close()
            raise

    def _refuse_others(self) -> None:
        """Refuse while another client is connected to this database (a node, `ai-memory mcp`, psql), once
        LOCK_WAIT_MS has passed (the session of a run killed a moment ago ends on its own)."""
        deadline = time.monotonic() + LOCK_WAIT_MS / 1000
        while True:
            others = self._raw.execute(
                "SELECT pid, coalesce(nullif(application_name, ''), '?'), coalesce(host(client_addr), 'local') "
                "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend' ORDER BY pid").fetchall()
            if not others:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        shown = ", ".join(f"pid {pid} ({app}, {addr})" for pid, app, addr in others[:5])
        raise StorageError(StorageCode.IN_USE, f"{self.store.where()} has {len(others)} other client(s) connected "
                                               f"({shown}): stop the node and every other client of this database, "
                                               "then run `ai-memory migrate` again")

    @property
    def conn(self) -> psycopg.Connection[Any]:
        return self._raw

    def _error(self, e: psycopg.Error, doing: str) -> StorageError:
        from storage.pg import as_dbapi_error
        return translate(as_dbapi_error(e, self._raw, self.store.dsn, writing=True), doing)

    def _run(self, doing: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except psycopg.Error as e:
            raise self._error(e, doing) from None

    def _rows(self, doing: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._run(doing, lambda: self._raw.execute(sql, params).fetchall())  # type: ignore[no-any-return]

    def version(self) -> int:
        if self._rows("reading the schema version", "SELECT to_regclass(%s)", (PG_VERSION_TABLE,)) == [(None,)]:
            return 0
        r = self._rows("reading the schema version", f"SELECT max(version) FROM {PG_VERSION_TABLE}")
        return int(r[0][0] or 0)

    def tables(self) -> set[str]:
        return {str(r[0]) for r in self._rows("listing the tables", (
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"))}

    def shape(self, table: str) -> Shape:
        names = tuple(str(r[0]) for r in self._rows(f"reading the columns of {table}", (
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = %s AND is_generated = 'NEVER' ORDER BY ordinal_position"), (table,)))
        if "rowid" in names:
            return Shape(table, names, "rowid")
        pk = self._rows(f"reading the key of {table}", (
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary"), (table,))
        if len(pk) != 1:
            raise StorageError(StorageCode.SQL_ERROR, f"{table} in {self.store.where()} has neither a rowid column "
                                                      "nor a one-column key")
        return Shape(table, names, str(pk[0][0]))

    def count(self, table: str) -> int:
        return int(self._rows(f"counting {table}", f'SELECT count(*) FROM "{table}"')[0][0])

    def read(self, shape: Shape, after: int, limit: int) -> list[tuple[Any, ...]]:
        return self._rows(f"reading {shape.table}", f'SELECT {", ".join(shape.columns)} FROM "{shape.table}" '
                                                    f"WHERE {shape.key} > %s ORDER BY {shape.key} LIMIT %s",
                          (after, limit))

    def high_water(self, shape: Shape) -> int:
        seq = self._sequence(shape)
        if seq is None:
            return 0
        r = self._rows("reading a sequence", f"SELECT last_value, is_called FROM {seq}")
        return int(r[0][0]) if r and r[0][1] else 0

    def _sequence(self, shape: Shape) -> str | None:
        r = self._rows("finding a sequence", "SELECT pg_get_serial_sequence(%s, %s)", (shape.table, shape.key))
        return None if not r or r[0][0] is None else str(r[0][0])

    def marks(self) -> dict[str, Mark] | None:
        return None if MARKS not in self.tables() else _mark_rows(self._marks())[0]

    def fingerprint(self) -> dict[str, Any] | None:
        return None if MARKS not in self.tables() else _mark_rows(self._marks())[1]

    def _marks(self) -> list[tuple[Any, ...]]:
        return self._rows("reading the migration's record", f"SELECT name, last_key, copied, done, note FROM {MARKS}")

    def _transaction(self, doing: str, fn: Callable[[psycopg.Cursor[Any]], None]) -> None:
        def go() -> None:
            with self._raw.transaction(), self._raw.cursor() as cur:
                fn(cur)
        self._run(doing, go)

    def start(self, fingerprint: dict[str, Any]) -> None:
        # Each batch's commit need not wait for its WAL flush: a server crash may lose the newest batches, cursor
        # and rows together. The last transaction (``finish``) waits for it, and so for every one before it.
        self._run("setting synchronous_commit", lambda: self._raw.execute("SET synchronous_commit = off"))

        def go(cur: psycopg.Cursor[Any]) -> None:
            deferred = cur.execute(_PG_DEFERRED, (list(TABLES),)).fetchall()
            cur.execute(f"CREATE TABLE {MARKS} (name TEXT PRIMARY KEY, last_key BIGINT NOT NULL, "
                        "copied BIGINT NOT NULL, done INTEGER NOT NULL, note TEXT NOT NULL)")
            cur.executemany(f"INSERT INTO {MARKS} VALUES (%s, 0, 0, 0, %s)", _mark_inserts(fingerprint, deferred))
            for _, name, _ in deferred:
                cur.execute(f'DROP INDEX "{name}"')
        self._transaction("recording the migration", go)

    def write(self, shape: Shape, rows: Sequence[tuple[Any, ...]], mark: Mark) -> None:
        def go(cur: psycopg.Cursor[Any]) -> None:
            with cur.copy(f'COPY "{shape.table}" ({", ".join(shape.columns)}) FROM STDIN') as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(f"UPDATE {MARKS} SET last_key = %s, copied = %s, done = %s WHERE name = %s",
                        (mark.last_key, mark.copied, int(mark.done), shape.table))
        self._transaction(f"writing {shape.table}", go)

    def finish(self, high_waters: dict[str, int], shapes: Sequence[Shape]) -> None:
        self._run("setting synchronous_commit", lambda: self._raw.execute("SET synchronous_commit = on"))
        sequences = {s.table: (s.key, seq) for s in shapes if (seq := self._sequence(s)) is not None}
        deferred = _deferred_of(self._marks())

        def go(cur: psycopg.Cursor[Any]) -> None:
            for table, (key, seq) in sequences.items():
                # The next key past every key copied and every key the source's sequence had handed out.
                cur.execute(f'SELECT greatest((SELECT coalesce(max({key}), 0) FROM "{table}"), %s)',
                            (high_waters.get(table, 0),))
                top = int(cur.fetchone()[0])  # type: ignore[index]
                cur.execute("SELECT setval(%s, %s, %s)", (seq, max(top, 1), top > 0))
            for _, _, sql in deferred:
                cur.execute(sql)
            cur.execute(f"DROP TABLE {MARKS}")
        self._transaction("ending the migration", go)
        self._run("analyzing the copied tables", lambda: self._raw.execute("ANALYZE"))

    def close(self) -> None:
        self._raw.close()  # the session's advisory lock goes with it


def open_side(store: Store, *, source: bool) -> Side:
    """``store`` taken for a run: the source (must exist; a Postgres one with no other client) or the target."""
    if store.engine == "sqlite":
        return SqliteSide(store, create=not source)
    if store.engine == "postgres":
        return PgSide(store, alone=source)
    raise StorageError(StorageCode.BAD_SETTING, f"no storage engine {store.engine!r} (sqlite or postgres)")


def inspect(store: Store) -> TargetState:
    """What the target holds, read without changing it: its schema version, rows per table, a run's record."""
    if store.engine == "sqlite":
        if not store.path.exists() or store.path.stat().st_size == 0:
            return TargetState(0)
        return _inspect_sqlite(store.path)
    side = PgSide(store, alone=False)
    try:
        have = side.tables()
        return TargetState(side.version(), {t: side.count(t) for t in TABLES if t in have}, side.marks(),
                           side.fingerprint())
    finally:
        side.close()


def _inspect_sqlite(path: Path) -> TargetState:
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as e:
        raise translate(e, f"opening {path} read-only") from e
    try:
        conn.execute(f"PRAGMA busy_timeout = {LOCK_WAIT_MS:d}")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        have = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rows = {t: int(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in TABLES if t in have}
        marks, fingerprint = (None, None) if MARKS not in have else _mark_rows(conn.execute(
            f"SELECT name, last_key, copied, done, note FROM {MARKS}").fetchall())
        return TargetState(version, rows, marks, fingerprint)
    except sqlite3.DatabaseError as e:
        from storage.migrations import guard
        guard(path)  # a file that is not SQLite, or another application's: its own clear refusal
        raise translate(e, f"reading {path}") from e
    finally:
        conn.close()
