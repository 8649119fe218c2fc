"""Helpers shared by the storage tests (a uniquely named module, so it cannot clash with other rooms')."""

from __future__ import annotations

import itertools
import sqlite3
import uuid
from pathlib import Path

from storage.memories import MemoryRow

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
