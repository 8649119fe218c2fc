"""The connection shape the table modules use, met by ``sqlite3.Connection`` and by the Postgres adapter.

Statements are written once, with ``?`` placeholders and SQL that both engines accept; the Postgres
adapter (storage/pg.py) translates the placeholders.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol


class Cursor(Protocol):
    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Any: ...
