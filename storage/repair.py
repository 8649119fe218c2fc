"""Rebuild what a damaged SQLite store can rebuild (``ai-memory repair``), with the file to itself.

The file is held under an exclusive lock for the whole repair (``PRAGMA locking_mode = EXCLUSIVE``): a running
node, an ``ai-memory mcp`` or another command that has it open refuses the repair (in_use), and none can open it
until the repair ends. Its WAL is folded in first (``journal_mode = DELETE``; the node turns WAL on again when it
next opens the file), so the repair, and the copy of the damaged file it keeps, deal in one file.

1. Check: integrity_check and the full-text index's own ``integrity-check``, named by table (storage/integrity.py).
2. A table whose rows do not all read cannot be rebuilt from this file: nothing is changed, and the report says to
   restore from a backup or from the mesh.
3. In place: REINDEX and the full-text index's ``rebuild`` in one transaction, then check again. That mends
   indexes whose entries are wrong on sound pages.
4. Where damaged pages refuse that (both first clear or read the damaged b-tree, and SQLite stops at the damaged
   page), into a new file: this build's schema, every table's rows copied (each index and the full-text index fill
   as the rows go in), then written over the damaged file with SQLite's backup API under the same lock (so its
   owner and mode stay), keeping a copy of the damaged file beside it.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage import migrations
from storage.errors import StorageCode, StorageError, translate
from storage.integrity import FTS_SHADOW_PREFIX, FTS_TABLE, SCHEMA_TABLE, Damaged, Findings, check

# How long the repair waits for another connection to let go of the file before it says the file is in use (ms).
LOCK_WAIT_MS = 1_000
# Space a rebuild by copy needs beside the file, in multiples of its size: the kept copy of the damaged file, the
# rebuilt file, and the rollback journal of writing it back.
COPY_SPACE_FACTOR = 3
RESTORE = ("restore the store from a backup, or from the mesh (docs/operations.md, \"A damaged database\"); "
           "its rows were left as they were")


@dataclass
class Repair:
    """What ``repair`` found and did: the check before (and after, when it changed the file), what it did, what
    it could not, and where the damaged file was kept."""

    path: Path
    before: Findings
    after: Findings | None = None
    done: list[str] = field(default_factory=list)
    not_done: list[str] = field(default_factory=list)
    kept: Path | None = None

    @property
    def outcome(self) -> str:
        """"sound" (nothing damaged), "repaired" (sound now) or "not_repaired" (see not_done)."""
        if self.before.ok:
            return "sound"
        return "repaired" if self.after is not None and self.after.ok and not self.not_done else "not_repaired"

    def as_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "path": str(self.path), "before": self.before.as_dict(),
                "after": None if self.after is None else self.after.as_dict(), "done": self.done,
                "not_done": self.not_done, "kept": None if self.kept is None else str(self.kept)}


def repair(path: Path, *, clock: Callable[[], float] = time.time) -> Repair:
    """Check the store at ``path`` and rebuild what can be rebuilt (the module's docstring says how).

    Raises StorageError in_use (another process has the file open), not_found, storage_full (no room for a
    rebuild by copy) or the guard's refusals (not_a_database, foreign_database, schema_too_new).
    """
    if not path.is_file():
        raise StorageError(StorageCode.NOT_FOUND, f"no database at {path}")
    try:
        migrations.guard(path)
    except StorageError as e:
        if e.code != StorageCode.STORAGE_CORRUPT:
            raise
        schema = Findings(path, "open", 0.0, (e.message,), (Damaged(SCHEMA_TABLE, rows_readable=False),))
        return Repair(path, schema, not_done=[f"{schema.summary()}: {RESTORE}"])
    conn = _alone(path)
    try:
        return _repair(conn, path, clock())
    except sqlite3.Error as e:  # the file refused a step no damage explains (I/O): one error, the file as it was
        raise translate(e, f"repairing {path}") from e
    finally:
        conn.close()


def _repair(conn: sqlite3.Connection, path: Path, now: float) -> Repair:
    before = check(conn, path, full=True, deep=True)
    if before.ok:
        return Repair(path, before)
    if not before.rebuildable:
        lost = [d.describe() for d in before.damaged if not d.rebuildable]
        return Repair(path, before, not_done=[f"{what}: {RESTORE}" for what in lost])
    done = _in_place(conn)
    if done:
        after = check(conn, path, full=True, deep=True)
        if after.ok:
            return Repair(path, before, after, done)
    return _by_copy(conn, path, before, now)


def _alone(path: Path) -> sqlite3.Connection:
    """A connection holding ``path`` alone until it closes, its WAL folded into the file."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {LOCK_WAIT_MS:d}")
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("COMMIT")
    except sqlite3.Error as e:
        conn.close()
        err = translate(e, f"taking {path} for the repair")
        if err.code == StorageCode.BUSY:
            raise StorageError(StorageCode.IN_USE,
                               f"{path} is open in another process (a running node, `ai-memory mcp`, another "
                               "command): stop it, then run `ai-memory repair` again") from e
        raise err from e
    return conn


def _in_place(conn: sqlite3.Connection) -> list[str]:
    """REINDEX and the full-text index's rebuild in one transaction; [] when damaged pages refuse (rolled back)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("REINDEX")
        conn.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES('rebuild')")
        conn.execute("COMMIT")
    except sqlite3.DatabaseError:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return []
    return ["rebuilt every index in place (REINDEX)",
            f"rebuilt the full-text index in place from the memories ({FTS_TABLE} 'rebuild')"]


def _by_copy(conn: sqlite3.Connection, path: Path, before: Findings, now: float) -> Repair:
    """Copy every table's rows into a new file of this build's schema, then write it over ``path``."""
    _room_for_copy(path)
    kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}")
    fresh = path.with_name(f"{path.name}.rebuilt")
    _remove(fresh)
    _keep_copy(path, kept)
    try:
        _new_store(fresh)
        try:
            copied = _copy_rows(conn, fresh)
        except sqlite3.DatabaseError as e:
            _remove(kept)
            return Repair(path, before, not_done=[f"copying the rows into a new file failed ({e}): {RESTORE}"])
        rebuilt = sqlite3.connect(fresh)
        try:
            rebuilt.backup(conn)  # one write transaction on the damaged file: a failure rolls it back
        finally:
            rebuilt.close()
    finally:
        _remove(fresh)
    rows = ", ".join(f"{t} {n}" for t, n in copied if n)
    done = [f"copied the rows of {len(copied)} tables into a new file ({rows})",
            f"rebuilt every index and the full-text index from them ({dict(copied).get('memories', 0)} memories)",
            f"wrote the rebuilt file over {path} (same owner and mode)",
            f"kept the damaged file as {kept}: delete it once the node runs well"]
    return Repair(path, before, check(conn, path, full=True, deep=True), done, kept=kept)


def _room_for_copy(path: Path) -> None:
    need = COPY_SPACE_FACTOR * path.stat().st_size
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise StorageError(StorageCode.STORAGE_FULL,
                           f"rebuilding {path} needs about {need / 2**20:.1f} MiB free beside it (a copy of the "
                           f"damaged file, the rebuilt file, the journal of writing it back); {free / 2**20:.1f} MiB "
                           "are free: free space there, then run `ai-memory repair` again")


def _keep_copy(path: Path, kept: Path) -> None:
    """A copy of the damaged file at ``kept``, owner-only and owned as the file is (repair may run as root)."""
    shutil.copyfile(path, kept)
    st = path.stat()
    os.chmod(kept, 0o600)
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
        os.chown(kept, st.st_uid, st.st_gid)


def _new_store(fresh: Path) -> None:
    """An empty store of this build's schema at ``fresh`` (owner-only)."""
    os.close(os.open(fresh, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    conn = sqlite3.connect(fresh, isolation_level=None)
    try:
        migrations.migrate(conn)
    finally:
        conn.close()


def _copy_rows(conn: sqlite3.Connection, fresh: Path) -> list[tuple[str, int]]:
    """Every table's rows from ``conn``'s file into ``fresh`` in one transaction: (table, rows) in copy order.
    The full-text index fills from its triggers as the memories go in; its own tables are not copied."""
    conn.execute("ATTACH DATABASE ? AS rebuilt", (str(fresh),))
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            copied = [(t, _copy_table(conn, t)) for t in _tables(conn, "rebuilt")]
            conn.execute("DELETE FROM rebuilt.sqlite_sequence")
            conn.execute("INSERT INTO rebuilt.sqlite_sequence (name, seq) SELECT name, seq FROM main.sqlite_sequence")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.execute("DETACH DATABASE rebuilt")
    return copied


def _tables(conn: sqlite3.Connection, schema: str) -> list[str]:
    """The tables of ``schema`` that hold rows of their own (not SQLite's, not the full-text index's, not those
    the memories' triggers derive as they go in: ``migrations.DERIVED_TABLES``)."""
    return [str(r[0]) for r in conn.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type = 'table' AND rootpage > 0 AND name NOT LIKE 'sqlite%' "
        "ORDER BY name") if not str(r[0]).startswith(FTS_SHADOW_PREFIX) and str(r[0]) not in migrations.DERIVED_TABLES]


def _copy_table(conn: sqlite3.Connection, table: str) -> int:
    """Copy ``table``'s rows (the columns both files have; rowids kept) from main into rebuilt; the rows copied."""
    new = _columns(conn, "rebuilt", table)
    old = _columns(conn, "main", table)
    if not old:
        return 0
    cols = [c for c in new if c in old]
    names = ", ".join(f'"{c}"' for c in cols)
    keep_rowid = not _has_rowid_alias(conn, table) and not _without_rowid(conn, table)
    target, source = (f"rowid, {names}", f"rowid, {names}") if keep_rowid else (names, names)
    cur = conn.execute(f'INSERT INTO rebuilt."{table}" ({target}) SELECT {source} FROM main."{table}" NOT INDEXED')
    return int(cur.rowcount)


def _columns(conn: sqlite3.Connection, schema: str, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f'PRAGMA {schema}.table_info("{table}")')]


def _has_rowid_alias(conn: sqlite3.Connection, table: str) -> bool:
    pk = [r for r in conn.execute(f'PRAGMA rebuilt.table_info("{table}")') if r[5]]
    return len(pk) == 1 and str(pk[0][2]).upper() == "INTEGER"


def _without_rowid(conn: sqlite3.Connection, table: str) -> bool:
    sql = conn.execute("SELECT sql FROM rebuilt.sqlite_master WHERE name = ?", (table,)).fetchone()
    return bool(sql) and "WITHOUT ROWID" in str(sql[0]).upper()


def _remove(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-journal")):
        p.unlink(missing_ok=True)

