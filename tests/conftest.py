"""Fixtures every test directory may use."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The throwaway Postgres cluster (one per worker) and its per-test databases, for every directory.
from tests.pg import age_dsn, pg_cluster, pg_dsn  # noqa: F401  (pytest finds fixtures by name)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path (``/tmp/am-XXXXXXXX``), removed after the test.

    For trees that hold Unix sockets, whose paths may not exceed 107 bytes: ``tmp_path`` under a parallel
    run (``/tmp/pytest-of-USER/pytest-N/popen-gwN/<test name>0/``) leaves too little room for a testbed's
    ``<dir>/<run>/node-3/run/node.sock``.
    """
    path = Path(tempfile.mkdtemp(prefix="am-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start processes (marked ``integration``) first, each group in its collected order.

    They are the long ones: under parallel workers, starting them first leaves the short tests to fill the
    workers at the end instead of one long test finishing alone.
    """
    items.sort(key=lambda item: item.get_closest_marker("integration") is None)
