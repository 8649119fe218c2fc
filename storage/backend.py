"""Open the configured storage backend: the SQLite file, or a Postgres database."""

from __future__ import annotations

from pathlib import Path

from storage.db import Database


async def open_database(*, backend: str, path: Path, dsn: str = "", batch_max: int = 512, readers: int = 2,
                        synchronous: str = "full", age: str = "off") -> Database:
    """``backend`` "sqlite" opens ``path``; "postgres" connects to ``dsn`` (``age``: off | auto | on)."""
    if backend == "postgres":
        from storage.pg import PgDatabase
        return await PgDatabase.open_pg(dsn, batch_max=batch_max, readers=readers, age=age)
    return await Database.open(path, batch_max=batch_max, readers=readers, synchronous=synchronous)
