"""Fixtures for the storage tests: real SQLite files under tmp_path and a real Postgres cluster, no mocks.

``db`` is parametrised by backend: every test that takes it runs on SQLite and on Postgres.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from storage import Database
from storage.backend import open_database
from tests.storage.storage_helpers import fill_store

BACKENDS = ("sqlite", "postgres")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "node" / "memory.db"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def db(backend: str, db_path: Path, request: pytest.FixtureRequest):
    dsn = ""
    cluster = None
    name = ""
    if backend == "postgres":
        cluster = request.getfixturevalue("pg_cluster")
        name = cluster.create_db()
        dsn = cluster.dsn(name)
    database: Database = await open_database(backend=backend, path=db_path, dsn=dsn)
    try:
        yield database
    finally:
        await database.close()
        if cluster is not None:
            cluster.drop_db(name)



@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A filled SQLite store (storage_helpers.fill_store), made once per module: (its path, the memory ids)."""
    path = tmp_path_factory.mktemp("filled") / "memory.db"
    return path, asyncio.run(fill_store(path))


@pytest.fixture
def store(filled: tuple[Path, list[str]], tmp_path: Path) -> Path:
    """A copy of the filled store, this test's to damage."""
    path = tmp_path / "node" / "memory.db"
    path.parent.mkdir(parents=True)
    shutil.copyfile(filled[0], path)
    return path
