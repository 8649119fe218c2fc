"""`testbed bench --netem`: the same fan-out measurement with every node in its own network namespace and an
emulated WAN (testbed/faults.py) on every node's egress.

The bench process acts as node 1 from inside node 1's namespace; the floor's receivers run in the receiving
nodes' namespaces on their addresses (``python -m testbed.bench.netem floor-rx``), so both cross the same
veths, bridge and delays.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mesh import tls
from testbed.bench import floor
from testbed.bench.figures import Measured, result_row
from testbed.bench.sender import bench_mesh, node_creds, ping_frame
from testbed.faults import Netem, set_netem
from testbed.mesh import netns, procs
from testbed.mesh.build import MeshLayout, build_layout
from testbed.mesh.local import LocalMesh
from testbed.mesh.state import cpu_seconds
from testbed.progress import Progress

RX_STOP_TIMEOUT_S = 15
TARGET_P95_OVER_RTT = 1.3


def _floor_under_netem(layout: MeshLayout, frame: bytes, messages: int, warmup: int) -> Measured:
    """The floor's fan-out from node 1's namespace to one echo receiver in each other node's namespace."""
    receivers: list[subprocess.Popen] = []
    try:
        for spec in layout.nodes[1:]:
            cert, key, ca = node_creds(spec)
            receivers.append(subprocess.Popen(
                ["ip", "netns", "exec", spec.netns, sys.executable, "-m", "testbed.bench.netem", "floor-rx",
                 "--host", spec.host, "--cert", str(cert), "--key", str(key), "--ca", str(ca)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                env={**os.environ, "PYTHONPATH": netns.pythonpath()}))
        addrs = [(spec.host, floor.read_port(p)) for spec, p in zip(layout.nodes[1:], receivers, strict=True)]
        cert, key, ca = node_creds(layout.node(1))
        ctx = tls.client_context(cert, key, ca)
        pids = [p.pid for p in receivers]
        with netns.entered(layout.node(1).netns):
            asyncio.run(floor.fan_out(addrs, ctx, frame, 0, warmup))
            cpu0 = [cpu_seconds(p) or 0.0 for p in pids]
            self0 = time.process_time()
            samples, wall = asyncio.run(floor.fan_out(addrs, ctx, frame, messages, 0))
            self_cpu = time.process_time() - self0
            cpu = [(cpu_seconds(p) or 0.0) - c for p, c in zip(pids, cpu0, strict=True)]
        return samples, wall, cpu, self_cpu
    finally:
        procs.stop_all(receivers, RX_STOP_TIMEOUT_S)


def _tcp_rtt_ms(src_ns: str | None, host: str, port: int, tries: int = 5) -> float | None:
    """Median TCP connect time (one SYN / SYN-ACK round trip) from ``src_ns`` to host:port."""
    out = []
    with netns.entered(src_ns):
        for _ in range(tries):
            t0 = time.perf_counter()
            try:
                with socket.create_connection((host, port), 5):
                    out.append((time.perf_counter() - t0) * 1e3)
            except OSError:
                pass
    return sorted(out)[len(out) // 2] if out else None


def bench_one_netem(work: Path, nodes: int, messages: int, warmup: int, em: Netem) -> dict[str, Any]:
    """testbed.bench.fanout.bench_one with every node in its own namespace and ``em`` on every node's egress."""
    root = Path(tempfile.mkdtemp(prefix=f"{nodes}n-", dir=work.resolve()))
    net = netns.plan(nodes)
    try:
        layout = build_layout(root, nodes, netns={n.index: (n.ns, n.addr) for n in net.nodes})
        netns.create(root, net)
        for n in net.nodes:
            set_netem(root, net, n.index, em)
        _, frame = ping_frame(layout, int(time.time() * 1000))
        progress = Progress(f"bench {nodes} nodes ({em.describe()})", messages)
        print(f"bench: starting {nodes} nodes in namespaces under {root}, netem {em.describe()}", file=sys.stderr)
        with LocalMesh(layout) as mesh:
            n2 = layout.node(2)
            measured_rtt = _tcp_rtt_ms(layout.node(1).netns, n2.host, n2.port)
            pids = [mesh.procs[n.index].pid for n in layout.nodes[1:]]
            with netns.entered(layout.node(1).netns):
                ours = asyncio.run(bench_mesh(layout, pids, messages, warmup, progress), debug=False)
        progress.done()
        print(f"bench: floor for {nodes} nodes under the same netem", file=sys.stderr)
        fl = _floor_under_netem(layout, frame, messages, warmup)
    finally:
        netns.teardown(root)
        shutil.rmtree(root, ignore_errors=True)
    row = result_row(nodes, messages, warmup, len(frame), ours, fl)
    rtt = em.emulated_rtt_ms
    row.update({"netem": em.describe(), "emulated_rtt_ms": rtt, "measured_tcp_rtt_ms": measured_rtt,
                "p95_over_rtt": row["ours"]["p95_ms"] / rtt if rtt else None,
                "floor_p95_over_rtt": row["floor"]["p95_ms"] / rtt if rtt else None})
    return row


def netem_markdown(report: dict[str, Any]) -> str:
    """Lines added under the bench table for a --netem run."""
    ne = report.get("netem")
    if not ne:
        return ""
    lines = ["", f"Emulated WAN: `{ne['spec']}` on every node's egress (and on every floor receiver's); "
                 f"{ne['rtt_note']}", "",
             "| nodes | emulated RTT | measured TCP RTT n1→n2 | ours p50 / p95 (ms) | ours p95 / RTT "
             "| floor p50 / p95 (ms) | floor p95 / RTT | target p95 ≤ 1.3 × RTT |",
             "|---:|---:|---:|---|---:|---|---:|:-:|"]
    for r in report["results"]:
        o, f = r["ours"], r["floor"]
        m = r.get("measured_tcp_rtt_ms")
        ratio, fratio = r.get("p95_over_rtt"), r.get("floor_p95_over_rtt")
        ok = "-" if ratio is None else ("yes" if ratio <= TARGET_P95_OVER_RTT else "**no**")
        lines.append(f"| {r['nodes']} | {r['emulated_rtt_ms']:g} ms | {'-' if m is None else f'{m:.1f} ms'} "
                     f"| {o['p50_ms']:.2f} / {o['p95_ms']:.2f} | {'-' if ratio is None else f'{ratio:.2f}×'} "
                     f"| {f['p50_ms']:.2f} / {f['p95_ms']:.2f} | {'-' if fratio is None else f'{fratio:.2f}×'} "
                     f"| {ok} |")
    return "\n".join(lines) + "\n"


def floor_rx(host: str, cert: Path, key: Path, ca: Path) -> int:
    """A floor echo receiver bound to ``host`` (a namespace address), run inside that namespace."""
    floor.new_loop_policy()
    asyncio.run(floor.serve(cert, key, ca, host))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.bench.netem")
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("floor-rx", help="bench floor echo receiver bound to a namespace address")
    f.add_argument("--host", required=True)
    f.add_argument("--cert", type=Path, required=True)
    f.add_argument("--key", type=Path, required=True)
    f.add_argument("--ca", type=Path, required=True)
    args = p.parse_args(argv)
    return floor_rx(args.host, args.cert, args.key, args.ca)


if __name__ == "__main__":
    sys.exit(main())
