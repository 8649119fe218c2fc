"""Streamable HTTP in-process on an ephemeral loopback port, driven by the SDK's HTTP client."""

from __future__ import annotations

import anyio
import httpx2
import pytest

from node.errors import ServiceError
from node.mcp.backend import ServiceBackend
from node.mcp.server import start_http
from tests.mcp.conftest import err, http_session, ok
from tests.mcp.flows import walk_through

TEST_TIMEOUT_S = 60


async def test_http_walk_through_on_port_zero(service) -> None:
    handle = await start_http(ServiceBackend(service), "127.0.0.1", 0)
    try:
        assert handle.port > 0 and handle.url == f"http://127.0.0.1:{handle.port}/mcp"
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with http_session(handle.url) as s:
                out = await walk_through(s)
                assert out["caps"]["mcp"] == {"transport": "streamable_http", "profile": "core",
                                              "loaded": ["core", "full"]}
                assert await err(s, "memory_store", {"content": 5}) == "bad_input"
                assert await err(s, "nope", {}) == "unknown_tool"
                assert (await ok(s, "memory_get", {"id": out["a"]["id"]}))["id"] == out["a"]["id"]
    finally:
        with anyio.fail_after(TEST_TIMEOUT_S):
            await handle.stop()
    # stopped means the port no longer answers
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with httpx2.AsyncClient() as c:
            with pytest.raises(httpx2.ConnectError):
                await c.get(handle.url, timeout=5)


async def test_http_refuses_non_loopback_host(service) -> None:
    with pytest.raises(ServiceError) as e:
        await start_http(ServiceBackend(service), "0.0.0.0", 0)
    assert "loopback" in e.value.message


async def test_http_rejects_foreign_host_header(service) -> None:
    """DNS-rebinding guard: a browser page on another origin cannot drive the node."""
    handle = await start_http(ServiceBackend(service), "127.0.0.1", 0)
    try:
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with httpx2.AsyncClient() as c:
                r = await c.post(handle.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                 headers={"Host": "evil.example", "Accept": "application/json, text/event-stream"},
                                 timeout=5)
                assert r.status_code in (400, 403, 421)
    finally:
        await handle.stop()
