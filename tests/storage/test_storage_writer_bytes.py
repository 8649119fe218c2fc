"""Each writer's stored bytes (the storage quota's count) are kept by migration 20's triggers, equal to the sum over
the memories it wrote through inserts, overwrites, deletes and a store that held memories before the migration."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from storage import Database, memories, migrations
from storage.memories import MemoryRow
from storage.permissions import bytes_by_writer


def _row(i: int, writer: str, content: str, title: str = "") -> MemoryRow:
    return MemoryRow(id=f"m{i}", namespace="ns", title=title, content=content, origin=writer, writer=writer,
                     created_at=1, updated_at=1)


def _summed(conn: sqlite3.Connection, writer: str) -> int:
    return int(conn.execute("SELECT coalesce(sum(length(CAST(content AS BLOB)) + length(CAST(title AS BLOB))), 0) "
                            "FROM memories WHERE writer = ?", (writer,)).fetchone()[0])


async def test_the_count_follows_inserts_overwrites_and_deletes(db_path: Path) -> None:
    await (await Database.open(db_path)).close()
    conn = sqlite3.connect(db_path, isolation_level=None)
    memories.insert(conn, _row(1, "ai:a", "héllo wörld", "tïtle"))
    memories.insert(conn, _row(2, "ai:a", "second"))
    memories.insert(conn, _row(3, "ai:b", "other writer"))
    assert bytes_by_writer(conn, "ai:a") == _summed(conn, "ai:a") == len("héllo wörldtïtlesecond".encode())
    assert bytes_by_writer(conn, "ai:b") == _summed(conn, "ai:b")
    # A later version written by another agent moves the row's bytes from one writer to the other.
    old = memories.get(conn, "m1")
    assert old is not None
    memories.overwrite(conn, memories.next_version(old, writer="ai:b", updated_at=2, content="longer content now"))
    conn.execute("DELETE FROM memories WHERE id = 'm2'")
    for w in ("ai:a", "ai:b", "ai:nobody"):
        assert bytes_by_writer(conn, w) == _summed(conn, w)
    assert bytes_by_writer(conn, "ai:a") == 0
    conn.close()


async def test_the_migration_counts_the_memories_already_stored(db_path: Path) -> None:
    await (await Database.open(db_path)).close()
    conn = sqlite3.connect(db_path, isolation_level=None)
    for i in range(5):
        memories.insert(conn, _row(i, f"ai:w{i % 2}", "x" * (i + 1)))
    # As a store made before migration 20: no count table, no triggers.
    conn.executescript("DROP TRIGGER writer_bytes_ai; DROP TRIGGER writer_bytes_ad; DROP TRIGGER writer_bytes_au; "
                       "DROP TABLE writer_bytes; PRAGMA user_version = 17;")
    assert migrations.migrate(conn) == migrations.MAX_SUPPORTED_SCHEMA
    assert [bytes_by_writer(conn, f"ai:w{k}") for k in (0, 1)] == [_summed(conn, "ai:w0"), _summed(conn, "ai:w1")]
    assert bytes_by_writer(conn, "ai:w0") == 1 + 3 + 5
    conn.close()
