"""The Postgres fixtures: a throwaway PostgreSQL 15 cluster per session (testbed/env/postgres.py), a fresh
database per test.

Where the server binaries are missing the Postgres tests skip, saying what to install; where the
Apache AGE extension is missing the AGE tests skip, saying how to build it (both from testbed/env/doctor.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.env import doctor
from testbed.env.postgres import Cluster, throwaway_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    if reason := doctor.missing("postgres"):
        pytest.skip(reason)
    with throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_dsn(pg_cluster: Cluster) -> Iterator[str]:
    """A fresh, empty database for one test."""
    name = pg_cluster.create_db()
    try:
        yield pg_cluster.dsn(name)
    finally:
        pg_cluster.drop_db(name)


@pytest.fixture
def age_dsn(pg_cluster: Cluster) -> Iterator[str]:
    """A fresh database with the AGE extension created."""
    if not pg_cluster.has_age():
        pytest.skip(doctor.missing("age") or "the test cluster offers no Apache AGE extension (scripts/system-deps)")
    name = pg_cluster.create_db(age=True)
    try:
        yield pg_cluster.dsn(name)
    finally:
        pg_cluster.drop_db(name)
