"""Every MCP request a running node reads is answered: raw HTTP POSTs to its ``/mcp`` and raw frames on its
local socket that cannot be taken each get their error within a bounded wait, and the door keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from testbed.mesh import LocalMesh, NodeSpec
from tests.integration.conftest import ROOT, wait_for
from tests.mcp.conftest import ok
from tests.mcp.spliced import spliced_stdio
from tests.mcp.test_mcp_answers import BAD_LINES, nested

pytestmark = pytest.mark.integration

TEST_TIMEOUT_S = 120
ANSWER_WAIT_S = 10.0
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
           "MCP-Protocol-Version": "2025-06-18"}


@pytest.fixture
def node(mesh_factory) -> Iterator[NodeSpec]:
    mesh: LocalMesh = mesh_factory(2)  # a mesh has two nodes at least; one of them runs
    mesh.start([1], want_links=False)
    spec = mesh.layout.node(1)
    # /healthz answers before the node's MCP doors are up: wait for both (bounded).
    wait_for(lambda: (spec.home / "run" / "node.sock").exists() and _listening(spec.mcp_http_port), "MCP doors")
    yield spec


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def mcp_url(spec: NodeSpec) -> str:
    return f"http://127.0.0.1:{spec.mcp_http_port}/mcp"


def _message(r: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a POST's answer: a JSON body, or the SSE stream's data line."""
    if r.headers.get("content-type", "").startswith("application/json"):
        return dict(r.json())
    data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:") and line[5:].strip()]
    return dict(json.loads(data[-1]))


async def _open_session(c: httpx2.AsyncClient, url: str) -> dict[str, str]:
    client = {"name": "raw", "version": "1"}
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}}
    r = await c.post(url, headers=HEADERS, content=json.dumps(init))
    assert r.status_code == 200, r.text
    headers = {**HEADERS, "Mcp-Session-Id": r.headers["mcp-session-id"]}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    r = await c.post(url, headers=headers, content=json.dumps(initialized))
    assert r.status_code == 202, r.text
    return headers


async def test_raw_http_posts_are_each_answered_with_their_code_and_id(node: NodeSpec) -> None:
    url = mcp_url(node)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with httpx2.AsyncClient(timeout=ANSWER_WAIT_S) as c:
            headers = await _open_session(c, url)
            for n, (body, code, answered_id) in enumerate(BAD_LINES):
                r = await c.post(url, headers=headers, content=body)
                answer = _message(r)
                assert r.status_code == 400 and answer["error"]["code"] == code, (body[:80], r.status_code, answer)
                assert answer["id"] == answered_id, (body[:80], answer)
                good = {"jsonrpc": "2.0", "id": n + 1, "method": "tools/call",
                        "params": {"name": "memory_store", "arguments": {"content": f"after bad body {n}"}}}
                r = await c.post(url, headers=headers, content=json.dumps(good))
                answer = _message(r)
                assert r.status_code == 200 and answer["id"] == n + 1, answer
                assert answer["result"]["structuredContent"]["content"] == f"after bad body {n}"


async def test_the_sdk_session_keeps_serving_between_bad_posts_on_its_own_session_id(node: NodeSpec) -> None:
    """The SDK's HTTP client cannot send these bodies (its JSON encoder refuses a lone surrogate and a deep
    value): raw POSTs carry them on the SDK session's own Mcp-Session-Id, and the SDK session's calls succeed
    after each."""
    url = mcp_url(node)
    session_ids: list[str] = []

    async def remember(r: httpx2.Response) -> None:
        if r.headers.get("mcp-session-id"):
            session_ids.append(r.headers["mcp-session-id"])

    with anyio.fail_after(TEST_TIMEOUT_S):
        async with httpx2.AsyncClient(event_hooks={"response": [remember]}, timeout=ANSWER_WAIT_S) as sdk_http, \
                streamable_http_client(url, http_client=sdk_http) as (r, w), \
                ClientSession(r, w, read_timeout_seconds=ANSWER_WAIT_S) as session, \
                httpx2.AsyncClient(timeout=ANSWER_WAIT_S) as raw:
            await session.initialize()
            headers = {**HEADERS, "Mcp-Session-Id": session_ids[0]}
            for n, (body, code, answered_id) in enumerate(BAD_LINES):
                answer = _message(await raw.post(url, headers=headers, content=body))
                assert answer["error"]["code"] == code and answer["id"] == answered_id, (body[:80], answer)
                assert (await ok(session, "memory_store", {"content": f"sdk call {n}"}))["content"] == f"sdk call {n}"


async def test_a_joined_stdio_session_answers_bad_lines_and_keeps_forwarding(node: NodeSpec) -> None:
    env = {"AI_MEMORY_HOME": str(node.home), "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    argv = [sys.executable, "-m", "node.cli", "--config", str(node.config_path), "mcp"]
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with spliced_stdio(argv, env, ROOT, node.home / "mcp-stderr.log") as s:
            caps = await ok(s.session, "memory_capabilities")
            assert caps["mcp"]["mode"] == "joined"
            for line, code, answered_id in BAD_LINES:
                answer = await s.answer(line)
                assert answer["id"] == answered_id and answer["error"]["code"] == code, (line[:80], answer)
                assert (await ok(s.session, "memory_list", {"limit": 1}))["results"] is not None


# ---- the local socket -----------------------------------------------------------------------

def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


async def read_answer(reader: asyncio.StreamReader) -> Any:
    async with asyncio.timeout(ANSWER_WAIT_S):
        (size,) = struct.unpack(">I", await reader.readexactly(4))
        return json.loads(await reader.readexactly(size))


def socket_request(tool: str, args_json: str) -> bytes:
    return f'{{"tool": "{tool}", "args": {args_json}}}'.encode()


# (frame body, the error code that answers it)
BAD_FRAMES = [
    (b"{not json", "bad_frame"),
    (b"\xff\xfe garbage", "bad_frame"),                                            # not UTF-8
    (socket_request("memory_list", "[" * 2000 + "]" * 2000), "bad_frame"),          # past the parser's 1024 levels
    (socket_request("memory_store", '{"content": "a\\ud800b"}'), "bad_frame"),      # lone surrogate escape
    (socket_request("memory_store", '{"content": "\\udc00"}'), "bad_frame"),
    (socket_request("memory_store", json.dumps({"content": "x", "tags": [nested(600)]})), "bad_input"),
    (b'["memory_list"]', "bad_request"),
    (b'{"tool": 5}', "bad_request"),
]


async def test_bad_frames_on_the_local_socket_are_answered_and_the_connection_serves_on(node: NodeSpec) -> None:
    reader, writer = await asyncio.open_unix_connection(str(node.home / "run" / "node.sock"), limit=2**25)
    try:
        for body, code in BAD_FRAMES:
            writer.write(frame(body))
            answer = await read_answer(reader)
            assert answer.get("error", {}).get("code") == code, (body[:60], answer)
            writer.write(frame(socket_request("memory_store", json.dumps({"content": f"after {body[:20]!r}"}))))
            assert (await read_answer(reader))["ok"]["content"] == f"after {body[:20]!r}"
    finally:
        writer.close()


@pytest.mark.parametrize("cut", [b"\x00\x00", struct.pack(">I", 100) + b'{"tool": ', struct.pack(">I", 2**31)])
async def test_a_frame_whose_framing_is_lost_is_answered_before_the_connection_closes(node: NodeSpec,
                                                                                       cut: bytes) -> None:
    """Cut inside its header or body (the writer half-closes), or longer than the cap: one error answer, then EOF."""
    reader, writer = await asyncio.open_unix_connection(str(node.home / "run" / "node.sock"))
    try:
        writer.write(cut)
        if cut != struct.pack(">I", 2**31):
            writer.write_eof()
        answer = await read_answer(reader)
        assert answer["error"]["code"] == "bad_frame", answer
        async with asyncio.timeout(ANSWER_WAIT_S):
            assert await reader.read() == b""
    finally:
        writer.close()
