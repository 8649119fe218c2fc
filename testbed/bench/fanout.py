"""testbed bench: all-ACK fan-out latency of a real N-node mesh against the bare-TLS floor.

For each N: lay out and start a fresh local mesh, then act as node 1 from this process (node 1's own
certificate and key, one PeerLink per other node, exactly as node/node.py builds its links), fan one
``ping`` envelope out to the other N-1 nodes and wait for every ACK, M times in sequence. Then stop the
mesh and measure the floor (floor.py here) with the same certificates and the same frame bytes,
then the NATS peer (nats_peer.py here: a local TLS ``nats-server``, one publish to N-1 responders
that each commit the message to SQLite before replying) with the same frame bytes. NATS is left out,
with the reason in the report, when ``nats-server`` or ``nats-py`` is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mesh import tls
from mesh.heap import keep_tls_reads_on_the_heap
from node.config import load_config
from node.mcp.socket import ask_node
from testbed.bench import everything_on as everything
from testbed.bench import floor, nats_peer
from testbed.bench.figures import Measured, figures, result_row, rounds_summary
from testbed.bench.netem import bench_one_netem, netem_markdown
from testbed.bench.report import markdown
from testbed.bench.sender import bench_mesh, node_creds, ping_frame
from testbed.env import image
from testbed.env.doctor import ip_netns_supported
from testbed.errors import TestbedError
from testbed.faults import Netem, parse_netem
from testbed.mesh.build import MeshLayout, build_layout
from testbed.mesh.control import check_node_count
from testbed.mesh.docker import DockerMesh
from testbed.mesh.local import LocalMesh
from testbed.mesh.state import cpu_seconds
from testbed.progress import Progress

# Starts one mesh for the bench: LocalMesh or a container mesh (testbed/mesh/docker.py).
MeshFactory = Callable[[MeshLayout], AbstractContextManager[Any]]

QUICK_NODES = (3,)
QUICK_MESSAGES = 200
MODE_DEFAULT = "default (nodes as `testbed up` lays them out: no hooks, no permission rules, signed memory versions)"
MODE_EVERYTHING_ON = (
    "everything on (every node: the daemon post_recall hook, 1,000 permission rules in enforce mode, signed memory "
    "versions; each checked in the node's memory_capabilities before the run, after one recall per node that "
    "passes the gate and starts the hook daemon). The ping fan-out measured here neither recalls nor writes, so "
    "it fires no hook, asks the gate nothing and signs nothing: this is the fan-out of nodes that carry those "
    "loads (hook daemons running, rules loaded), not the per-message cost of them")
PAYLOAD = ("a2a ping envelope (CBOR), one envelope to all N-1 recipients; the ping schema allows no padding "
           "field, so frames are ping-sized, not memory.put-sized")
NATS_SHAPE = ("nats-server on 127.0.0.1 with mutual TLS 1.3 (node 1's Ed25519 cert, the mesh CA); the sender "
              "publishes the same frame bytes once to one subject with a reply subject; N-1 responder processes "
              "(nats-py, uvloop, own node cert) each INSERT it into their own SQLite file (WAL, "
              "synchronous=NORMAL, one commit per message) and reply 2 bytes; latency = publish to last of the "
              "N-1 replies")
# How each backend runs the mesh's nodes (progress lines, bench.md's Backend line, bench.json's backend.runs).
BACKENDS = {"local": "local backend: one node subprocess each on 127.0.0.1",
            "docker": "docker backend: one host-network container each"}
NETEM_BACKEND = "local backend: one node subprocess each, in its own network namespace"
NETEM_RTT_NOTE = ("emulated RTT = 2 × delay (the delay is applied on the sender's egress and again on the "
                  "receiver's for the ACK); user-space netem over NFQUEUE because this kernel has no sch_netem.")


# Ours, the floor and NATS take turns this many times (each a share of --messages), so a verdict that the rounds
# do not all agree on shows as "mixed" instead of flipping between two runs.
ROUNDS = 5
# One side's run of n messages after w warm-up ones: (latencies s, wall s).
Run = Callable[[int, int], Awaitable[tuple[list[float], float]]]


class Side:
    """One side of the comparison (ours, the floor, NATS): its measured rounds, added up."""

    def __init__(self, name: str, pids: list[int]) -> None:
        self.name = name
        self.pids = pids
        self.rounds: list[list[float]] = []
        self.wall = 0.0
        self.cpu = [0.0] * len(pids)
        self.self_cpu = 0.0

    def add(self, measured: Measured) -> None:
        samples, wall, cpu, self_cpu = measured
        self.rounds.append(samples)
        self.wall += wall
        self.cpu = [a + b for a, b in zip(self.cpu, cpu, strict=True)]
        self.self_cpu += self_cpu

    def measured(self) -> Measured:
        """Every round's samples in the order measured, the summed wall and CPU times."""
        return [s for r in self.rounds for s in r], self.wall, self.cpu, self.self_cpu


async def _timed(run: Run, pids: list[int], messages: int, warmup: int) -> Measured:
    """``run`` warmed up, then measured: its samples and wall time, the CPU ``pids`` and this process spent."""
    await run(0, warmup)
    cpu0 = [cpu_seconds(p) or 0.0 for p in pids]
    self0 = time.process_time()
    samples, wall = await run(messages, 0)
    self_cpu = time.process_time() - self0
    return samples, wall, [(cpu_seconds(p) or 0.0) - c for p, c in zip(pids, cpu0, strict=True)], self_cpu


def _round_sizes(messages: int, rounds: int) -> list[int]:
    count = max(1, min(rounds, messages))
    return [messages * (i + 1) // count - messages * i // count for i in range(count)]


async def _take_turns(sides: list[tuple[Side, Run]], messages: int, warmup: int, rounds: int,
                      progress: Progress) -> None:
    """Every side in turn, round after round; the first round warms up with ``warmup`` messages, later ones with a
    share of it (each round opens fresh connections for the floor and NATS, as the mesh's links are set up)."""
    for i, size in enumerate(_round_sizes(messages, rounds)):
        for k, (side, run) in enumerate(sides):
            side.add(await _timed(run, side.pids, size, warmup if i == 0 else max(2, warmup // rounds)))
            progress.update(i * len(sides) + k + 1, f"round {i + 1}: {side.name} ({size} messages)")


def _bench_run(layout: MeshLayout, pids: list[int]) -> Run:
    async def run(messages: int, warmup: int) -> tuple[list[float], float]:
        samples, wall, _, _ = await bench_mesh(layout, pids, messages, warmup)
        return samples, wall
    return run


def bench_one(work: Path, nodes: int, messages: int, warmup: int, nats_missing: str | None = None,
              mesh_factory: MeshFactory = LocalMesh, everything_on: bool = False, rounds: int = ROUNDS,
              backend: str = "local") -> dict:
    """One N: a fresh mesh under ``work`` (started by ``mesh_factory``: local processes or containers, as
    ``backend`` says), the floor's receivers and the NATS peer beside it; then ours, the floor and NATS take turns
    for ``rounds`` rounds; a result row with each round's verdicts. ``everything_on``: each node home gets the hook
    daemon and the 1,000 rules first (everything_on.py here), checked on every running node before the first
    message after one recall (which starts the hook daemon)."""
    # Short names: each node's unix socket path must stay under the 108-byte limit.
    root = Path(tempfile.mkdtemp(prefix=f"{nodes}n-", dir=work.resolve()))
    layout = build_layout(root, nodes)
    if everything_on:
        everything.apply(layout)
    _, frame = ping_frame(layout, int(time.time() * 1000))
    t0 = time.monotonic()

    def say(step: int, text: str) -> None:
        print(f"bench {nodes} nodes [{step}/3] {text} (+{time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)

    say(1, f"starting the mesh, {BACKENDS[backend]}, under {root}")
    loaded, server_cpu = None, 0.0
    cert, key, ca = node_creds(layout.node(1))
    ctx = tls.client_context(cert, key, ca)
    creds = [node_creds(n) for n in layout.nodes[1:]]
    with contextlib.ExitStack() as stack:
        mesh = stack.enter_context(mesh_factory(layout))
        if everything_on:
            loaded = asyncio.run(_check_everything_on(layout))
        say(2, "starting the floor's echo receivers" + ("" if nats_missing else " and the NATS peer"))
        rx = stack.enter_context(floor.FloorReceivers(creds))
        addrs = [("127.0.0.1", port) for port in rx.ports]
        ours = Side("ours", [mesh.procs[n.index].pid for n in layout.nodes[1:]])
        fl = Side("floor", [p.pid for p in rx.procs])
        sides = [(ours, _bench_run(layout, ours.pids)),
                 (fl, partial(floor.fan_out, addrs, ctx, frame))]
        nats = None
        if nats_missing is None:
            server = stack.enter_context(nats_peer.NatsServer(root / "nats", cert, key, ca))
            responders = stack.enter_context(nats_peer.NatsResponders(server.url, creds, root / "nats"))
            assert server.proc is not None
            nats = Side("NATS", [p.pid for p in responders.procs] + [server.proc.pid])
            sides.append((nats, partial(nats_peer.scatter, server.url, ctx, frame, len(creds))))
        count = len(_round_sizes(messages, rounds))
        say(3, f"{messages} messages each, in {count} rounds: {', '.join(s.name for s, _ in sides)} take turns")
        progress = Progress(f"bench {nodes} nodes", count * len(sides))
        asyncio.run(_take_turns(sides, messages, warmup, rounds, progress), debug=False)
        progress.done()
    row = result_row(nodes, messages, warmup, len(frame), ours.measured(), fl.measured(), everything_on_loaded=loaded)
    if nats is not None:
        *responders_cpu, server_cpu = nats.cpu
        samples, wall, _, self_cpu = nats.measured()
        _add_nats(row, (samples, wall, responders_cpu, self_cpu), server_cpu)
    row["rounds"] = rounds_summary(ours.rounds, fl.rounds, nats.rounds if nats else None, row["budget_p95_ms"])
    shutil.rmtree(root, ignore_errors=True)
    return row


def _add_nats(row: dict[str, Any], measured: Measured, server_cpu_s: float) -> None:
    """The NATS figures and our ratios to them, into ``row``."""
    n = figures(*measured)
    o_p50, o_p95, f_p95 = row["ours"]["p50_ms"], row["ours"]["p95_ms"], row["floor"]["p95_ms"]
    row.update({"nats": {**asdict(n), "cpu_ms_per_msg_server": server_cpu_s / n.samples * 1e3,
                         "ratio_p95_floor": n.p95_ms / f_p95},
                "ratio_p95_nats": o_p95 / n.p95_ms, "ratio_p50_nats": o_p50 / n.p50_ms,
                "p95_le_nats": o_p95 <= n.p95_ms})
    row["_samples"]["nats"] = sorted(measured[0])


async def _check_everything_on(layout: MeshLayout) -> dict[str, Any]:
    """After one recall on each node (through the gate and the hook, which starts the daemon), every node's
    own report (``memory_capabilities`` over its local socket) of the hook, the rules and signing;
    TestbedError when one does not run all three or its daemon is not running."""
    out = {}
    for spec in layout.nodes:
        cfg = load_config(spec.config_path, env={})
        # One recall through the gate and the post_recall hook: the daemon starts on its first call.
        await ask_node(cfg, "memory_recall", {"query": "everything on", "limit": 1})
        caps = await ask_node(cfg, "memory_capabilities")
        if not isinstance(caps, dict):
            raise TestbedError("everything_on_not_loaded", f"{spec.agent_id} did not answer memory_capabilities")
        out[spec.agent_id] = everything.check(caps, spec.agent_id)
    return out


def _checked_options(nodes_list: list[int], messages: int, netem: str | None, everything_on: bool) -> Netem | None:
    """Refuse what cannot run (TestbedError); the parsed netem spec, or None for a loopback run."""
    em = None
    if everything_on and netem:
        raise TestbedError("bad_option", "--everything-on is not supported with --netem")
    if netem:
        em = parse_netem(netem)
        ok, why = ip_netns_supported()
        if not ok:
            raise TestbedError("netns_unavailable", f"--netem needs network namespaces: {why}")
    for n in nodes_list:
        check_node_count(n)
    if messages < 1:
        raise TestbedError("bad_messages", f"--messages must be at least 1, got {messages}")
    return em


def run(nodes_list: list[int], messages: int, out: Path, work: Path, *, warmup: int | None = None,
        command: str | None = None, plot: bool = True, netem: str | None = None,
        mesh_factory: MeshFactory = LocalMesh, everything_on: bool = False, rounds: int = ROUNDS,
        backend: str = "local", node_image: str | None = None) -> dict:
    """Run the bench for every N in ``nodes_list``; write out/bench.json, out/bench.md and PNG CDFs.

    ``mesh_factory`` starts each mesh (a context manager whose ``procs[i].pid`` are the node processes):
    LocalMesh, or testbed.mesh.docker's container mesh; ``backend`` ("local" or "docker", BACKENDS) names it
    in the progress lines and the report, with ``node_image`` for docker.
    ``rounds``: ours, the floor and NATS take turns this many times (ROUNDS).
    ``netem`` ("delay 25ms 5ms loss 1%"): run each mesh and floor in network namespaces under that
    emulated WAN (netem.py here); the NATS peer is not run then.
    ``everything_on``: every node runs the daemon post_recall hook, 1,000 enforcing permission rules and
    signs its memory versions (everything_on.py here); the floor and NATS are unchanged.
    """
    em = _checked_options(nodes_list, messages, netem, everything_on)
    warmup = min(100, max(5, messages // 10)) if warmup is None else warmup
    floor.new_loop_policy()
    keep_tls_reads_on_the_heap()  # the sender's reads (mesh/heap.py), for its mesh and floor runs alike
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    nats_missing = "not run under --netem (nats-server stays on 127.0.0.1)" if em else nats_peer.unavailable()
    if nats_missing:
        print(f"bench: NATS peer omitted: {nats_missing}", file=sys.stderr)
    if rounds < 1:
        raise TestbedError("bad_option", f"--rounds must be at least 1, got {rounds}")
    rows = [bench_one_netem(work, n, messages, warmup, em) if em else
            bench_one(work, n, messages, warmup, nats_missing, mesh_factory, everything_on, rounds, backend)
            for n in nodes_list]
    report = _report(rows, command, nats_missing, em, everything_on)
    report["backend"] = {"name": backend, "runs": NETEM_BACKEND if em else BACKENDS[backend],
                         "image": node_image}
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "samples.json").write_text(json.dumps({str(r["nodes"]): r["_samples"] for r in rows}) + "\n",
                                      encoding="utf-8")
    md = markdown(report) + (netem_markdown(report) if em else "")
    (out / "bench.md").write_text(md, encoding="utf-8")
    report["plots"] = plot_cdfs(rows, out) if plot else []
    return report


def _report(rows: list[dict], command: str | None, nats_missing: str | None, em: Netem | None,
            everything_on: bool) -> dict[str, Any]:
    """bench.json: the command, the host, the mode, the NATS peer's shape (or why it was left out), the rows."""
    report = {"command": command or "testbed " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
              "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                       "kernel": platform.release()},
              "mode": MODE_EVERYTHING_ON if everything_on else MODE_DEFAULT,
              "payload": PAYLOAD,
              "nats": {"available": nats_missing is None, "omitted_reason": nats_missing,
                       "version": _nats_version() if nats_missing is None else None, "shape": NATS_SHAPE},
              "results": [{k: v for k, v in r.items() if k != "_samples"} for r in rows]}
    if em:
        report["netem"] = {"spec": em.describe(), "emulated_rtt_ms": em.emulated_rtt_ms,
                           "rtt_note": NETEM_RTT_NOTE}
    return report


def run_in_containers(nodes_list: list[int], messages: int, out: Path, work: Path, **kw: Any) -> dict:
    """`testbed bench --backend docker`: ``run`` with every mesh in containers (testbed/mesh/docker.py).

    The floor (and NATS, when present) stay host processes, as they are the comparison.
    """
    img = image.build_node()  # once, before any mesh starts
    return run(nodes_list, messages, out, work, mesh_factory=lambda layout: DockerMesh(layout, img),
               backend="docker", node_image=img, **kw)


def _nats_version() -> str | None:
    try:
        out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        py = version("nats-py")
    except PackageNotFoundError:
        py = "?"
    return f"{out.strip()}, nats-py {py}"


def plot_cdfs(rows: list[dict], out: Path) -> list[str]:
    """One latency CDF PNG per N (ours, floor and NATS when measured); [] when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib not installed (pip install 'attested-mesh[bench]'); no PNG written",
              file=sys.stderr)
        return []
    paths = []
    for r in rows:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, samples in r["_samples"].items():
            ms = [s * 1e3 for s in samples]
            n = len(ms)
            ax.step(ms, [(i + 1) / n for i in range(n)], where="post", label=f"{name} (p95 {r[name]['p95_ms']:.2f} ms)")
        if r["budget_p95_ms"] is not None:
            ax.axvline(r["budget_p95_ms"], color="red", linestyle="--", label=f"budget p95 {r['budget_p95_ms']:g} ms")
        ax.axhline(0.95, color="grey", linewidth=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("all-ACK / all-reply latency (ms, log)")
        ax.set_ylabel("fraction of messages")
        ax.set_title(f"{r['nodes']}-node fan-out to {r['nodes'] - 1} peers, {r['messages']} messages")
        ax.legend(loc="lower right")
        path = out / f"cdf-{r['nodes']}n.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(str(path))
    return paths
