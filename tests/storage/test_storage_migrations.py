"""Migrations are idempotent and the open guard refuses files it must not touch, byte for byte."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from storage_helpers import schema_dump

from storage import MAX_SUPPORTED_SCHEMA, Database, StorageError, migrations


async def test_open_creates_parent_dir_and_reaches_max_schema(db_path: Path):
    db = await Database.open(db_path)
    try:
        assert await asyncio.to_thread(db_path.exists)
        assert db.schema_version == MAX_SUPPORTED_SCHEMA
    finally:
        await db.close()


async def test_open_sets_wal_and_application_id(db_path: Path):
    await (await Database.open(db_path)).close()
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA application_id").fetchone()[0] == migrations.APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == MAX_SUPPORTED_SCHEMA
    conn.close()


async def test_reopening_gives_identical_sqlite_master(db_path: Path):
    await (await Database.open(db_path)).close()
    first = schema_dump(db_path)
    await (await Database.open(db_path)).close()
    assert schema_dump(db_path) == first
    assert {r[1] for r in first} >= {"memories", "memories_fts", "memory_links", "signed_events",
                                      "a2a_outbox", "a2a_dead_letters", "change_log", "peer_state", "counters"}


def test_running_every_migration_twice_directly_changes_nothing(tmp_path: Path):
    path = tmp_path / "direct.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for m in migrations.MIGRATIONS:
        migrations.run_statements(conn, m)
    once = conn.execute("SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master ORDER BY name").fetchall()
    for m in migrations.MIGRATIONS:
        migrations.run_statements(conn, m)
    twice = conn.execute("SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master ORDER BY name").fetchall()
    assert once == twice
    conn.close()


def test_apply_skips_a_migration_already_recorded(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    assert migrations.migrate(conn) == MAX_SUPPORTED_SCHEMA
    assert [migrations.apply(conn, m) for m in migrations.MIGRATIONS] == [False] * len(migrations.MIGRATIONS)
    conn.close()


def test_failed_migration_rolls_back_and_keeps_the_old_version(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    broken = migrations.Migration(1, "broken", ("CREATE TABLE IF NOT EXISTS t(x)", "THIS IS NOT SQL"))
    with pytest.raises(sqlite3.Error):
        migrations.apply(conn, broken)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 't'").fetchone()[0] == 0
    conn.close()


async def test_schema_too_new_is_refused_and_the_file_is_unchanged(db_path: Path):
    await (await Database.open(db_path)).close()
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA journal_mode = DELETE")  # fold the WAL in, so the main file holds everything
    conn.execute(f"PRAGMA user_version = {MAX_SUPPORTED_SCHEMA + 5}")
    conn.close()
    before = await asyncio.to_thread(db_path.read_bytes)
    with pytest.raises(StorageError) as err:
        await Database.open(db_path)
    assert err.value.code == "schema_too_new"
    assert f"schema {MAX_SUPPORTED_SCHEMA + 5}" in err.value.message
    assert f"up to {MAX_SUPPORTED_SCHEMA}" in err.value.message
    assert await asyncio.to_thread(db_path.read_bytes) == before
    assert not await asyncio.to_thread(db_path.with_name(db_path.name + "-wal").exists)


@pytest.mark.parametrize("content", [b"hello, this is a text file, not a database\n" * 20, bytes(range(256)) * 16])
async def test_not_a_database_is_refused_and_the_file_is_unchanged(tmp_path: Path, content: bytes):
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(StorageError) as err:
        await Database.open(path)
    assert err.value.code == "not_a_database"
    assert path.read_bytes() == content


async def test_foreign_sqlite_database_is_refused_and_the_file_is_unchanged(tmp_path: Path):
    path = tmp_path / "someone-else.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO invoices (total) VALUES (9.5)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StorageError) as err:
        await Database.open(path)
    assert err.value.code == "foreign_database"
    assert "invoices" in err.value.message
    assert path.read_bytes() == before


async def test_sqlite_file_of_another_application_id_is_refused(tmp_path: Path):
    path = tmp_path / "other-app.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1234")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with pytest.raises(StorageError) as err:
        await Database.open(path)
    assert err.value.code == "foreign_database"


async def test_empty_file_becomes_a_new_database(tmp_path: Path):
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    db = await Database.open(path)
    assert db.schema_version == MAX_SUPPORTED_SCHEMA
    await db.close()


def test_migration_9_marks_stored_versions_signed_over_the_old_fields_and_restarts_every_sync_cursor(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "m9.db", isolation_level=None)
    for m in migrations.MIGRATIONS[:8]:
        migrations.apply(conn, m)
    conn.execute("INSERT INTO memories (id, namespace, content, origin, created_at, updated_at, share_with) "
                 "VALUES ('m1', 'secret', 'c', 'ai:a@lab', 1, 1, '[\"ai:a@lab\"]')")
    conn.execute("INSERT INTO peer_state (peer, last_sync_seq) VALUES ('ai:b@lab', 42)")
    assert migrations.migrate(conn) == MAX_SUPPORTED_SCHEMA
    assert conn.execute("SELECT signed_set, share_with FROM memories").fetchall() == [(1, '["ai:a@lab"]')]
    assert conn.execute("SELECT last_sync_seq FROM peer_state").fetchall() == [(0,)]
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE memories SET signed_set = 3")
    conn.close()
