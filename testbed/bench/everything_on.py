"""Everything on (issue 16): the daemon post_recall hook, a 1,000-rule enforcing permission gate and
signed memory versions, written into node homes before a mesh starts (``testbed bench --everything-on``).

The hook daemon, ``hooks_toml`` and ``rules_toml`` are also what hooks_bench, permissions_bench and
recall_bench here use, so every "everything on" figure runs the same hook and the same rules. Signed memory
versions need no file: a testbed node has its identity key (testbed/mesh/build.py) and the node signs each
memory version with it (``capabilities.signing``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.mesh.build import MeshLayout

RULES = 1000
HOOK_NAME = "everything-on-daemon"

# An allow-everything post_recall daemon: one JSON-RPC request per line, one answer per line.
DAEMON = r'''
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" in msg:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"decision": "allow"}}) + "\n")
        sys.stdout.flush()
'''

# The permissions bench's agent and namespace: rules_toml writes rules on every ancestor of NAMESPACE.
BENCH_AGENT = "ai:bench@lab"
NAMESPACE = "org/unit/team/notes"


def hooks_toml(path: Path, name: str, mode: str, command: list[str]) -> None:
    path.write_text(f'[[hooks]]\nname = "{name}"\nevents = ["post_recall"]\nmode = "{mode}"\n'
                    f"command = {json.dumps(command)}\n", encoding="utf-8")


def rules_toml(n: int) -> str:
    """``n`` enforcing rules naming 200 agents over 1,000 namespaces four levels deep, with rules on every
    ancestor of NAMESPACE, so a decision walks a real chain (deny first, inheritance, an ``inherit = false``
    barrier)."""
    lines = ['mode = "enforce"']
    ancestors = ["org", "org/unit", "org/unit/team", NAMESPACE]
    fixed = [("*", "org", "store", "allow", True), (BENCH_AGENT, "org/unit", "link", "deny", True),
             ("ai:other@lab", "org/unit/team", "store", "deny", True), ("*", NAMESPACE, "recall", "allow", False)]
    for i in range(n - len(fixed)):
        ns = f"tenant{i % 250}/area{i % 7}/team{i}/sub" if i % 10 else ancestors[i % 4]
        agent = f"ai:agent-{i % 200}@lab" if i % 10 else f"ai:peer-{i}@lab"
        action = ("allow", "deny", "ask")[i % 3]
        fixed.append((agent, ns, ("store", "update", "link", "recall")[i % 4], action, True))
    for agent, ns, op, action, inherit in fixed:
        lines += ["[[rules]]", f'agent = "{agent}"', f'namespace = "{ns}"', f'operations = ["{op}"]',
                  f'action = "{action}"', f"inherit = {'true' if inherit else 'false'}"]
    return "\n".join(lines) + "\n"


def mesh_rules(layout: MeshLayout, n: int = RULES) -> str:
    """``n`` rules in all: the permissions bench's, plus one allow per mesh node (any namespace, any
    operation), so the gate enforces 1,000 rules and still lets every node's traffic through."""
    text = rules_toml(n - len(layout.nodes))
    for spec in layout.nodes:
        text += (f'[[rules]]\nagent = "{spec.agent_id}"\nnamespace = "*"\noperations = ["*"]\n'
                 'action = "allow"\ninherit = true\n')
    return text


def apply(layout: MeshLayout) -> None:
    """Write daemon.py, hooks.toml and permissions.toml into every node home (the node reads them at start)."""
    rules = mesh_rules(layout)
    for spec in layout.nodes:
        daemon = spec.home / "hooks-daemon.py"
        daemon.write_text(DAEMON, encoding="utf-8")
        hooks_toml(spec.home / "hooks.toml", HOOK_NAME, "daemon", [sys.executable, str(daemon)])
        (spec.home / "permissions.toml").write_text(rules, encoding="utf-8")


def loaded(caps: dict[str, Any]) -> dict[str, Any]:
    """What a running node reports of the three (from ``memory_capabilities``)."""
    hooks = caps.get("hooks") or {}
    perms = caps.get("permissions") or {}
    return {"hooks": [h["name"] for h in hooks.get("hooks", []) if h.get("enabled")],
            "hook_runners": {h["name"]: h.get("runner") for h in hooks.get("hooks", [])},
            "permissions_mode": perms.get("mode"), "rules": perms.get("rules", 0),
            "signing": bool(caps.get("signing"))}


def check(caps: dict[str, Any], agent_id: str) -> dict[str, Any]:
    """``loaded(caps)``, or TestbedError when the node does not run all three as written (the hook's daemon
    must be running: it starts on the hook's first call, so ask after a recall)."""
    got = loaded(caps)
    runner = got["hook_runners"].get(HOOK_NAME) or {}
    if got["hooks"] != [HOOK_NAME] or got["permissions_mode"] != "enforce" or got["rules"] != RULES \
            or not got["signing"] or runner.get("state") != "running":
        raise TestbedError("everything_on_not_loaded", f"{agent_id} does not run everything on: {got}")
    return got
