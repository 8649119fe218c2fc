"""The testbed's state file (DIR/testbed.json): which nodes it laid out and which pids it started.

`testbed down` stops exactly the pids recorded here, and only while each pid is still the process
we started (same /proc start time), so a recycled pid is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.errors import TestbedError
from testbed.mesh.build import MeshLayout, NodeSpec

STATE_NAME = "testbed.json"
STATE_VERSION = 1
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL after this many seconds
POLL_S = 0.05


@dataclass
class NodeState:
    index: int
    agent_id: str
    home: str
    port: int
    health_port: int
    mcp_http_port: int
    fingerprint: str
    pid: int
    pid_start_ticks: int  # /proc/<pid>/stat starttime: guards against pid reuse

    def spec(self) -> NodeSpec:
        return NodeSpec(index=self.index, agent_id=self.agent_id, home=Path(self.home), port=self.port,
                        health_port=self.health_port, mcp_http_port=self.mcp_http_port,
                        fingerprint=self.fingerprint)

    @property
    def mcp_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.mcp_http_port}/mcp" if self.mcp_http_port else "-"

    @property
    def ports(self) -> list[int]:
        return [p for p in (self.port, self.health_port, self.mcp_http_port) if p]


@dataclass
class TestbedState:
    root: str
    backend: str
    created_at: float
    nodes: list[NodeState] = field(default_factory=list)
    version: int = STATE_VERSION

    def layout(self) -> MeshLayout:
        return MeshLayout(root=Path(self.root), nodes=[n.spec() for n in self.nodes])

    def node(self, name: str) -> NodeState:
        """A node by index (``2``), directory name (``node-2``) or agent_id."""
        for n in self.nodes:
            if name in (str(n.index), f"node-{n.index}", n.agent_id):
                return n
        raise TestbedError("unknown_node", f"no node {name!r} in this testbed "
                                           f"(have {', '.join(str(n.index) for n in self.nodes)})")


def state_path(root: Path) -> Path:
    return root / STATE_NAME


def write_state(state: TestbedState) -> None:
    path = state_path(Path(state.root))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_state(root: Path) -> TestbedState | None:
    """The state in ``root``, or None when there is no state file."""
    path = state_path(root)
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        nodes = [NodeState(**n) for n in raw.pop("nodes")]
        return TestbedState(nodes=nodes, **raw)
    except (ValueError, TypeError, KeyError) as e:
        raise TestbedError("bad_state", f"{path} is not a testbed state file ({e}); remove it by hand") from None


def start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot, or None when ``pid`` does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses; the fields after the last ')' are fixed.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (from /proc/<pid>/stat), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def is_ours(node: NodeState) -> bool:
    """True while the recorded pid is alive and is still the process the testbed started."""
    ticks = start_ticks(node.pid)
    if ticks is None or ticks != node.pid_start_ticks:
        return False
    try:
        return Path(f"/proc/{node.pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def stop_pid(node: NodeState, grace_s: float = STOP_GRACE_S) -> str:
    """SIGTERM the node's recorded pid, SIGKILL it after ``grace_s``; returns what happened."""
    if not is_ours(node):
        return "not running"
    try:
        os.kill(node.pid, signal.SIGTERM)
    except ProcessLookupError:
        return "not running"
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not is_ours(node):
            return "stopped"
        time.sleep(POLL_S)
    if is_ours(node):
        try:
            os.kill(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            return "stopped"
        deadline = time.monotonic() + grace_s
        while is_ours(node) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return "killed"
    return "stopped"
