"""storage/rows.py: a query that does not return what its caller expects fails as a StorageError."""

from __future__ import annotations

import sqlite3

import pytest

from storage import StorageError
from storage.rows import inserted_id, scalar_int


@pytest.fixture
def conn() -> sqlite3.Connection:
    c = sqlite3.connect(":memory:")
    c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
    return c


def test_scalar_int_returns_the_first_column_of_the_first_row(conn: sqlite3.Connection) -> None:
    conn.executemany("INSERT INTO t (name) VALUES (?)", [("a",), ("b",)])
    assert scalar_int(conn, "SELECT count(*) FROM t") == 2
    assert scalar_int(conn, "SELECT id FROM t WHERE name = ?", ("b",)) == 2


@pytest.mark.parametrize("sql", ["SELECT name FROM t", "SELECT id FROM t WHERE name = 'nobody'"])
def test_scalar_int_without_an_integer_is_a_storage_error(conn: sqlite3.Connection, sql: str) -> None:
    conn.execute("INSERT INTO t (name) VALUES ('a')")
    with pytest.raises(StorageError) as err:
        scalar_int(conn, sql)
    assert err.value.code == "sql_error" and sql in err.value.message


def test_inserted_id_is_the_new_rowid(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO t (name) VALUES ('a')")
    assert inserted_id(conn.execute("INSERT INTO t (name) VALUES ('b')")) == 2
