"""The plain health port listens where `mesh.health_host` says (loopback by default), so a Prometheus on another
host can scrape it when the operator chooses; shown on ::1 against 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mesh.server import MeshServer, ServerHooks
from node.config import from_dict
from tests.mesh.wire_fixture import SERVER_ID, make_pki


def _free_port(family: socket.AddressFamily, host: str) -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _status(url: str) -> int | str:
    try:
        with urllib.request.urlopen(url, timeout=5.0) as r:
            return int(r.status)
    except urllib.error.URLError as e:
        return type(e.reason).__name__


def test_the_health_host_defaults_to_loopback_and_is_validated() -> None:
    assert from_dict({}, env={}).mesh.health_host == "127.0.0.1"
    assert from_dict({"mesh": {"health_host": "::"}}, env={}).mesh.health_host == "::"
    with pytest.raises(Exception, match="mesh.health_host"):
        from_dict({"mesh": {"health_host": " "}}, env={})


async def test_the_health_port_listens_on_the_health_host(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine (the test binds ::1)")
    from a2a import SeenCache
    from mesh.receive import Receiver

    async def apply(env, sender):  # pragma: no cover (no message is sent)
        raise AssertionError

    pki = make_pki(tmp_path)
    receiver = Receiver(SERVER_ID, SeenCache(10), apply, max_bytes=1 << 20, clock_ms=lambda: 0)
    hooks = ServerHooks(receiver=receiver, pinned=dict, health=lambda: {"status": "ok"})
    try:
        port = _free_port(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("::1 cannot be bound here")
    server = MeshServer(hooks, pki.ctx(SERVER_ID, server=True), "127.0.0.1", 0, health_port=port, health_host="::1")
    await server.start()
    try:
        assert await asyncio.to_thread(_status, f"http://[::1]:{port}/healthz") == 200
        assert await asyncio.to_thread(_status, f"http://127.0.0.1:{port}/healthz") == "ConnectionRefusedError"
    finally:
        await server.stop(2.0)
