"""testbed up / status / down / logs for the local backend, driven by the state file in DIR; with --netns,
every node in its own network namespace (testbed/mesh/netns.py)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from testbed.errors import TestbedError
from testbed.mesh import netns
from testbed.mesh.build import MAX_NODES, MeshLayout, NodeSpec, build_layout
from testbed.mesh.local import health, start_node, stop_node, wait_ready
from testbed.mesh.state import (
    STATE_NAME,
    NodeState,
    TestbedState,
    is_ours,
    read_state,
    start_ticks,
    state_path,
    stop_pid,
    write_state,
)
from testbed.progress import Progress

BACKENDS = ("local", "docker")
MIN_NODES = 2
READY_TIMEOUT_S = 60.0


def check_node_count(nodes: int) -> None:
    if not MIN_NODES <= nodes <= MAX_NODES:
        raise TestbedError("bad_node_count", f"--nodes must be between {MIN_NODES} and {MAX_NODES} "
                                             f"(a mesh needs at least two nodes), got {nodes}")


def running_nodes(state: TestbedState) -> list[NodeState]:
    return [n for n in state.nodes if is_ours(n)]


def up(root: Path, nodes: int, *, backend: str = "local", base_port: int | None = None,
       ready_timeout_s: float = READY_TIMEOUT_S, say: Callable[[str], None] = print) -> tuple[TestbedState, bool]:
    """Lay out and start an N-node mesh in ``root``, wait until every peer link is up.

    Returns (state, already_running). A DIR with a live testbed is reported, not rebuilt; a DIR with
    anything else in it is refused; a failed start stops what it started and removes the layout.
    """
    check_node_count(nodes)
    if backend != "local":
        raise TestbedError("backend_unavailable", f"--backend {backend} is not available in this build "
                                                  "(only --backend local)")
    root = root.resolve()
    existing = live_or_free(root)
    if existing is not None:
        return existing, True
    created_root = not root.exists()
    layout = build_layout(root, nodes, base_port=base_port)
    state = TestbedState(root=str(root), backend=backend, created_at=time.time())
    start_all(layout, state, ready_timeout_s=ready_timeout_s,
              on_failure=lambda: remove_layout(root, remove_root=created_root))
    return state, False


def live_or_free(root: Path) -> TestbedState | None:
    """The state of a live testbed in ``root`` (to report, not rebuild), or None when ``root`` is absent
    or empty; a TestbedError for a stale state file or a directory holding anything else."""
    existing = read_state(root)
    if existing is not None:
        if running_nodes(existing):
            return existing
        raise TestbedError("stale_state", f"{state_path(root)} records a testbed whose nodes are not running; "
                                          f"run `testbed down --dir {root}` first")
    check_free_dir(root)
    return None


def check_free_dir(root: Path) -> None:
    """``root`` must be absent or an empty directory (a testbed never lays itself over other files)."""
    if root.exists() and not root.is_dir():
        raise TestbedError("dir_not_dir", f"{root} exists and is not a directory")
    if root.exists() and any(root.iterdir()):
        raise TestbedError("dir_not_empty", f"{root} holds files that are not a testbed "
                                            f"(no {STATE_NAME}); choose another --dir")


def start_all(layout: MeshLayout, state: TestbedState, *, ready_timeout_s: float,
              on_failure: Callable[[], None]) -> None:
    """Start every node of ``layout``, recording each in the state file as soon as it runs, and wait
    until every peer link is up. On any failure: SIGKILL what was started, call ``on_failure`` (remove
    the layout, and whatever else the caller made), re-raise."""
    procs: dict[int, subprocess.Popen] = {}
    try:
        progress = Progress("starting", len(layout.nodes))
        for spec in layout.nodes:
            proc = procs[spec.index] = start_node(spec)
            state.nodes.append(NodeState(index=spec.index, agent_id=spec.agent_id, home=str(spec.home),
                                         port=spec.port, health_port=spec.health_port,
                                         mcp_http_port=spec.mcp_http_port, fingerprint=spec.fingerprint,
                                         pid=proc.pid, pid_start_ticks=start_ticks(proc.pid) or 0))
            write_state(state)  # recorded as soon as started, so `down` can always find it
            progress.update(spec.index, "processes started")
        progress.done()
        links = Progress("links up", len(layout.nodes))
        wait_ready(layout, layout.nodes, procs, timeout_s=ready_timeout_s,
                   progress=lambda done, total: links.update(done, "nodes with every peer link up"))
        links.done()
    except BaseException:
        for spec in layout.nodes:
            if spec.index in procs:
                stop_node(spec, procs[spec.index], kill=True)
        on_failure()
        raise


def node_status(node: NodeState) -> dict:
    return status_row(node, node.spec(), is_ours(node), node.mcp_endpoint)


def status_row(node: NodeState, spec: NodeSpec, alive: bool, mcp: str, *, container: str | None = None) -> dict:
    """One `testbed status` row: the node's /healthz asked (at ``spec``) while it is ``alive``, its links up;
    ``container`` (the docker backend's) goes right after the pid."""
    h = health(spec) if alive else None
    peers = (h or {}).get("peers", {})
    return {"node": node.index, "agent_id": node.agent_id, "pid": node.pid,
            **({"container": container} if container is not None else {}), "alive": alive,
            "health": _health_word(h), "links_up": sum(1 for v in peers.values() if v == "up"),
            "links": len(peers), "peers": peers, "port": node.port, "mcp": mcp}


def _health_word(h: dict | None) -> str:
    """'ok', 'down' (no answer) or the status the node reported."""
    if h is None:
        return "down"
    return "ok" if h.get("status") == "ok" else str(h.get("status"))


def require_state(root: Path) -> TestbedState:
    state = read_state(root.resolve())
    if state is None:
        raise TestbedError("no_testbed", f"no testbed in {root.resolve()} (no {STATE_NAME}); "
                                         "start one with `testbed up`")
    return state


def down(root: Path, *, grace_s: float | None = None) -> list[tuple[NodeState, str]]:
    """Stop exactly the pids this testbed started (SIGTERM, SIGKILL after a bound), remove the layout."""
    state = require_state(root)
    results = []
    for node in state.nodes:
        results.append((node, stop_pid(node) if grace_s is None else stop_pid(node, grace_s)))
    still = [n for n in state.nodes if is_ours(n)]
    if still:
        raise TestbedError("stop_failed", f"pids {[n.pid for n in still]} did not stop; state kept in {root}")
    remove_layout(Path(state.root), remove_root=True)
    return results


def remove_layout(root: Path, *, remove_root: bool) -> None:
    """Remove what the testbed wrote (ca/, node-*/, state), then ``root`` itself if it is left empty."""
    if not root.exists():
        return
    for entry in root.iterdir():
        if entry.name in ("ca", STATE_NAME, STATE_NAME + ".tmp") or entry.name.startswith("node-"):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    if remove_root and not any(root.iterdir()):
        root.rmdir()


def log_tail(root: Path, name: str, lines: int) -> str:
    node = require_state(root).node(name)
    path = Path(node.home) / "node.log"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        raise TestbedError("no_log", f"{path} does not exist") from None
    return "\n".join(text.splitlines()[-lines:]) if lines > 0 else text


# --- a testbed with every node in its own network namespace (`testbed up --netns`) ---------------------

def up_netns(root: Path, nodes: int, *, base_port: int | None = None, ready_timeout_s: float = 60.0,
             say: Callable[[str], None] = print) -> tuple[TestbedState, bool]:
    """Like ``up``, with every node in its own namespace (testbed/mesh/netns.py); a failed start also deletes
    the namespaces it made."""
    check_node_count(nodes)
    root = Path(root).resolve()
    existing_state = live_or_free(root)
    if existing_state is not None:
        return existing_state, True
    created_root = not root.exists()
    net = netns.plan(nodes)
    layout = build_layout(root, nodes, base_port=base_port,
                          netns={n.index: (n.ns, n.addr) for n in net.nodes})
    state = TestbedState(root=str(root), backend="local", created_at=time.time())

    def remove_all() -> None:
        netns.teardown(root)
        remove_layout(root, remove_root=created_root)

    try:
        netns.create(root, net)
        say(f"testbed: {nodes} namespaces on bridge {net.hub}/{netns.BRIDGE}, subnet {netns.SUBNET.format(k=net.k)}")
    except BaseException:
        remove_all()
        raise
    start_all(layout, state, ready_timeout_s=ready_timeout_s, on_failure=remove_all)
    return state, False


def down_netns(root: Path, *, grace_s: float | None = None) -> tuple[list[tuple[NodeState, str]], list[str]]:
    """Stop the nodes (``down``), then delete every namespace the testbed recorded, even when the node state
    is missing or the stop failed."""
    root = Path(root).resolve()
    results: list[tuple[NodeState, str]] = []
    try:
        if state_path(root).exists():
            results = down(root, grace_s=grace_s)
    finally:
        done = netns.teardown(root)
        if root.exists() and not any(root.iterdir()):
            root.rmdir()
    return results, done


def specs_for(root: Path) -> tuple[TestbedState, netns.NetState | None, list[NodeSpec]]:
    """The node specs of a testbed in DIR, with namespace and address when it runs in namespaces."""
    state = require_state(root)
    net = netns.read_net(Path(state.root))
    out = []
    for n in state.nodes:
        spec = n.spec()
        if net is not None:
            nn = net.node(n.index)
            spec = replace(spec, host=nn.addr, netns=nn.ns)
        out.append(spec)
    return state, net, out
