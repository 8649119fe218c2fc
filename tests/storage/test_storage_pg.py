"""What only the Postgres backend has: connecting, its schema guard, the translated migrations."""

from __future__ import annotations

import psycopg
import pytest

from storage import MAX_SUPPORTED_SCHEMA, StorageError, migrations
from storage.backend import open_database
from storage.pg import PgDatabase, pg_statements


async def test_a_dsn_that_does_not_connect_is_a_clear_error(tmp_path) -> None:
    dsn = f"host={tmp_path} port=1 dbname=nope user=nobody password=hunter2-secret"
    with pytest.raises(StorageError) as err:
        await open_database(backend="postgres", path=tmp_path / "x.db", dsn=dsn)
    assert err.value.code == "storage_unavailable" and f"host={tmp_path}" in err.value.message
    assert "hunter2" not in err.value.message and "password=***" in err.value.message


async def test_migrating_twice_changes_nothing_and_reaches_max_schema(pg_dsn: str) -> None:
    db = await PgDatabase.open_pg(pg_dsn)
    assert db.schema_version == MAX_SUPPORTED_SCHEMA
    await db.close()
    with psycopg.connect(pg_dsn) as c:
        before = c.execute("SELECT table_name, column_name, data_type FROM information_schema.columns "
                           "WHERE table_schema = 'public' ORDER BY 1, 2").fetchall()
    db = await PgDatabase.open_pg(pg_dsn)
    await db.close()
    with psycopg.connect(pg_dsn) as c:
        after = c.execute("SELECT table_name, column_name, data_type FROM information_schema.columns "
                          "WHERE table_schema = 'public' ORDER BY 1, 2").fetchall()
    assert before == after


async def test_schema_too_new_is_refused_and_left_unchanged(pg_dsn: str) -> None:
    await (await PgDatabase.open_pg(pg_dsn)).close()
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("UPDATE am_schema SET version = %s", (MAX_SUPPORTED_SCHEMA + 5,))
    with pytest.raises(StorageError) as err:
        await PgDatabase.open_pg(pg_dsn)
    assert err.value.code == "schema_too_new" and f"schema {MAX_SUPPORTED_SCHEMA + 5}" in err.value.message
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SELECT version FROM am_schema").fetchone()[0] == MAX_SUPPORTED_SCHEMA + 5


async def test_a_database_of_another_application_is_refused(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE invoices (id int)")
    with pytest.raises(StorageError) as err:
        await PgDatabase.open_pg(pg_dsn)
    assert err.value.code == "foreign_database" and "invoices" in err.value.message


async def test_age_on_without_the_extension_is_a_clear_error(pg_dsn: str) -> None:
    with pytest.raises(StorageError) as err:
        await PgDatabase.open_pg(pg_dsn, age="on")
    assert err.value.code == "age_unavailable"


def test_plain_add_column_translates_to_an_idempotent_postgres_statement() -> None:
    m = migrations.Migration(99, "t", ("ALTER TABLE memories ADD COLUMN signature BLOB NULL",
                                       "ALTER TABLE memories ADD COLUMN attest_level TEXT NOT NULL DEFAULT 'unsigned'",
                                       "ALTER TABLE memories ADD COLUMN n INTEGER NULL"))
    assert pg_statements(m) == [
        "ALTER TABLE memories ADD COLUMN IF NOT EXISTS signature BYTEA NULL",
        "ALTER TABLE memories ADD COLUMN IF NOT EXISTS attest_level TEXT NOT NULL DEFAULT 'unsigned'",
        "ALTER TABLE memories ADD COLUMN IF NOT EXISTS n BIGINT NULL",
    ]
