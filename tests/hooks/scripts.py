"""Small hook programs the tests write into tmp dirs, and the hooks.toml that wires them.

``exec_hook.py MODE [ARG]``: one fire per process. ``daemon_hook.py``: JSON-RPC over NDJSON, behaviour
chosen by the payload's content. Both append ``<hook name> <event> <payload JSON>`` to $HOOK_LOG when set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXEC_HOOK = r'''
import json, os, sys, time
req = json.load(sys.stdin)
log = os.environ.get("HOOK_LOG")
if log:
    with open(log, "a") as f:
        f.write(f"{req['hook']} {req['event']} {json.dumps(req['payload'])}\n")
mode = sys.argv[1]
arg = sys.argv[2] if len(sys.argv) > 2 else ""
if mode == "allow":
    print(json.dumps({"decision": "allow"}))
elif mode == "deny":
    print(json.dumps({"decision": "deny", "code": arg, "reason": "refused by the test hook"}))
elif mode == "modify":
    print(json.dumps({"decision": "modify", "delta": json.loads(arg)}))
elif mode == "ask":
    print(json.dumps({"decision": "ask_user", "prompt": arg, "options": ["approve", "deny"], "default": "deny"}))
elif mode == "hang":
    if arg:
        with open(arg, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(3600)
elif mode == "slow_allow":
    time.sleep(float(arg))
    print(json.dumps({"decision": "allow"}))
elif mode == "crash":
    sys.exit(3)
elif mode == "garbage":
    print("this is not a decision {")
'''

DAEMON_HOOK = r'''
import json, os, sys, time
log = os.environ.get("HOOK_LOG")
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "shutdown":
        break
    params = msg["params"]
    payload = params["payload"]
    text = json.dumps(payload)
    if log:
        with open(log, "a") as f:
            f.write(f"{params['hook']} {params['event']} {json.dumps(sorted(payload))}\n")
    if "die now" in text:
        sys.exit(1)
    if "stall" in text:
        time.sleep(60)
    if "take a while" in text:
        time.sleep(0.2)
    if "garble" in text:
        print("garbage line", flush=True)
        continue
    if "forbidden" in text:
        result = {"decision": "deny", "code": "forbidden_topic", "reason": "that topic is off limits"}
    else:
        result = {"decision": "allow"}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
'''


def write_scripts(d: Path) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "exec_hook.py").write_text(EXEC_HOOK)
    (d / "daemon_hook.py").write_text(DAEMON_HOOK)
    return d / "exec_hook.py", d / "daemon_hook.py"


def hook(name: str, events: list[str], script: Path, *args: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "events": events, "command": [sys.executable, str(script), *args], **extra}


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def write_hooks_toml(path: Path, hooks: list[dict[str, Any]]) -> Path:
    """Write hooks.toml atomically (a reader never sees half a file)."""
    lines = []
    for h in hooks:
        lines.append("[[hooks]]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in h.items())
        lines.append("")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(path)
    return path
