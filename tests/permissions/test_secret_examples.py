"""The examples docs/permissions.md gives for the two HMAC keys work as written: docs/examples/webhook_receiver.py
verifies a real node's deliveries (and refuses a forged one), docs/examples/approval_client.py signs requests the
approval API takes. Each runs as its own process, with the key as an operator has it (the hex text)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from node.permissions import approval_api
from tests.permissions.test_approval_api import api  # noqa: F401 (a fixture)
from tests.permissions.test_approvals import _parked
from tests.permissions.test_webhooks import _free_port, node  # noqa: F401 (node: a fixture)

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
WAIT_S = 20.0


async def _line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
    assert line, "the example ended without a line"
    return dict(json.loads(line))


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


async def test_the_webhook_receiver_example_verifies_a_nodes_deliveries(node) -> None:  # noqa: F811
    svc, _ = node
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hook"
    receiver = [sys.executable, str(EXAMPLES / "webhook_receiver.py"), "--port", str(port)]
    refused = await asyncio.create_subprocess_exec(*receiver, env={"AIMEM_WEBHOOK_SECRET": "not hex"},
                                                   stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    assert await asyncio.wait_for(refused.wait(), WAIT_S) == 2  # no usable secret: it does not run unverified
    secret = await svc.webhooks.subscribe(url, ["memory.stored"])  # as `ai-memory subscriptions add` prints it
    proc = await asyncio.create_subprocess_exec(*receiver, env={"AIMEM_WEBHOOK_SECRET": secret["secret"]},
                                                stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    try:
        assert (await _line(proc))["listening"] == port
        stored = await svc.memory_store("signed, verified", namespace="elsewhere")
        got = await _line(proc)
        assert got["verified"] is True and got["event"] == "memory.stored" and got["data"]["id"] == stored["id"]
        # Keyed with the secret's characters rather than the bytes they spell: not the node's signature.
        body, ts = b'{"event": "memory.stored", "data": {}}', str(time.time_ns() // 1_000_000)
        wrong = hmac.new(secret["secret"].encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        status = await asyncio.to_thread(_post, url, body, {"X-Webhook-Timestamp": ts, "X-Webhook-Signature": wrong})
        assert status == 401 and (await _line(proc))["verified"] is False
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), WAIT_S)


async def test_the_approval_client_example_signs_requests_the_api_takes(api, cfg: NodeConfig) -> None:  # noqa: F811
    svc, base, _ = api
    action = await _parked(svc)
    key_file = approval_api.key_path(cfg)

    async def client(*args: str) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLES / "approval_client.py"), "--key",
                                                    str(key_file), "--url", base, *args,
                                                    stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
        out, _ = await asyncio.wait_for(proc.communicate(), WAIT_S)
        return dict(json.loads(out))

    listed = await client("list")
    assert listed["status"] == 200 and [a["id"] for a in listed["answer"]["results"]] == [action]
    decided = await client("approve", action, "--by", "ops@lab")
    assert decided["status"] == 200 and decided["answer"]["status"] == "applied"
