"""The node's local socket: the stdio server joins a running node over it instead of opening the DB."""

from __future__ import annotations

import asyncio
import os
import stat

import anyio
import pytest

from node.errors import ServiceError
from node.mcp.backend import ServiceBackend
from node.mcp.socket import SocketClientBackend, encode_frame, read_frame, start_local_socket
from tests.mcp.conftest import Home, err, stdio_session
from tests.mcp.flows import walk_through

TEST_TIMEOUT_S = 90


async def test_stdio_joins_the_running_node_over_its_socket(home: Home, service) -> None:
    handle = await start_local_socket(ServiceBackend(service), home.cfg.socket_path)
    try:
        assert stat.S_IMODE(os.stat(home.cfg.socket_path).st_mode) == 0o600
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with stdio_session(home) as s:
                out = await walk_through(s)
                assert out["caps"]["mcp"] == {"transport": "stdio", "mode": "joined",
                                              "socket": str(home.cfg.socket_path), "profile": "core",
                                              "loaded": ["core", "full"]}
                assert await err(s, "memory_store", {"content": ""}) == "bad_input"
        # what the agent stored through stdio lives in the node's own service
        assert (await service.memory_get(out["a"]["id"]))["content"] == out["a"]["content"]
        assert (await service.memory_verify(out["link"]["link_id"]))["signature_verified"] is True
    finally:
        await handle.stop()
    assert not home.cfg.socket_path.exists()


async def test_stale_socket_file_is_replaced_and_a_live_one_refused(home: Home, service) -> None:
    path = home.cfg.socket_path
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = await asyncio.start_unix_server(lambda r, w: None, str(path))
    stale.close()
    await stale.wait_closed()
    path_exists_after_close = path.exists()
    if not path_exists_after_close:  # asyncio removed it; make a dead socket file by hand
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    handle = await start_local_socket(ServiceBackend(service), path)
    try:
        with pytest.raises(ServiceError) as e:
            await start_local_socket(ServiceBackend(service), path)
        assert e.value.code == "socket_in_use"
    finally:
        await handle.stop()


async def test_socket_rpc_errors_and_garbage(home: Home, service) -> None:
    handle = await start_local_socket(ServiceBackend(service), home.cfg.socket_path)
    try:
        with anyio.fail_after(TEST_TIMEOUT_S):
            client = await SocketClientBackend.connect(home.cfg.socket_path, limits=home.cfg.limits)
            try:
                m = await client.call("memory_store", {"content": "over the socket"})
                assert (await client.call("memory_get", {"id": m["id"]}))["content"] == "over the socket"
                with pytest.raises(ServiceError) as e:
                    await client.call("memory_get", {"id": 7})
                assert e.value.code == "bad_input"
                with pytest.raises(ServiceError) as e:
                    await client.call("nope", {})
                assert e.value.code == "unknown_tool"
                assert isinstance(await client.call("memory_list", {}), list)
            finally:
                await client.close()

            r, w = await asyncio.open_unix_connection(str(home.cfg.socket_path))
            w.write(encode_frame(["not", "a", "request"]))
            await w.drain()
            assert (await read_frame(r))["error"]["code"] == "bad_request"
            w.write(b"\x00\x00\x00\x03{{{")
            await w.drain()
            assert (await read_frame(r))["error"]["code"] == "bad_frame"
            w.write(encode_frame({"tool": "memory_list", "args": {}}))  # a whole frame: the framing is intact
            assert isinstance((await read_frame(r))["ok"], list)
            w.write(b"\x00\x00\x00\x09{{{")
            w.write_eof()
            assert (await read_frame(r))["error"]["code"] == "bad_frame"
            assert await read_frame(r) is None  # cut inside a frame: framing lost, the node hangs up
            w.close()
    finally:
        await handle.stop()


async def test_joined_client_reports_a_stopped_node_then_rejoins_a_restarted_one(home: Home, service) -> None:
    path = home.cfg.socket_path
    handle = await start_local_socket(ServiceBackend(service), path)
    with anyio.fail_after(TEST_TIMEOUT_S):
        # A short reconnect window: a stopped node is reported after it, not after the default 15 s.
        client = await SocketClientBackend.connect(path, limits=home.cfg.limits, reconnect_window_s=0.2)
        try:
            await client.call("memory_list", {})
            await handle.stop()
            with pytest.raises(ServiceError) as e:
                await client.call("memory_list", {})
            assert e.value.code == "node_unavailable"
            with pytest.raises(ServiceError) as e:
                await client.call("memory_list", {})
            assert e.value.code == "node_unavailable"
            handle = await start_local_socket(ServiceBackend(service), path)
            assert isinstance(await client.call("memory_list", {}), list)
        finally:
            await client.close()
            await handle.stop()
