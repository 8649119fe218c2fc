"""SQLite's own check of the database file, and what it found, named by table.

``PRAGMA quick_check`` reads every page of every b-tree and checks its structure (0.09 s at 100k memories,
docs/operations.md "A damaged database"); ``PRAGMA integrity_check`` also checks that every index holds
exactly its table's rows. Neither names the table a damaged page belongs to, so when one finds damage each
table is checked alone (``quick_check(TABLE)`` covers a table and its indexes) and a damaged table's rows are
read through: rows that all read mean only its indexes are damaged, which can be rebuilt; rows that do not
are lost here and come back only from a backup or from the mesh. The full-text index (the ``memories_fts_*``
tables) is derived from the memories and can always be rebuilt.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.errors import StorageCode, StorageError

# SQLite's messages kept from one check (a damaged page yields one per cell: hundreds).
MAX_MESSAGES = 20
# The full-text index's own tables: every row in them is derived from ``memories`` (FTS5 shadow tables).
FTS_TABLE = "memories_fts"
FTS_SHADOW_PREFIX = f"{FTS_TABLE}_"
SCHEMA_TABLE = "sqlite_master"
# What to do about damage, said the same way by the log line, the error clients get, doctor and repair.
RECOVERY = ("stop the node and run `ai-memory repair` (it rebuilds the full-text index and the indexes); what it "
            "cannot rebuild, restore from a backup or from the mesh (docs/operations.md, \"A damaged database\")")
# Rows read at a time when a damaged table's rows are read through.
READ_CHUNK = 1_000


@dataclass(frozen=True, slots=True)
class Damaged:
    """One damaged part of the store: ``table`` ("" for pages outside every table, FTS_TABLE for the full-text
    index) and whether its rows all still read (then only derived structures are damaged: rebuildable)."""

    table: str
    rows_readable: bool

    @property
    def rebuildable(self) -> bool:
        return self.rows_readable or self.table in ("", FTS_TABLE)

    def describe(self) -> str:
        if self.table == FTS_TABLE:
            return "the full-text index (memories_fts)"
        if not self.table:
            return "pages outside every table (the free-page list)"
        if self.table == SCHEMA_TABLE:
            return "the schema (sqlite_master): no table can be found"
        if self.rows_readable:
            return f"the indexes of table {self.table}"
        return f"table {self.table} (rows on damaged pages cannot be read)"


@dataclass(frozen=True, slots=True)
class Findings:
    """What one check of the file found: ``check`` is the pragma run, ``seconds`` how long it took; ``messages``
    SQLite's first lines and ``damaged`` the parts they belong to (both empty when the file is sound)."""

    path: Path
    check: str
    seconds: float
    messages: tuple[str, ...] = ()
    damaged: tuple[Damaged, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.messages

    @property
    def rebuildable(self) -> bool:
        """Everything damaged can be rebuilt from what the file still holds (``ai-memory repair``)."""
        return all(d.rebuildable for d in self.damaged)

    def summary(self) -> str:
        """The damaged parts in a phrase ("the full-text index (memories_fts), table memories (...)")."""
        return ", ".join(d.describe() for d in self.damaged) or "pages SQLite could not place in a table"

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "path": str(self.path), "check": self.check, "seconds": round(self.seconds, 3),
                "damaged": [{"table": d.table, "rows_readable": d.rows_readable, "what": d.describe()}
                            for d in self.damaged],
                "messages": list(self.messages)}


def corrupt_error(path: Path, what: str) -> StorageError:
    """The error a caller meets on a damaged store: the file, what is damaged, and the recovery."""
    return StorageError(StorageCode.STORAGE_CORRUPT, f"{path} is damaged ({what}): {RECOVERY}")


def open_checker(path: Path) -> sqlite3.Connection:
    """A read-only connection of its own for a check, beside a running node's writer and readers (WAL)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None,
                           check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 5000")
    return conn


class FileCheck:
    """One check of the file at ``path`` on a connection of its own, run on a thread (``run``); ``interrupt()``
    from any thread ends it at SQLite's next step (the node's drain)."""

    def __init__(self, path: Path, *, full: bool = False) -> None:
        self.path = path
        self.full = full
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._interrupted = False

    def run(self) -> Findings:
        conn = open_checker(self.path)
        with self._lock:
            if self._interrupted:
                conn.close()
                raise sqlite3.OperationalError("interrupted")
            self._conn = conn
        try:
            return check(conn, self.path, full=self.full)
        finally:
            with self._lock:
                self._conn = None
            conn.close()

    def interrupt(self) -> None:
        with self._lock:
            self._interrupted = True
            if self._conn is not None:
                self._conn.interrupt()


def check(conn: sqlite3.Connection, path: Path, *, full: bool = False, deep: bool = False) -> Findings:
    """Check the database ``conn`` has open (at ``path``, for the report) in one snapshot.

    ``full`` runs integrity_check (indexes against their tables too) instead of quick_check. ``deep`` adds the
    full-text index's own check of every entry against the memories (FTS5 ``integrity-check``: it takes the write
    lock, so only where the file is held alone: ``ai-memory repair``). Raises sqlite3.Error only when the check
    cannot run at all.
    """
    pragma = "integrity_check" if full else "quick_check"
    started = time.perf_counter()
    conn.execute("BEGIN")
    try:
        messages = _messages(conn, f"PRAGMA {pragma}({MAX_MESSAGES:d})")
        # On sound pages only: the full-text checks read the memories through their indexes, and a damaged
        # index would pass for a damaged full-text index (the damaged pages are located below anyway).
        fts = "" if messages else _fts_out_of_step(conn) or (_fts_integrity(conn) if deep else "")
        if fts:
            messages.append(fts)
        damaged = _locate(conn, pragma, fts_damaged=bool(fts)) if messages else ()
    finally:
        conn.execute("ROLLBACK")
    return Findings(path, pragma, time.perf_counter() - started, tuple(messages), damaged)


def _messages(conn: sqlite3.Connection, sql: str) -> list[str]:
    """SQLite's lines from a check pragma ([] for "ok"); a check stopped by the damage itself is one line too."""
    try:
        rows = [str(r[0]) for r in conn.execute(sql)]
    except sqlite3.DatabaseError as e:
        return [str(e)]
    lines = [line for row in rows for line in row.splitlines() if line and not line.startswith("*** in database")]
    return [] if lines == ["ok"] else lines[:MAX_MESSAGES]


def _fts_out_of_step(conn: sqlite3.Connection) -> str:
    """A cheap logical check of the full-text index: it holds one document per memory (its docsize rows).
    "" when they agree, or where the check itself meets damage (the page checks report that)."""
    try:
        indexed, stored = conn.execute(f"SELECT (SELECT count(*) FROM {FTS_TABLE}_docsize), "
                                       "(SELECT count(*) FROM memories)").fetchone()
    except sqlite3.DatabaseError:
        return ""
    if indexed == stored:
        return ""
    return f"the full-text index holds {indexed} documents for {stored} memories"


def _fts_integrity(conn: sqlite3.Connection) -> str:
    """FTS5's own check that its index holds exactly the memories' words; "" when it does."""
    try:
        conn.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES('integrity-check')")
    except sqlite3.DatabaseError as e:
        return f"the full-text index does not match the memories ({e})"
    return ""


def _locate(conn: sqlite3.Connection, pragma: str, *, fts_damaged: bool) -> tuple[Damaged, ...]:
    """The tables (with their indexes) each check alone finds damaged; a damaged table's rows read through."""
    try:
        tables = [str(r[0]) for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND rootpage > 0 ORDER BY name")]
    except sqlite3.DatabaseError:
        return (Damaged(SCHEMA_TABLE, rows_readable=False),)
    found: list[Damaged] = []
    for table in tables:
        if not _messages(conn, f'PRAGMA {pragma}("{table}")'):
            continue
        if table.startswith(FTS_SHADOW_PREFIX):
            fts_damaged = True
        else:
            found.append(Damaged(table, rows_readable=_rows_read(conn, table)))
    if fts_damaged:
        found.insert(0, Damaged(FTS_TABLE, rows_readable=True))
    return tuple(found) or (Damaged("", rows_readable=True),)


def _rows_read(conn: sqlite3.Connection, table: str) -> bool:
    """Whether every row of ``table`` (with its overflow pages) reads from the table's own b-tree."""
    try:
        cur = conn.execute(f'SELECT * FROM "{table}" NOT INDEXED')
        while cur.fetchmany(READ_CHUNK):
            pass
    except sqlite3.DatabaseError:
        return False
    return True
