"""SocketClientBackend across a lost connection, against a real Unix socket whose far end drops a call
after reading it (what a node that dies mid-call looks like): reads are sent again, writes are not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

from node.config import LimitsConfig
from node.errors import ServiceError
from node.mcp.socket import SocketClientBackend, encode_frame, read_frame

TEST_TIMEOUT_S = 30


class DropsFirstCall:
    """Serves the socket: on the first connection reads one request and closes without answering; after
    that answers every request with ``{"ok": {"tool": name, "n": k}}``. Records what it read."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.connections = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = self.connections == 1
        try:
            while (req := await read_frame(reader)) is not None:
                self.requests.append(req["tool"])
                if first:
                    return  # the answer is lost with the connection
                writer.write(encode_frame({"ok": {"tool": req["tool"], "n": len(self.requests)}}))
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def server(tmp_path: Path):
    handler = DropsFirstCall()
    path = tmp_path / "node.sock"
    srv = await asyncio.start_unix_server(handler, str(path))
    try:
        yield handler, path
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_read_whose_answer_was_lost_is_sent_again(server) -> None:
    handler, path = server
    with anyio.fail_after(TEST_TIMEOUT_S):
        client = await SocketClientBackend.connect(path, limits=LimitsConfig())
        try:
            assert await client.call("memory_list", {}) == {"tool": "memory_list", "n": 2}
        finally:
            await client.close()
    assert handler.requests == ["memory_list", "memory_list"] and handler.connections == 2


@pytest.mark.parametrize("tool", ["memory_kg_query", "memory_find_paths", "memory_kg_timeline"])
async def test_a_graph_walk_whose_answer_was_lost_is_sent_again(server, tool: str) -> None:
    handler, path = server
    with anyio.fail_after(TEST_TIMEOUT_S):
        client = await SocketClientBackend.connect(path, limits=LimitsConfig())
        try:
            assert await client.call(tool, {}) == {"tool": tool, "n": 2}
        finally:
            await client.close()
    assert handler.requests == [tool, tool]


async def test_a_write_whose_answer_was_lost_is_not_run_again(server) -> None:
    handler, path = server
    with anyio.fail_after(TEST_TIMEOUT_S):
        client = await SocketClientBackend.connect(path, limits=LimitsConfig())
        try:
            with pytest.raises(ServiceError) as e:
                await client.call("memory_store", {"content": "x"})
            assert e.value.code == "node_restarted" and "may or may not have been applied" in e.value.message
            assert handler.requests == ["memory_store"]  # sent once, never again behind the caller's back
            # the session goes on: the next call uses a new connection
            assert await client.call("memory_get", {"id": "a"}) == {"tool": "memory_get", "n": 2}
        finally:
            await client.close()


async def test_a_connection_closed_before_the_call_is_replaced_and_the_write_sent_once(tmp_path: Path) -> None:
    requests: list[str] = []
    open_writers: list[asyncio.StreamWriter] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_writers.append(writer)
        try:
            while (req := await read_frame(reader)) is not None:
                requests.append(req["tool"])
                writer.write(encode_frame({"ok": req["tool"]}))
                await writer.drain()
        finally:
            writer.close()

    path = tmp_path / "node.sock"
    first = await asyncio.start_unix_server(answer, str(path))
    with anyio.fail_after(TEST_TIMEOUT_S):
        client = await SocketClientBackend.connect(path, limits=LimitsConfig())
        try:
            assert await client.call("memory_list", {}) == "memory_list"
            first.close()  # the node stops and closes its connections (a restart is next)
            for w in open_writers:
                w.close()
            await first.wait_closed()
            path.unlink(missing_ok=True)
            for _ in range(1000):  # the client's loop sees the EOF, as an idle MCP session's does
                if not client.is_open():
                    break
                await asyncio.sleep(0.01)
            second = await asyncio.start_unix_server(answer, str(path))
            try:
                assert await client.call("memory_store", {"content": "x"}) == "memory_store"
            finally:
                second.close()
                await second.wait_closed()
        finally:
            await client.close()
    assert requests == ["memory_list", "memory_store"] and client.reconnects == 1


async def test_no_node_coming_back_is_node_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "node.sock"
    srv = await asyncio.start_unix_server(lambda r, w: w.close(), str(path))
    with anyio.fail_after(TEST_TIMEOUT_S):
        client = await SocketClientBackend.connect(path, limits=LimitsConfig(), reconnect_window_s=0.3)
        srv.close()
        await srv.wait_closed()
        path.unlink(missing_ok=True)
        try:
            with pytest.raises(ServiceError) as e:
                await client.call("memory_list", {})
            assert e.value.code == "node_unavailable"
        finally:
            await client.close()
