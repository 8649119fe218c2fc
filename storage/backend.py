"""Open the configured storage backend: the SQLite file, or a Postgres database."""

from __future__ import annotations

from pathlib import Path

from storage.db import Database


async def open_database(*, backend: str, path: Path, dsn: str = "", batch_max: int = 512, readers: int = 2,
                        synchronous: str = "full", age: str = "off",
                        fts_merge_pages: int = 0) -> Database:
    """``backend`` "sqlite" opens ``path``; "postgres" connects to ``dsn`` (``age``: off | auto | on).
    ``fts_merge_pages``: SQLite's idle full-text merging (storage/db.py), 0 = off; Postgres has no FTS5."""
    if backend == "postgres":
        from storage.pg import PgDatabase
        return await PgDatabase.open_pg(dsn, batch_max=batch_max, readers=readers, age=age)
    return await Database.open(path, batch_max=batch_max, readers=readers, synchronous=synchronous,
                               fts_merge_pages=fts_merge_pages)
