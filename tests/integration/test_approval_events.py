"""Approval events from every process: an ask parked, or decided, by a CLI command fires the on_approval_* hooks
in that command every time (before it exits)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.mesh import LocalMesh, NodeSpec
from tests.hooks.scripts import write_hooks_toml
from tests.integration.conftest import run_cli

pytestmark = pytest.mark.integration

ASK_TEAM = 'mode = "enforce"\n[[rules]]\nagent = "*"\nnamespace = "team"\noperations = ["store"]\naction = "ask"\n'
ROUNDS = 5

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
