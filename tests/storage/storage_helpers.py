"""Helpers shared by the storage tests (a uniquely named module, so it cannot clash with other rooms')."""

from __future__ import annotations

import asyncio
import itertools
import random
import sqlite3
import uuid
from pathlib import Path

from storage import Database, memories
from storage.memories import MemoryRow
from tests.faults import checkpointed

_clock = itertools.count(1_700_000_000_000)


def make_memory(**over) -> MemoryRow:
    now = next(_clock)
    fields = dict(id=str(uuid.uuid4()), namespace="default", title="", content="some content",
                  origin="ai:node-1@lab", created_at=now, updated_at=now)
    fields.update(over)
    return MemoryRow(**fields)


def schema_dump(path: Path) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master "
                            "ORDER BY type, name").fetchall()
    finally:
        conn.close()


class Raw:
    """A connection behind the storage API's back (autocommit), on whichever backend ``db`` uses."""

    def __init__(self, db) -> None:
        dsn = getattr(db, "dsn", None)
        if dsn is None:
            self.conn = sqlite3.connect(db.path, isolation_level=None)
            self.pg = False
        else:
            from storage.pg import PgConn, connect
            self.conn = PgConn(connect(dsn))
            self.pg = True

    def execute(self, sql: str, params: tuple = ()):
        return self.conn.execute(sql, params)

    def drop_trigger(self, name: str, table: str = "signed_events") -> None:
        self.conn.execute(f"DROP TRIGGER {name} ON {table}" if self.pg else f"DROP TRIGGER {name}")

    def close(self) -> None:
        self.conn.close()


# A filled store for the fault tests: enough memories that each table and index spans many pages.
MEMORIES = 2_000
WORDS = [f"w{i}" for i in range(3_000)]


async def fill_store(path: Path, n: int = MEMORIES) -> list[str]:
    """A store of ``n`` memories of a few hundred bytes each (memory i holds the word needle<i>), closed and
    checkpointed; their ids."""
    rng = random.Random(7)
    rows = [make_memory(namespace=f"ns{i % 5}", title=f"memory {i}",
                        content=" ".join(rng.choices(WORDS, k=60)) + f" needle{i}") for i in range(n)]
    db = await Database.open(path, synchronous="normal")
    try:
        for i in range(0, n, 500):
            await asyncio.gather(*(db.write(memories.insert, row) for row in rows[i:i + 500]))
    finally:
        await db.close()
    checkpointed(path)
    return [r.id for r in rows]
