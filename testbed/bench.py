"""testbed bench: all-ACK fan-out latency of a real N-node mesh against the bare-TLS floor.

For each N: lay out and start a fresh local mesh, then act as node 1 from this process (node 1's own
certificate and key, one PeerLink per other node, exactly as node/node.py builds its links), fan one
``ping`` envelope out to the other N-1 nodes and wait for every ACK, M times in sequence. Then stop the
mesh and measure the floor (testbed/floor.py) with the same certificates and the same frame bytes,
then the NATS peer (testbed/nats_peer.py: a local TLS ``nats-server``, one publish to N-1 responders
that each commit the message to SQLite before replying) with the same frame bytes. NATS is left out,
with the reason in the report, when ``nats-server`` or ``nats-py`` is missing.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from a2a import Backoff, new_envelope
from mesh import keys, tls
from mesh.heap import keep_tls_reads_on_the_heap
from mesh.link import LinkState, PeerLink
from node.config import load_config
from testbed import everything_on as everything
from testbed import floor, nats_peer
from testbed.build import MeshLayout, NodeSpec, TestbedError, build_layout
from testbed.control import check_node_count
from testbed.local import LocalMesh
from testbed.progress import Progress
from testbed.state import cpu_seconds

# Starts one mesh for the bench: LocalMesh or a container mesh (testbed/docker.py).
MeshFactory = Callable[[MeshLayout], AbstractContextManager[Any]]

# Design budgets for the all-ACK p95 (DESIGN.md section 7), ms by node count.
BUDGET_P95_MS = {3: 100.0, 5: 250.0, 10: 500.0}
LINK_UP_TIMEOUT_S = 30.0
ACK_TIMEOUT_S = 10.0
TTL_MS = 60_000
QUICK_NODES = (3,)
QUICK_MESSAGES = 200
MODE_DEFAULT = "default (nodes as `testbed up` lays them out: no hooks, no permission rules, signed memory versions)"
MODE_EVERYTHING_ON = (
    "everything on (every node: the daemon post_recall hook, 1,000 permission rules in enforce mode, signed memory "
    "versions; each checked in the node's memory_capabilities before the run, after one recall per node that "
    "passes the gate and starts the hook daemon). The ping fan-out measured here neither recalls nor writes, so "
    "it fires no hook, asks the gate nothing and signs nothing: this is the fan-out of nodes that carry those "
    "loads (hook daemons running, rules loaded), not the per-message cost of them")


@dataclass(frozen=True)
class Figures:
    """One side (ours or floor) of one N: latencies in ms, throughput in messages/s, CPU in ms."""

    samples: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    throughput_msg_s: float
    cpu_ms_per_msg_per_receiver: float  # mean over the N-1 receiver processes
    cpu_ms_per_msg_receivers: list[float]
    cpu_ms_per_msg_sender: float  # this (bench) process


def percentile(sorted_s: list[float], p: float) -> float:
    """Nearest-rank percentile of exact sorted samples (no interpolation)."""
    rank = max(1, math.ceil(p / 100.0 * len(sorted_s)))
    return sorted_s[rank - 1]


def figures(samples_s: list[float], wall_s: float, receiver_cpu_s: list[float], sender_cpu_s: float) -> Figures:
    s = sorted(samples_s)
    n = len(s)
    per_rx = [c / n * 1e3 for c in receiver_cpu_s]
    return Figures(samples=n, p50_ms=percentile(s, 50) * 1e3, p95_ms=percentile(s, 95) * 1e3,
                   p99_ms=percentile(s, 99) * 1e3, max_ms=s[-1] * 1e3, mean_ms=sum(s) / n * 1e3,
                   throughput_msg_s=n / wall_s, cpu_ms_per_msg_per_receiver=sum(per_rx) / len(per_rx),
                   cpu_ms_per_msg_receivers=per_rx, cpu_ms_per_msg_sender=sender_cpu_s / n * 1e3)


def node_creds(spec: NodeSpec) -> tuple[Path, Path, Path]:
    cfg = load_config(spec.config_path, env={})
    ident = keys.load_identity(spec.home / "keys", spec.agent_id)
    return cfg.cert_path, ident.priv_path, cfg.ca_cert_path


def ping_frame(layout: MeshLayout, sent_at_ms: int) -> tuple[str, bytes]:
    me = layout.node(1).agent_id
    env = new_envelope(me, [n.agent_id for n in layout.nodes[1:]], {"kind": "ping", "sent_at": sent_at_ms},
                       sent_at_ms, TTL_MS)
    return env.correlation_id, env.to_wire()


async def bench_mesh(layout: MeshLayout, pids: list[int], messages: int, warmup: int,
                      progress: Progress) -> tuple[list[float], float, list[float], float]:
    cert, key, ca = node_creds(layout.node(1))
    ctx = tls.client_context(cert, key, ca)
    pinned = keys.load_peer_keys(layout.node(1).home / "peers").keys
    cfg = load_config(layout.node(1).config_path, env={})
    links = [PeerLink(n.agent_id, n.url, ctx, pinned=lambda: pinned,
                      backoff=Backoff(cfg.mesh.reconnect_min_s, cfg.mesh.reconnect_max_s),
                      ack_timeout_s=ACK_TIMEOUT_S, max_bytes=cfg.a2a.max_message_bytes)
             for n in layout.nodes[1:]]

    async def fan(i: int) -> None:
        cid, frame = ping_frame(layout, int(time.time() * 1000))
        acks = await asyncio.gather(*(link.send_wire(cid, frame) for link in links))
        bad = [a for a in acks if not a.accepted or a.reason is not None]
        if bad:
            raise TestbedError("bench_rejected", f"message {i}: ACK {bad[0]!r}")

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(link.run(), name=f"bench-link:{link.agent_id}") for link in links]
        try:
            deadline = time.monotonic() + LINK_UP_TIMEOUT_S
            while any(link.state is not LinkState.UP for link in links):
                if time.monotonic() > deadline:
                    down = [f"{k.agent_id} ({k.last_error})" for k in links if k.state is not LinkState.UP]
                    raise TestbedError("links_not_up", f"bench links not up in {LINK_UP_TIMEOUT_S:g} s: {down}")
                await asyncio.sleep(0.02)
            for i in range(warmup):
                await fan(i)
            cpu0 = [cpu_seconds(p) or 0.0 for p in pids]
            self0 = time.process_time()
            samples: list[float] = []
            started = time.perf_counter()
            for i in range(messages):
                t0 = time.perf_counter()
                await fan(i)
                samples.append(time.perf_counter() - t0)
                if i % 50 == 0:
                    progress.update(i, "messages (mesh)")
            wall = time.perf_counter() - started
            self_cpu = time.process_time() - self0
            cpu = [(cpu_seconds(p) or 0.0) - c for p, c in zip(pids, cpu0, strict=True)]
            progress.update(messages, "messages (mesh)")
            return samples, wall, cpu, self_cpu
        finally:
            for link in links:
                await link.close()
            del tasks


async def _bench_floor(layout: MeshLayout, frame: bytes, messages: int, warmup: int) \
        -> tuple[list[float], float, list[float], float]:
    cert, key, ca = node_creds(layout.node(1))
    ctx = tls.client_context(cert, key, ca)
    with floor.FloorReceivers([node_creds(n) for n in layout.nodes[1:]]) as rx:
        pids = [p.pid for p in rx.procs]
        # Warm up first, then read CPU, as for the mesh.
        await floor.fan_out(rx.ports, ctx, frame, 0, warmup)
        cpu0 = [cpu_seconds(p) or 0.0 for p in pids]
        self0 = time.process_time()
        samples, wall = await floor.fan_out(rx.ports, ctx, frame, messages, 0)
        self_cpu = time.process_time() - self0
        cpu = [(cpu_seconds(p) or 0.0) - c for p, c in zip(pids, cpu0, strict=True)]
    return samples, wall, cpu, self_cpu


async def _bench_nats(layout: MeshLayout, root: Path, frame: bytes, messages: int, warmup: int) \
        -> tuple[tuple[list[float], float, list[float], float], float]:
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
    gets the hook daemon and the 1,000 rules first (testbed/everything_on.py), checked on every running
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
    o, f = figures(*ours), figures(*fl)
    budget = BUDGET_P95_MS.get(nodes)
    row = {"nodes": nodes, "messages": messages, "warmup": warmup, "frame_bytes": len(frame),
           "budget_p95_ms": budget, "within_budget": None if budget is None else o.p95_ms <= budget,
           "ratio_p95": o.p95_ms / f.p95_ms, "ratio_p50": o.p50_ms / f.p50_ms,
           "ours": asdict(o), "floor": asdict(f), "nats": None, "everything_on_loaded": loaded,
           "ratio_p95_nats": None, "ratio_p50_nats": None, "p95_le_nats": None,
           "_samples": {"ours": sorted(ours[0]), "floor": sorted(fl[0])}}
    if nats_missing is None:
        print(f"bench: NATS scatter for {nodes} nodes", file=sys.stderr)
        nt, server_cpu_s = asyncio.run(_bench_nats(layout, root, frame, messages, warmup))
        n = figures(*nt)
        row.update({"nats": {**asdict(n), "cpu_ms_per_msg_server": server_cpu_s / n.samples * 1e3,
                             "ratio_p95_floor": n.p95_ms / f.p95_ms},
                    "ratio_p95_nats": o.p95_ms / n.p95_ms, "ratio_p50_nats": o.p50_ms / n.p50_ms,
                    "p95_le_nats": o.p95_ms <= n.p95_ms})
        row["_samples"]["nats"] = sorted(nt[0])
    remove_tree(root)
    return row


async def _check_everything_on(layout: MeshLayout) -> dict[str, Any]:
    """After one recall on each node (through the gate and the hook, which starts the daemon), every node's
    own report (``memory_capabilities`` over its local socket) of the hook, the rules and signing;
    TestbedError when one does not run all three or its daemon is not running."""
    from node.live import ask_node

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


def remove_tree(root: Path) -> None:
    import shutil

    shutil.rmtree(root, ignore_errors=True)


def run(nodes_list: list[int], messages: int, out: Path, work: Path, *, warmup: int | None = None,
        command: str | None = None, plot: bool = True, netem: str | None = None,
        mesh_factory: MeshFactory = LocalMesh, everything_on: bool = False) -> dict:
    """Run the bench for every N in ``nodes_list``; write out/bench.json, out/bench.md and PNG CDFs.

    ``mesh_factory`` starts each mesh (a context manager whose ``procs[i].pid`` are the node processes):
    LocalMesh, or testbed.docker's container mesh.
    ``netem`` ("delay 25ms 5ms loss 1%"): run each mesh and floor in network namespaces under that
    emulated WAN (testbed/faults.py); the NATS peer is not run then.
    ``everything_on``: every node runs the daemon post_recall hook, 1,000 enforcing permission rules and
    signs its memory versions (testbed/everything_on.py); the floor and NATS are unchanged.
    """
    em = None
    if everything_on and netem:
        raise TestbedError("bad_option", "--everything-on is not supported with --netem")
    if netem:
        from testbed import faults, netns

        em = faults.parse_netem(netem)
        ok, why = netns.ip_netns_supported()
        if not ok:
            raise TestbedError("netns_unavailable", f"--netem needs network namespaces: {why}")
    for n in nodes_list:
        check_node_count(n)
    if messages < 1:
        raise TestbedError("bad_messages", f"--messages must be at least 1, got {messages}")
    warmup = min(100, max(5, messages // 10)) if warmup is None else warmup
    floor.new_loop_policy()
    keep_tls_reads_on_the_heap()  # the sender's reads (mesh/heap.py), for its mesh and floor runs alike
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    nats_missing = "not run under --netem (nats-server stays on 127.0.0.1)" if em else nats_peer.unavailable()
    if nats_missing:
        print(f"bench: NATS peer omitted: {nats_missing}", file=sys.stderr)
    rows = [faults.bench_one_netem(work, n, messages, warmup, em) if em else
            bench_one(work, n, messages, warmup, nats_missing, mesh_factory, everything_on) for n in nodes_list]
    report = {"command": command or "testbed " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
              "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                       "kernel": platform.release()},
              "mode": MODE_EVERYTHING_ON if everything_on else MODE_DEFAULT,
              "payload": "a2a ping envelope (CBOR), one envelope to all N-1 recipients; the ping schema "
                         "allows no padding field, so frames are ping-sized, not memory.put-sized",
              "nats": {"available": nats_missing is None, "omitted_reason": nats_missing,
                       "version": _nats_version() if nats_missing is None else None,
                       "shape": "nats-server on 127.0.0.1 with mutual TLS 1.3 (node 1's Ed25519 cert, the mesh "
                                "CA); the sender publishes the same frame bytes once to one subject with a reply "
                                "subject; N-1 responder processes (nats-py, uvloop, own node cert) each INSERT it "
                                "into their own SQLite file (WAL, synchronous=NORMAL, one commit per message) "
                                "and reply 2 bytes; latency = publish to last of the N-1 replies"},
              "results": [{k: v for k, v in r.items() if k != "_samples"} for r in rows]}
    if em:
        report["netem"] = {"spec": em.describe(), "emulated_rtt_ms": em.emulated_rtt_ms,
                           "rtt_note": "emulated RTT = 2 × delay (the delay is applied on the sender's egress "
                                       "and again on the receiver's for the ACK); user-space netem over "
                                       "NFQUEUE because this kernel has no sch_netem."}
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "samples.json").write_text(json.dumps({str(r["nodes"]): r["_samples"] for r in rows}) + "\n",
                                      encoding="utf-8")
    md = markdown(report) + (faults.netem_markdown(report) if em else "")
    (out / "bench.md").write_text(md, encoding="utf-8")
    report["plots"] = plot_cdfs(rows, out) if plot else []
    return report


def _nats_version() -> str | None:
    try:
        out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    from importlib.metadata import PackageNotFoundError, version

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
