"""Typed access to sqlite3 results: sqlite3 hands back untyped rows, these say what a query returns."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from storage.errors import StorageCode, StorageError

Row = tuple[Any, ...]


def scalar_int(conn: sqlite3.Connection, sql: str, params: Sequence[object] = ()) -> int:
    """The integer in the first column of the first row (count(*), coalesce(max(..), 0), RETURNING value)."""
    row = conn.execute(sql, params).fetchone()
    if row is None or not isinstance(row[0], int):
        raise StorageError(StorageCode.SQL_ERROR, f"expected one integer from `{sql}`, got {row!r}")
    return row[0]


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The rowid of the row ``cur``'s INSERT just wrote."""
    if cur.lastrowid is None:
        raise StorageError(StorageCode.SQL_ERROR, "the INSERT reported no rowid")
    return cur.lastrowid
