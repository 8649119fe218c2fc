"""Fixtures for the storage tests: real SQLite files under tmp_path, no mocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import Database


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "node" / "memory.db"


@pytest.fixture
async def db(db_path: Path):
    database = await Database.open(db_path)
    yield database
    await database.close()
