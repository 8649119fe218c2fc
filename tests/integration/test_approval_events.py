"""Approval events from every process: an ask parked, or decided, by a CLI command fires the on_approval_* hooks
in that command every time (before it exits), and reaches the running node's SSE stream exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.permissions.approval_api import signed_headers
from testbed.mesh import LocalMesh, NodeSpec
from tests.hooks.scripts import write_hooks_toml
from tests.integration.conftest import run_cli, wait_for
from tests.integration.peer_play import add_config
from tests.integration.test_permissions_node import _api, _free_port
from tests.permissions.conftest import ASK_TEAM_STORES as ASK_TEAM

pytestmark = pytest.mark.integration

ROUNDS = 5
STREAM_WAIT_S = 30.0

# Appends "<event> <approval_id> <choice or ->" to the file in $EVENTS_FILE: one line per fire.
EXEC_HOOK = r'''
import json, os, sys
req = json.load(sys.stdin)
p = req["payload"]
with open(os.environ["EVENTS_FILE"], "a") as f:
    f.write(f"{req['event']} {p['approval_id']} {p.get('choice', '-')}\n")
print(json.dumps({"decision": "allow"}))
'''
DAEMON_HOOK = r'''
import json, os, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "shutdown":
        break
    params = msg["params"]
    p = params["payload"]
    with open(os.environ["EVENTS_FILE"], "a") as f:
        f.write(f"{params['event']} {p['approval_id']} {p.get('choice', '-')}\n")
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"decision": "allow"}}), flush=True)
'''


def with_hook(spec: NodeSpec, mode: str) -> Path:
    """The ask rule on namespace team, and a hook of ``mode`` on both approval events; the file it writes."""
    (spec.home / "permissions.toml").write_text(ASK_TEAM, encoding="utf-8")
    script = spec.home / f"tell_{mode}.py"
    script.write_text(EXEC_HOOK if mode == "exec" else DAEMON_HOOK, encoding="utf-8")
    events = spec.home / "approval-events.log"
    write_hooks_toml(spec.home / "hooks.toml", [{
        "name": "tell", "events": ["on_approval_requested", "on_approval_decided"],
        "command": [sys.executable, str(script)], "mode": mode, "env": {"EVENTS_FILE": str(events)}}])
    return events


def fired(events: Path) -> list[tuple[str, str, str]]:
    if not events.exists():
        return []
    return [tuple(line.split(" ")) for line in events.read_text().splitlines()]  # type: ignore[misc]


def park(spec: NodeSpec, content: str) -> str:
    rc, _, err = run_cli(spec, "store", content, "--namespace", "team/x")
    assert rc == 1 and "error [approval_required]" in err, err
    found = re.search(r"pending action ([0-9a-f-]{36})", err)
    assert found is not None, err
    return found.group(1)


def decide(spec: NodeSpec, action: str, choice: str) -> dict[str, Any]:
    rc, out, err = run_cli(spec, "approvals", choice, action)
    assert rc == 0, err
    return dict(out)


@pytest.fixture
def layout(mesh_factory) -> Iterator[tuple[LocalMesh, NodeSpec]]:
    mesh: LocalMesh = mesh_factory(2, mcp_http=False)  # a mesh has two nodes at least; node 1 is the one used
    yield mesh, mesh.layout.node(1)


@pytest.mark.parametrize("mode", ["exec", "daemon"])
def test_each_cli_park_and_decision_fires_its_hook_once_before_the_command_exits(layout, mode: str) -> None:
    _, spec = layout
    events = with_hook(spec, mode)
    ids = []
    for n in range(ROUNDS):
        ids.append(park(spec, f"plan {n}"))
        # The command has exited: its hook has fired already (nothing is left to fire it later).
        assert fired(events) == [("on_approval_requested", a, "-") for a in ids]
    choices = ["approve", "deny", "approve", "deny", "approve"]
    for n, (action, choice) in enumerate(zip(ids, choices, strict=True)):
        status = decide(spec, action, choice)["status"]
        assert status == ("applied" if choice == "approve" else "denied")
        assert fired(events)[ROUNDS:] == [("on_approval_decided", a, c) for a, c in zip(ids[:n + 1], choices,
                                                                                       strict=False)]


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


class Stream:
    """The node's approval event stream (signed GET), read in a task of its own: its events in order."""

    def __init__(self, base: str, key: bytes) -> None:
        self.base = base
        self.key = key
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.connected = asyncio.Event()

    async def read(self) -> None:
        path = "/v1/approvals/stream"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as s, \
                s.get(self.base + path, headers=signed_headers(self.key, "GET", path)) as r:
            assert r.status == 200
            event = None
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line == ": connected":
                    self.connected.set()
                elif line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event is not None:
                    self.events.append((event, json.loads(line[6:])))
                    event = None

    def of(self, action: str) -> list[tuple[str, str]]:
        return [(e, d["status"]) for e, d in self.events if d["id"] == action]

    async def until(self, action: str, want: list[tuple[str, str]]) -> None:
        async with asyncio.timeout(STREAM_WAIT_S):
            while self.of(action) != want:
                assert len(self.of(action)) <= len(want), self.of(action)
                await asyncio.sleep(0.05)


async def test_cli_parks_and_decisions_reach_the_running_nodes_stream_exactly_once(layout) -> None:
    mesh, spec = layout
    events = with_hook(spec, "exec")
    port = _free_port()
    add_config(spec, "approval", http_port=port)
    mesh.start([1], want_links=False)
    # /healthz answers before the approval API is up: wait for it (bounded).
    wait_for(lambda: _listening(port), "the approval API")
    key = bytes.fromhex((spec.home / "keys" / "approval.hmac").read_text().strip())
    stream = Stream(f"http://127.0.0.1:{port}", key)
    reader = asyncio.create_task(stream.read())
    try:
        async with asyncio.timeout(STREAM_WAIT_S):
            await stream.connected.wait()
        ids = [await asyncio.to_thread(park, spec, f"plan {n}") for n in range(ROUNDS)]
        choices = ["approve", "deny", "approve", "deny", "approve"]
        for action, choice in zip(ids, choices, strict=True):
            await asyncio.to_thread(decide, spec, action, choice)
        # One more, parked by the CLI and decided through the node's own API: the last thing the stream hears.
        marker = await asyncio.to_thread(park, spec, "the marker")
        status, _ = await asyncio.to_thread(_api, spec, port, "POST", f"/v1/approvals/{marker}/deny",
                                            {"decided_by": "ops"})
        assert status == 200
        await stream.until(marker, [("approval.requested", "pending"), ("approval.decided", "denied")])
        for action, choice in zip(ids, choices, strict=True):
            await stream.until(action, [("approval.requested", "pending"),
                                        ("approval.decided", "applied" if choice == "approve" else "denied")])
        assert len(stream.events) == 2 * (ROUNDS + 1), stream.events
        applied = [d for e, d in stream.events if e == "approval.decided" and d["status"] == "applied"]
        assert all(d["result"]["namespace"] == "team/x" and d["decided_by"] for d in applied)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    # The CLI commands fired their hooks, the node the marker's decision: each once, none again by the node
    # that announced the others on its stream.
    want = sorted([("on_approval_requested", a) for a in [*ids, marker]] + [("on_approval_decided", a)
                                                                           for a in [*ids, marker]])
    wait_for(lambda: len(fired(events)) >= len(want), "the node's hook on the marker's decision")
    assert sorted((e, a) for e, a, _ in fired(events)) == want
