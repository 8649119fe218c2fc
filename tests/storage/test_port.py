"""The migration's list of tables (storage/portsides.py TABLES) holds to the schema the node's migrations make, on
both engines: a table a migration adds and the port forgets would be left behind by `ai-memory migrate`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from storage.backend import open_database
from storage.migrations import DERIVED_TABLES, OUR_TABLES
from storage.pglink import COMMITS_TABLE
from storage.portsides import PG_VERSION_TABLE, TABLES


def test_the_port_moves_every_table_a_sqlite_store_has(tmp_path: Path) -> None:
    own = {t for t in OUR_TABLES - DERIVED_TABLES if not t.startswith(("memories_fts", "sqlite_"))}
    assert set(TABLES) == own
    assert len(TABLES) == len(set(TABLES))


async def test_the_port_moves_every_table_a_postgres_store_has(pg_dsn: str) -> None:
    db = await open_database(backend="postgres", path=Path(), dsn=pg_dsn)
    await db.close()
    with psycopg.connect(pg_dsn) as c:
        have = {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
    # Not moved: the schema version (the target's own migrations write it) and the writers' batch markers (the
    # source's writers, none of which writes to the target).
    assert have - {PG_VERSION_TABLE, COMMITS_TABLE} == set(TABLES)


async def test_a_table_comes_after_every_table_it_refers_to(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    db = await open_database(backend="sqlite", path=path, dsn="")
    await db.close()
    conn = sqlite3.connect(path)
    try:
        for i, table in enumerate(TABLES):
            for ref in {r[2] for r in conn.execute(f'PRAGMA foreign_key_list("{table}")')}:
                assert TABLES.index(ref) < i, f"{table} refers to {ref}, which the port copies after it"
    finally:
        conn.close()
