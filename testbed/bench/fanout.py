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
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mesh import tls
from mesh.heap import keep_tls_reads_on_the_heap
from node.config import load_config
from node.mcp.socket import ask_node
from testbed.bench import everything_on as everything
from testbed.bench import floor, nats_peer
from testbed.bench.figures import Measured, figures, result_row
from testbed.bench.netem import bench_one_netem, netem_markdown
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
NETEM_RTT_NOTE = ("emulated RTT = 2 × delay (the delay is applied on the sender's egress and again on the "
                  "receiver's for the ACK); user-space netem over NFQUEUE because this kernel has no sch_netem.")


async def _bench_floor(layout: MeshLayout, frame: bytes, messages: int, warmup: int) -> Measured:
    cert, key, ca = node_creds(layout.node(1))
    ctx = tls.client_context(cert, key, ca)
    with floor.FloorReceivers([node_creds(n) for n in layout.nodes[1:]]) as rx:
        pids = [p.pid for p in rx.procs]
        addrs = [("127.0.0.1", port) for port in rx.ports]
        # Warm up first, then read CPU, as for the mesh.
        await floor.fan_out(addrs, ctx, frame, 0, warmup)
        cpu0 = [cpu_seconds(p) or 0.0 for p in pids]
        self0 = time.process_time()
        samples, wall = await floor.fan_out(addrs, ctx, frame, messages, 0)
        self_cpu = time.process_time() - self0
        cpu = [(cpu_seconds(p) or 0.0) - c for p, c in zip(pids, cpu0, strict=True)]
    return samples, wall, cpu, self_cpu


async def _bench_nats(layout: MeshLayout, root: Path, frame: bytes, messages: int, warmup: int) \
        -> tuple[Measured, float]:
    """NATS scatter figures' inputs, plus nats-server's CPU seconds over the measured messages."""
    cert, key, ca = node_creds(layout.node(1))
    ctx = tls.client_context(cert, key, ca)
    work = root / "nats"
    with nats_peer.NatsServer(work, cert, key, ca) as server, \
            nats_peer.NatsResponders(server.url, [node_creds(n) for n in layout.nodes[1:]], work) as rx:
        assert server.proc is not None
        pids = [p.pid for p in rx.procs]
        receivers = len(pids)
        await nats_peer.scatter(server.url, ctx, frame, receivers, 0, warmup)
        cpu0 = [cpu_seconds(p) or 0.0 for p in pids]
        srv0 = cpu_seconds(server.proc.pid) or 0.0
        self0 = time.process_time()
        samples, wall = await nats_peer.scatter(server.url, ctx, frame, receivers, messages, 0)
        self_cpu = time.process_time() - self0
        cpu = [(cpu_seconds(p) or 0.0) - c for p, c in zip(pids, cpu0, strict=True)]
        srv = (cpu_seconds(server.proc.pid) or 0.0) - srv0
    return (samples, wall, cpu, self_cpu), srv


def bench_one(work: Path, nodes: int, messages: int, warmup: int, nats_missing: str | None = None,
              mesh_factory: MeshFactory = LocalMesh, everything_on: bool = False) -> dict:
    """One N: a fresh mesh under ``work`` (started by ``mesh_factory``: local processes or containers),
    our all-ACK figures, then the floor's and NATS's; a result row. ``everything_on``: each node home
    gets the hook daemon and the 1,000 rules first (everything_on.py here), checked on every running
    node before the first message after one recall (which starts the hook daemon)."""
    # Short names: each node's unix socket path must stay under the 108-byte limit.
    root = Path(tempfile.mkdtemp(prefix=f"{nodes}n-", dir=work.resolve()))
    layout = build_layout(root, nodes)
    if everything_on:
        everything.apply(layout)
    _, frame = ping_frame(layout, int(time.time() * 1000))
    progress = Progress(f"bench {nodes} nodes", messages)
    print(f"bench: starting {nodes} nodes under {root}", file=sys.stderr)
    loaded = None
    with mesh_factory(layout) as mesh:
        pids = [mesh.procs[n.index].pid for n in layout.nodes[1:]]
        if everything_on:
            loaded = asyncio.run(_check_everything_on(layout))
        ours = asyncio.run(bench_mesh(layout, pids, messages, warmup, progress), debug=False)
    progress.done()
    print(f"bench: floor for {nodes} nodes", file=sys.stderr)
    fl = asyncio.run(_bench_floor(layout, frame, messages, warmup))
    row = result_row(nodes, messages, warmup, len(frame), ours, fl, everything_on_loaded=loaded)
    if nats_missing is None:
        print(f"bench: NATS scatter for {nodes} nodes", file=sys.stderr)
        nt, server_cpu_s = asyncio.run(_bench_nats(layout, root, frame, messages, warmup))
        _add_nats(row, nt, server_cpu_s)
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
        mesh_factory: MeshFactory = LocalMesh, everything_on: bool = False) -> dict:
    """Run the bench for every N in ``nodes_list``; write out/bench.json, out/bench.md and PNG CDFs.

    ``mesh_factory`` starts each mesh (a context manager whose ``procs[i].pid`` are the node processes):
    LocalMesh, or testbed.mesh.docker's container mesh.
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
    rows = [bench_one_netem(work, n, messages, warmup, em) if em else
            bench_one(work, n, messages, warmup, nats_missing, mesh_factory, everything_on) for n in nodes_list]
    report = _report(rows, command, nats_missing, em, everything_on)
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
    return run(nodes_list, messages, out, work, mesh_factory=lambda layout: DockerMesh(layout, img), **kw)


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


def _lat(x: dict) -> str:
    return f"{x['p50_ms']:.2f} / {x['p95_ms']:.2f} / {x['p99_ms']:.2f} / {x['max_ms']:.2f}"


def markdown(report: dict) -> str:
    nats = report.get("nats") or {"available": False, "omitted_reason": "not measured"}
    lines = [
        f"Command: `{report['command']}`  ",
        f"Host: {report['host']['cpus']} CPUs, Python {report['host']['python']}, {report['generated_at']}; "
        f"frame {report['results'][0]['frame_bytes']} B ({report['payload']}).  ",
        f"Mode: {report.get('mode', MODE_DEFAULT)}.  ",
        (f"NATS peer ({nats['version']}): {nats['shape']}." if nats["available"]
         else f"NATS peer omitted: {nats['omitted_reason']}."),
        "",
        "| nodes | msgs | budget p95 | ours p50 / p95 / p99 / max (ms) | floor p50 / p95 / p99 / max (ms) "
        "| NATS p50 / p95 / p99 / max (ms) | p95 ours/floor | p95 ours/NATS | msg/s ours / floor / NATS "
        "| CPU ms/msg per receiver ours / floor / NATS | sender CPU ms/msg ours / floor / NATS "
        "| nats-server CPU ms/msg | within budget | p95 ≤ NATS |",
        "|---:|---:|---:|---|---|---|---:|---:|---|---|---|---:|:-:|:-:|",
    ]
    for r in report["results"]:
        o, f, n = r["ours"], r["floor"], r.get("nats")
        budget = "-" if r["budget_p95_ms"] is None else f"≤ {r['budget_p95_ms']:g} ms"
        ok = "-" if r["within_budget"] is None else ("yes" if r["within_budget"] else "**no**")
        if n:
            nl, nr, ntp = _lat(n), f"{r['ratio_p95_nats']:.2f}×", f" / {n['throughput_msg_s']:.0f}"
            ncpu, nsnd = f" / {n['cpu_ms_per_msg_per_receiver']:.3f}", f" / {n['cpu_ms_per_msg_sender']:.3f}"
            nsrv, nok = f"{n['cpu_ms_per_msg_server']:.3f}", "yes" if r["p95_le_nats"] else "**no**"
        else:
            nl = nr = nsrv = nok = "-"
            ntp = ncpu = nsnd = " / -"
        lines.append(
            f"| {r['nodes']} | {r['messages']} | {budget} | {_lat(o)} | {_lat(f)} | {nl} "
            f"| {r['ratio_p95']:.1f}× | {nr} | {o['throughput_msg_s']:.0f} / {f['throughput_msg_s']:.0f}{ntp} "
            f"| {o['cpu_ms_per_msg_per_receiver']:.3f} / {f['cpu_ms_per_msg_per_receiver']:.3f}{ncpu} "
            f"| {o['cpu_ms_per_msg_sender']:.3f} / {f['cpu_ms_per_msg_sender']:.3f}{nsnd} | {nsrv} | {ok} | {nok} |")
    return "\n".join(lines) + "\n"


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
