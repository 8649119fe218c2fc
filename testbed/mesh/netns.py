"""Network namespaces for the local backend: one namespace per node, wired to a bridge in a hub namespace.

Layout for testbed id X (random 6 hex digits, recorded in DIR/netns.json *before* anything is created):

    am-X-hub   a bridge ``br0``; one veth end ``v<i>`` per node enslaved to it; no address, no routes
    am-X-n<i>  loopback + ``eth0`` (the other veth end) with 10.231.K.<i>/24; no default route

Nothing is created in, or routed to, the namespace this process runs in: both ends of every veth are
made directly inside testbed namespaces (``ip -n HUB link add v1 type veth peer name eth0 netns N1``),
so deleting the namespaces removes every interface the testbed made. Node processes run inside their
namespace (``ip netns exec``), listen on their address, and keep health and MCP HTTP on that
namespace's loopback; the testbed reaches those by entering the namespace with setns(2) on one thread.

`testbed up --netns` and `down` are testbed/mesh/control.py's up_netns and down_netns. The delay helpers
testbed/faults.py starts inside the namespaces are recorded in DIR/netns.json too, and teardown stops them.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.errors import TestbedError
from testbed.mesh.state import start_ticks
from testbed.paths import ROOT

NETNS_STATE = "netns.json"
PREFIX = "am-"
SUBNET = "10.231.{k}.0/24"  # private to the testbed; never routed anywhere
BRIDGE = "br0"
NODE_IF = "eth0"
CMD_TIMEOUT_S = 15.0
HELPER_STOP_S = 5.0
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class NodeNet:
    index: int
    ns: str
    addr: str
    hub_if: str


@dataclass
class NetState:
    """DIR/netns.json: what the testbed created (or was about to) and the faults applied."""

    id: str
    k: int
    hub: str
    nodes: list[NodeNet] = field(default_factory=list)
    created: list[str] = field(default_factory=list)  # namespaces in creation order
    faults: dict[str, dict] = field(default_factory=dict)  # node index -> {delay_ms, jitter_ms, loss_pct, pid...}
    partitions: list[list[int]] = field(default_factory=list)

    def node(self, index: int) -> NodeNet:
        for n in self.nodes:
            if n.index == index:
                return n
        raise TestbedError("unknown_node", f"node {index} has no namespace in this testbed")

    @property
    def namespaces(self) -> list[str]:
        return [n.ns for n in self.nodes] + [self.hub]


def _run(argv: list[str], *, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, input=input,
                           stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TestbedError("netns_failed", f"`{' '.join(argv)}` did not finish in {CMD_TIMEOUT_S:g} s") from None
    if check and r.returncode != 0:
        raise TestbedError("netns_failed", f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


def in_ns(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", "netns", "exec", ns, *argv], check=check)


def existing() -> set[str]:
    r = _run(["ip", "netns", "list"], check=False)
    return {line.split()[0] for line in r.stdout.splitlines() if line.strip()}


def plan(n: int) -> NetState:
    sid = secrets.token_hex(3)
    k = int(sid[:2], 16)  # one /24 per testbed; namespaces are isolated, so overlaps would not leak anyway
    net = NetState(id=sid, k=k, hub=f"{PREFIX}{sid}-hub")
    for i in range(1, n + 1):
        net.nodes.append(NodeNet(index=i, ns=f"{PREFIX}{sid}-n{i}", addr=f"10.231.{k}.{i}", hub_if=f"v{i}"))
    return net


def read_net(root: Path) -> NetState | None:
    path = Path(root) / NETNS_STATE
    if not path.exists():
        return None
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["nodes"] = [NodeNet(**n) for n in raw["nodes"]]
    return NetState(**raw)


def write_net(root: Path, net: NetState) -> None:
    path = Path(root) / NETNS_STATE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(net), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def create(root: Path, net: NetState) -> None:
    """Create the hub, the bridge and one namespace + veth per node; recorded before each step."""
    write_net(root, net)
    for ns in [net.hub] + [n.ns for n in net.nodes]:
        net.created.append(ns)
        write_net(root, net)
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    _run(["ip", "-n", net.hub, "link", "add", BRIDGE, "type", "bridge"])
    _run(["ip", "-n", net.hub, "link", "set", BRIDGE, "up"])
    for n in net.nodes:
        _run(["ip", "-n", net.hub, "link", "add", n.hub_if, "type", "veth", "peer", "name", NODE_IF, "netns", n.ns])
        _run(["ip", "-n", net.hub, "link", "set", n.hub_if, "master", BRIDGE, "up"])
        _run(["ip", "-n", n.ns, "addr", "add", f"{n.addr}/24", "dev", NODE_IF])
        _run(["ip", "-n", n.ns, "link", "set", NODE_IF, "up"])


def teardown(root: Path) -> list[str]:
    """Delete exactly the namespaces DIR/netns.json records (their veths and bridge go with them), stop
    any fault helper the testbed started, and remove DIR/netns.json. Returns what was done."""
    net = read_net(root)
    if net is None:
        return []
    done = stop_all_helpers(net)
    have = existing()
    for ns in reversed(net.created):
        if ns not in have:
            continue
        others = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        if others:
            done.append(f"{ns}: processes {' '.join(others)} still inside (not started by the testbed); "
                        "the namespace lives on until they exit")
        _run(["ip", "netns", "del", ns], check=False)
        done.append(f"namespace {ns} deleted")
    for log in Path(root).glob("delayd-n*.log"):
        log.unlink(missing_ok=True)
    (Path(root) / NETNS_STATE).unlink(missing_ok=True)
    return done


# --- the fault helpers recorded in netns.json (testbed/faults.py starts them inside the namespaces) ----

def helper_alive(f: dict) -> bool:
    """True while the helper recorded in ``f`` (pid, pid_ticks) is still the process the testbed started."""
    pid = f.get("pid")
    return bool(pid) and start_ticks(pid) == f.get("pid_ticks")


def stop_helper(f: dict) -> bool:
    """SIGTERM the recorded helper, SIGKILL it after HELPER_STOP_S; False when it was not running."""
    if not helper_alive(f):
        return False
    try:
        os.kill(f["pid"], signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + HELPER_STOP_S
    while helper_alive(f) and time.monotonic() < deadline:
        time.sleep(0.05)
    if helper_alive(f):
        os.kill(f["pid"], signal.SIGKILL)
    return True


def stop_all_helpers(net: NetState) -> list[str]:
    done = []
    for idx, f in net.faults.items():
        if stop_helper(f):
            done.append(f"node-{idx}: delay helper pid {f['pid']} stopped")
    return done


def pythonpath() -> str:
    """PYTHONPATH for a ``python -m testbed...`` process started inside a namespace: this tree first."""
    old = os.environ.get("PYTHONPATH", "")
    return str(ROOT) + (os.pathsep + old if old else "")


# --- entering a namespace from this process (one thread at a time) -----------------------------------

def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(ns: str | None) -> Iterator[None]:
    """Run the body with this thread in network namespace ``ns`` (sockets made inside stay in it)."""
    if ns is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
