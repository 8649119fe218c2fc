"""Fixtures of the mesh tests."""

from __future__ import annotations

import pytest

from tests.mesh.wire_fixture import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The wire tests' CA with a server and a client identity, made once per worker (nothing changes them).
    test_ca_tls.py has a ``pki`` of its own (a fresh one per test)."""
    return make_pki(tmp_path_factory.mktemp("pki"))
