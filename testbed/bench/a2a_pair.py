"""A2A transport between two processes, against a bare-TLS floor.

    .venv/bin/python -m testbed.bench.a2a_pair [--messages N] [--pipelined M] [--window W] [--quick]

Process 1: a real node (`ai-memory serve`, started by the testbed) is the receiver.
Process 2 (this one): a PeerLink (mesh.link) with node 1's credentials dials node 2 and measures
  (a) sequential ping round trips (send, wait for the ACK, next) -> p50/p95/p99,
  (b) pipelined throughput: up to W pings in flight on the one WebSocket -> ACKed messages/s,
  (c) PeerLink.send_many in calls of --batch pings (W in flight), once with batch frames and once forced to
      one frame per envelope, on the same socket -> ACKed messages/s each (skipped with --batch 0).
Floor: a bare asyncio TLS 1.3 echo server in its own subprocess, same certificates and mTLS contexts
(mesh.tls), same frame size, 4-byte length-prefixed frames, measured the same two ways.

Targets (issue "mTLS mesh transport and the A2A protocol"): sequential p95 <= 2x the bare-TLS p95;
>= 20,000 ACKed messages/s pipelined. Prints a markdown table and writes bench/out/a2a_pair.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from a2a import Backoff, new_envelope
from mesh import keys, tls
from mesh.link import PeerLink
from mesh.linkstate import LinkState
from testbed.bench import floor as echo_floor  # the bare TLS echo server every bench compares with
from testbed.bench.figures import pct
from testbed.mesh.build import build_layout
from testbed.mesh.local import LocalMesh
from testbed.paths import BENCH_OUT, ROOT

OUT = BENCH_OUT / "a2a_pair.json"
HEADER = echo_floor.HEADER
WARMUP = 200
TARGET_P95_RATIO = 2.0
TARGET_MSGS_PER_S = 20_000


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in samples_s]
    return {"p50_ms": round(pct(ms, 50), 4), "p95_ms": round(pct(ms, 95), 4), "p99_ms": round(pct(ms, 99), 4),
            "mean_ms": round(statistics.fmean(ms), 4), "n": len(ms)}


# ------------------------------------------------------------------ floor: bare TLS echo server


async def floor_run(port: int, ctx, frame: bytes, sequential: int, pipelined: int, window: int) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    msg = HEADER.pack(len(frame)) + frame
    n = len(msg)

    async def one() -> None:
        writer.write(msg)
        await reader.readexactly(n)

    for _ in range(WARMUP):
        await one()
    samples = []
    for _ in range(sequential):
        t0 = time.perf_counter()
        await one()
        samples.append(time.perf_counter() - t0)

    slots = asyncio.Semaphore(window)

    async def read_all() -> None:
        for _ in range(pipelined):
            await reader.readexactly(n)
            slots.release()

    t0 = time.perf_counter()
    rd = asyncio.create_task(read_all())
    for _ in range(pipelined):
        await slots.acquire()
        writer.write(msg)
        if writer.transport.get_write_buffer_size() > 1 << 20:
            await writer.drain()
    await rd
    elapsed = time.perf_counter() - t0
    writer.close()
    return {"sequential": percentiles(samples), "pipelined": {
        "messages": pipelined, "window": window, "seconds": round(elapsed, 4),
        "msgs_per_s": round(pipelined / elapsed, 1)}}


# ------------------------------------------------------------------ ours: PeerLink -> real node


async def link_run(layout, sequential: int, pipelined: int, window: int, batch_size: int = 0) -> tuple[dict, int]:
    n1, n2 = layout.node(1), layout.node(2)
    ca_path = layout.root / "ca" / "ca.crt"
    ctx = tls.client_context(n1.home / "tls" / "node.crt", n1.home / "keys" / f"{n1.agent_id}.priv", ca_path)
    pinned = {n2.agent_id: keys.load_public_key(n1.home / "peers" / f"{n2.agent_id}.pub")}
    link = PeerLink(n2.agent_id, n2.url, ctx, pinned=lambda: pinned, backoff=Backoff(0.1, 1.0),
                    ack_timeout_s=30.0, max_bytes=1024 * 1024)
    runner = asyncio.create_task(link.run())
    try:
        for _ in range(300):
            if link.state is LinkState.UP:
                break
            await asyncio.sleep(0.05)
        else:
            raise SystemExit(f"link to {n2.agent_id} did not come up: {link.last_error}")

        def frames(count: int) -> list[tuple[str, bytes]]:
            now = int(time.time() * 1000)
            out = []
            for _ in range(count):
                env = new_envelope(n1.agent_id, [n2.agent_id], {"kind": "ping", "sent_at": now}, now, 600_000)
                out.append((env.correlation_id, env.to_wire()))
            return out

        frame_size = len(frames(1)[0][1])
        for cid, wire in frames(WARMUP):
            await link.send_wire(cid, wire)
        samples = []
        for cid, wire in frames(sequential):
            t0 = time.perf_counter()
            ack = await link.send_wire(cid, wire)
            samples.append(time.perf_counter() - t0)
            assert ack.accepted, ack
        result = {"sequential": percentiles(samples),
                  "pipelined": await pipelined_run(link, frames(pipelined), window)}
        if batch_size and hasattr(link, "send_many"):
            result["send_many"] = await many_runs(link, frames, pipelined, batch_size, window)
        return result, frame_size
    finally:
        await link.close()
        await runner


async def pipelined_run(link, batch: list[tuple[str, bytes]], window: int) -> dict:
    """``batch`` through PeerLink.send_wire, up to ``window`` in flight: ACKed messages per second."""
    slots = asyncio.Semaphore(window)
    accepted = 0

    async def one(cid: str, wire: bytes) -> None:
        nonlocal accepted
        try:
            ack = await link.send_wire(cid, wire)
            accepted += ack.accepted
        finally:
            slots.release()

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for cid, wire in batch:
            await slots.acquire()
            tg.create_task(one(cid, wire))
    elapsed = time.perf_counter() - t0
    assert accepted == len(batch), f"only {accepted} of {len(batch)} ACKed as accepted"
    return {"messages": len(batch), "window": window, "seconds": round(elapsed, 4),
            "msgs_per_s": round(len(batch) / elapsed, 1)}


async def many_runs(link, frames, messages: int, batch: int, window: int) -> dict:
    """Same socket, one after the other: send_many with batch frames, then forced to one frame per envelope."""
    negotiated = link.batch_frames
    out = {"batch": batch, "window": window, "negotiated": negotiated}
    for label, use_batch in (("batch_frames", True), ("single_frames", False)):
        link.batch_frames = negotiated and use_batch
        out[label] = await many_run(link, frames, messages, batch, window)
    link.batch_frames = negotiated
    return out


async def many_run(link, frames, messages: int, batch: int, window: int) -> dict:
    """``messages`` pings through PeerLink.send_many in calls of ``batch`` items, ``window // batch`` calls
    in flight: ACKed envelopes per second."""
    calls = [frames(batch) for _ in range(max(1, messages // batch))]
    slots = asyncio.Semaphore(max(1, window // batch))
    accepted = 0
    refused: collections.Counter[str] = collections.Counter()

    async def one(items) -> None:
        nonlocal accepted
        try:
            for result in await link.send_many(items):
                if getattr(result, "accepted", False):
                    accepted += 1
                else:
                    refused[getattr(result, "reason", None) or getattr(result, "code", "?")] += 1
        finally:
            slots.release()

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for items in calls:
            await slots.acquire()
            tg.create_task(one(items))
    elapsed = time.perf_counter() - t0
    sent = len(calls) * batch
    assert accepted == sent, f"only {accepted} of {sent} ACKed as accepted; the others: {dict(refused)}"
    return {"messages": sent, "seconds": round(elapsed, 4), "msgs_per_s": round(sent / elapsed, 1)}


# ------------------------------------------------------------------ main


def table(ours: dict, floor: dict) -> str:
    rows = ["| measure | a2a (PeerLink -> node) | bare TLS echo | ratio ours/floor |", "|---|---:|---:|---:|"]
    for k in ("p50_ms", "p95_ms", "p99_ms"):
        a, b = ours["sequential"][k], floor["sequential"][k]
        rows.append(f"| sequential {k[:3]} (ms) | {a:.3f} | {b:.3f} | {a / b:.2f}x |")
    a, b = ours["pipelined"]["msgs_per_s"], floor["pipelined"]["msgs_per_s"]
    rows.append(f"| pipelined msgs/s (window {ours['pipelined']['window']}) | {a:,.0f} | {b:,.0f} | {a / b:.2f}x |")
    many = ours.get("send_many")
    if many:
        for label in ("single_frames", "batch_frames"):
            a = many[label]["msgs_per_s"]
            rows.append(f"| send_many msgs/s, {label.replace('_', ' ')} ({many['batch']} a call, window "
                        f"{many['window']}) | {a:,.0f} | {b:,.0f} | {a / b:.2f}x |")
    return "\n".join(rows)


async def measure(layout, echo_port: int, args) -> tuple[dict, int, dict]:
    """(ours, frame size in bytes, floor): the PeerLink runs to node 2, then the bare-TLS echo runs."""
    n1 = layout.node(1)
    ours, frame_size = await link_run(layout, args.messages, args.pipelined, args.window, args.batch)
    ctx = tls.client_context(n1.home / "tls" / "node.crt", n1.home / "keys" / f"{n1.agent_id}.priv",
                             layout.root / "ca" / "ca.crt")
    floor = await floor_run(echo_port, ctx, os.urandom(frame_size), args.messages, args.pipelined, args.window)
    return ours, frame_size, floor


def no_rate_limit(config_path: Path) -> None:
    """limits.peer_requests_per_second = 0 on the receiver: the bench measures the transport, and its
    pipelined runs pass the default 10,000 messages/s a peer may send (the excess is rate_limited)."""
    lines = config_path.read_text(encoding="utf-8").splitlines()
    if "[limits]" in lines:
        lines.insert(lines.index("[limits]") + 1, "peer_requests_per_second = 0")
    else:
        lines += ["", "[limits]", "peer_requests_per_second = 0"]
    config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def bench(args) -> dict:
    """Start node 2 and the echo server (plain processes), measure both on one event loop, stop both."""
    with tempfile.TemporaryDirectory(prefix="a2a-bench-") as tmp:
        layout = build_layout(Path(tmp) / "mesh", 2, mcp_http=False)
        n2 = layout.node(2)
        no_rate_limit(n2.config_path)
        ca_path = layout.root / "ca" / "ca.crt"
        mesh = LocalMesh(layout)
        echo = subprocess.Popen([sys.executable, "-m", "testbed.bench.a2a_pair", "--echo-server",
                                 str(n2.home / "tls" / "node.crt"),
                                 str(n2.home / "keys" / f"{n2.agent_id}.priv"), str(ca_path)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            mesh.start([2], want_links=False)
            echo_port = int(echo.stdout.readline().split()[1])  # "port N"
            ours, frame_size, floor = run(measure(layout, echo_port, args))
        finally:
            mesh.stop_all()
            echo.stdin.close()
            try:
                echo.wait(10)
            except subprocess.TimeoutExpired:
                echo.kill()
                echo.wait(10)
    p95_ratio = ours["sequential"]["p95_ms"] / floor["sequential"]["p95_ms"]
    return {
        "frame_bytes": frame_size, "sequential_messages": args.messages, "warmup": WARMUP,
        "ours": ours, "floor": floor,
        "ratios": {k: round(ours["sequential"][k] / floor["sequential"][k], 3) for k in ("p50_ms", "p95_ms", "p99_ms")}
        | {"pipelined_msgs_per_s": round(ours["pipelined"]["msgs_per_s"] / floor["pipelined"]["msgs_per_s"], 3)},
        "targets": {"sequential_p95_ratio_max": TARGET_P95_RATIO, "sequential_p95_ratio": round(p95_ratio, 3),
                    "sequential_p95_met": p95_ratio <= TARGET_P95_RATIO,
                    "pipelined_msgs_per_s_min": TARGET_MSGS_PER_S,
                    "pipelined_met": ours["pipelined"]["msgs_per_s"] >= TARGET_MSGS_PER_S},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "loop": "uvloop" if _uvloop() else "asyncio"},
        "quick": args.quick,
    }


def _uvloop():
    try:
        import uvloop
        return uvloop
    except ImportError:
        return None


def run(coro):
    uv = _uvloop()
    return uv.run(coro) if uv else asyncio.run(coro)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--echo-server":
        run(echo_floor.serve(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=3000, help="sequential round trips (default 3000)")
    p.add_argument("--pipelined", type=int, default=30000, help="pipelined messages (default 30000)")
    p.add_argument("--window", type=int, default=256, help="messages in flight when pipelined (default 256)")
    p.add_argument("--batch", type=int, default=128,
                   help="items per send_many call in the batch-frame run (0 = skip it; default 128)")
    p.add_argument("--quick", action="store_true", help="small run (500 sequential, 5000 pipelined)")
    args = p.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the node subprocess and the echo server are still stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.messages, args.pipelined = 500, 5000
    result = bench(args)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result["ours"], result["floor"]))
    t = result["targets"]
    print(f"\nframe {result['frame_bytes']} B; sequential p95 ratio {t['sequential_p95_ratio']:.2f}x "
          f"(target <= {TARGET_P95_RATIO:g}x: {'met' if t['sequential_p95_met'] else 'MISSED'}); "
          f"pipelined {result['ours']['pipelined']['msgs_per_s']:,.0f} msgs/s "
          f"(target >= {TARGET_MSGS_PER_S:,}: {'met' if t['pipelined_met'] else 'MISSED'})")
    print(f"JSON: {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
