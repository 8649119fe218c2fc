"""The approval HTTP API over a real loopback socket: HMAC on every request, replays refused, SSE."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from node.config import NodeConfig
from node.permissions import approval_api
from node.permissions.approval_api import signed_headers
from tests.permissions.conftest import rows
from tests.permissions.test_approvals import ASK_TEAM, _parked

TIMEOUT = aiohttp.ClientTimeout(total=20)


@pytest.fixture
async def api(open_service, cfg: NodeConfig) -> AsyncIterator[tuple[Any, str, bytes]]:
    svc = await open_service(ASK_TEAM)
    handle = await approval_api.start_approval_api(svc, cfg, port=0)
    try:
        yield svc, f"http://127.0.0.1:{handle.port}", approval_api.load_or_create_key(cfg)
    finally:
        await handle.stop()


async def call(base: str, key: bytes | None, method: str, path: str, body: dict | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any]:
    raw = b"" if body is None else json.dumps(body).encode()
    hdrs = dict(headers) if headers is not None else (signed_headers(key, method, path, raw) if key else {})
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.request(method, base + path, data=raw,
                                                                      headers=hdrs) as r:
        return r.status, await r.json()


async def test_approve_over_signed_http_writes_once(api, cfg: NodeConfig) -> None:
    svc, base, key = api
    assert stat.S_IMODE(os.stat(approval_api.key_path(cfg)).st_mode) == 0o600
    action = await _parked(svc)
    status, listed = await call(base, key, "GET", "/v1/approvals?status=pending")
    assert status == 200 and [a["id"] for a in listed["results"]] == [action]
    status, decided = await call(base, key, "POST", f"/v1/approvals/{action}/approve", {"decided_by": "ops"})
    assert status == 200 and decided["status"] == "applied"
    status, again = await call(base, key, "POST", f"/v1/approvals/{action}/approve", {"decided_by": "ops"})
    assert status == 409 and again["error"]["code"] == "already_decided"
    assert rows(cfg, "SELECT content FROM memories") == [("plans",)]


async def test_unsigned_wrongly_signed_and_replayed_requests_are_401(api, cfg: NodeConfig,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    svc, base, key = api
    action = await _parked(svc)
    path = f"/v1/approvals/{action}/approve"
    status, body = await call(base, None, "POST", path, {})
    assert status == 401 and body["error"]["code"] == "unauthorized" and "unsigned" in body["error"]["message"]
    assert (await call(base, b"x" * 32, "POST", path, {}))[0] == 401
    raw = json.dumps({"decided_by": "ops"}).encode()
    hdrs = signed_headers(key, "POST", f"/v1/approvals/{action}/deny", raw)
    assert (await call(base, None, "POST", path, {"decided_by": "ops"}, hdrs))[0] == 401  # signed for deny
    stale = {**signed_headers(key, "GET", "/v1/approvals"), "X-Approval-Timestamp": "1000"}
    assert (await call(base, None, "GET", "/v1/approvals", None, stale))[0] == 401
    hdrs = signed_headers(key, "POST", path, raw)
    status, _ = await call(base, None, "POST", path, {"decided_by": "ops"}, hdrs)
    assert status == 200
    status, body = await call(base, None, "POST", path, {"decided_by": "ops"}, hdrs)
    assert status == 401 and "replayed" in body["error"]["message"]
    assert rows(cfg, "SELECT count(*) FROM memories") == [(1,)]
    assert any(r.getMessage() == "approval_api_unauthorized" for r in caplog.records)


async def test_a_rotated_key_signs_and_the_previous_one_keeps_its_grace(api, cfg: NodeConfig) -> None:
    _, base, old = api
    created_long_ago = time.time() - 10 * cfg.approval.key_grace_s
    os.utime(approval_api.key_path(cfg), (created_long_ago, created_long_ago))
    new = approval_api.rotate_key(cfg)
    assert (await call(base, new, "GET", "/v1/approvals"))[0] == 200
    assert (await call(base, old, "GET", "/v1/approvals"))[0] == 200  # within approval.key_grace_s
    assert (await call(base, b"y" * 32, "GET", "/v1/approvals"))[0] == 401


async def test_bad_input_and_expired_actions_are_clear_errors(api, cfg: NodeConfig) -> None:
    svc, base, key = api
    status, body = await call(base, key, "POST", "/v1/approvals/nope/approve", {})
    assert status == 404 and body["error"]["code"] == "not_found"
    action = await _parked(svc)
    status, body = await call(base, key, "POST", f"/v1/approvals/{action}/deny", {"who": "x"})
    assert status == 400 and body["error"]["code"] == "bad_input"
    svc.approvals.clock = lambda: 2**62
    status, body = await call(base, key, "POST", f"/v1/approvals/{action}/approve", {})
    assert status == 410 and body["error"]["code"] == "approval_expired"
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]


async def test_the_stream_announces_requested_and_decided_actions(api) -> None:
    svc, base, key = api
    path = "/v1/approvals/stream"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, \
            s.get(base + path, headers=signed_headers(key, "GET", path)) as r:
        assert r.status == 200
        assert await r.content.readline() == b": connected\n"
        await r.content.readline()
        action = await _parked(svc)
        lines = [await asyncio.wait_for(r.content.readline(), 10) for _ in range(3)]
        assert lines[0] == b"event: approval.requested\n"
        assert json.loads(lines[1][len(b"data: "):])["id"] == action
        await svc.approval_decide(action, "deny", decided_by="ops")
        lines = [await asyncio.wait_for(r.content.readline(), 10) for _ in range(3)]
        assert lines[0] == b"event: approval.decided\n" and json.loads(lines[1][6:])["status"] == "denied"
