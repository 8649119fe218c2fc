"""Federation under load: links made on node A of a real 3-node mesh through MCP, peer-attested on B and C.

    .venv/bin/python -m testbed.bench.federation_bench [--links 10000] [--quick] [--memories 300]
        [--sessions 8] [--concurrency 32] [--batch 100] [--batch-links N] [--ping-interval-ms 10] [--idle-s 5]
        [--timeout-s 600] [--send-window-bytes N] [--links-per-envelope N]

Three real ``ai-memory serve`` subprocesses (testbed.mesh), MCP over streamable HTTP on.
1. A few hundred memories are stored on A (MCP HTTP) and the bench waits until B and C hold them all.
2. Idle: a separate pinger process opens a PeerLink (one mTLS WebSocket) to B with A's certificate and key
   and sends a ``ping`` envelope every ``--ping-interval-ms`` (each on its own schedule, so a stall shows
   as many slow samples, not one), recording each ACK round trip.
3. Flood: ``--links`` ``memory_link`` calls on A through A's MCP streamable HTTP endpoint, ``--concurrency``
   calls in flight spread over ``--sessions`` SDK client sessions, while the pinger keeps pinging B.
   B and C's ``memory_capabilities.links_by_attest_level.peer_attested`` are polled until both reach the
   number of links made: time to convergence and links/s end to end, from the first call.
   Then the batched flood: ``--batch-links`` links, ``--batch`` per ``memory_link_many`` call, the same way.
4. Requirement: ping ACK p95 on B during each flood (first call .. convergence) <= 2x its idle p95.

The pinger runs in its own process so that the bench's MCP client load (same machine) does not sit on
the measuring event loop or its GIL. Prints a markdown table, writes bench/out/federation.json and the
``## Federation (testbed/bench/federation_bench.py)`` section of PERFORMANCE.md (``--no-perf-md`` to skip).
Every phase is bounded (``--timeout-s`` overall); the node processes and the pinger are always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing as mp
import os
import random
import shlex
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from a2a import Backoff, new_envelope
from mesh import keys, tls
from mesh.link import PeerLink
from mesh.linkstate import LinkState
from node.config import MIN_SEND_WINDOW_BYTES, load_config
from testbed.bench.figures import machine
from testbed.mesh.build import MeshLayout, NodeSpec, agent_id_for, build_layout
from testbed.mesh.local import LocalMesh
from testbed.mesh.state import cpu_seconds
from testbed.paths import BENCH_OUT, ROOT

SECTION = "## Federation (testbed/bench/federation_bench.py)"
RATIO_LIMIT = 2.0
CALL_TIMEOUT_S = 30.0
PING_TIMEOUT_S = 5.0
PING_TTL_MS = 60_000
POLL_S = 0.2
LINK_UP_TIMEOUT_S = 30.0
REPLICATE_TIMEOUT_S = 60.0
PINGER_START_TIMEOUT_S = 30.0
PINGER_JOIN_S = 10.0
QUICK_LINKS = 1000


# ---- statistics -----------------------------------------------------------------------------

def pct(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(round(q * (len(sorted_ms) - 1))))]


def summary(samples_ms: list[float], failed: int = 0) -> dict[str, Any]:
    s = sorted(samples_ms)
    if not s:
        return {"n": 0, "failed": failed}
    return {"n": len(s), "failed": failed, "p50_ms": pct(s, 0.50), "p95_ms": pct(s, 0.95),
            "p99_ms": pct(s, 0.99), "max_ms": s[-1], "mean_ms": sum(s) / len(s)}


# ---- the pinger (its own process) -----------------------------------------------------------

def pinger_main(cfg: dict[str, Any], ready: Any, stop: Any) -> None:
    """Ping B as A over one PeerLink until ``stop``; write [(t_send, rtt | -1, t_written, crc32 of the frame)]
    to cfg['out'] (monotonic ns; t_written: when ``send_wire`` returned, which has written the frame while the link
    is up and its socket takes it, t_send when the call raised). The crc finds the frame again in what B took
    (probes/ping_path here)."""
    samples: list[tuple[int, int, int, int]] = []
    try:
        asyncio.run(_pinger(cfg, ready, stop, samples))
    finally:
        Path(cfg["out"]).write_text(json.dumps(samples))


async def _pinger(cfg: dict[str, Any], ready: Any, stop: Any, samples: list[tuple[int, int, int, int]]) -> None:
    ctx = tls.client_context(Path(cfg["cert"]), Path(cfg["key"]), Path(cfg["ca"]))
    pinned = {cfg["peer_id"]: keys.load_public_key(Path(cfg["peer_pub"]))}
    link = PeerLink(cfg["peer_id"], cfg["peer_url"], ctx, pinned=lambda: pinned, backoff=Backoff(0.1, 1.0),
                    ack_timeout_s=PING_TIMEOUT_S, max_bytes=cfg["max_bytes"])
    interval = cfg["interval_s"]

    async def one() -> None:
        now_ms = int(time.time() * 1000)
        env = new_envelope(cfg["me"], [cfg["peer_id"]], {"kind": "ping", "sent_at": now_ms}, now_ms, PING_TTL_MS)
        frame = env.to_wire()
        t0 = written = time.monotonic_ns()
        try:
            acked = link.send_wire(env.correlation_id, frame, timeout_s=PING_TIMEOUT_S)
            written = time.monotonic_ns()
            ack = await acked
            rtt = time.monotonic_ns() - t0 if ack.accepted else -1
        except Exception:  # ack_timeout / link_down: counted as a failed ping
            rtt = -1
        samples.append((t0, rtt, written, zlib.crc32(frame)))

    runner = asyncio.create_task(link.run(), name="pinger-link")
    try:
        deadline = time.monotonic() + LINK_UP_TIMEOUT_S
        while link.state is not LinkState.UP:
            if time.monotonic() > deadline:
                raise SystemExit(f"pinger: no link to {cfg['peer_id']}: {link.last_error}")
            await asyncio.sleep(0.02)
        for _ in range(50):  # warm-up, not recorded
            await one()
        samples.clear()
        # Everything alive now (imports, the link) lives until the end: keep the cyclic collector off it, or a
        # full collection in the measuring process stalls every ping in flight.
        gc.collect()
        gc.freeze()
        ready.set()
        pending: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not stop.is_set():
            t = asyncio.create_task(one())
            pending.add(t)
            t.add_done_callback(pending.discard)
            next_at += interval
            delay = next_at - loop.time()
            if delay < 0:  # fell behind (this process was descheduled): skip missed ticks, keep the cadence
                next_at = loop.time()
                delay = 0
            await asyncio.sleep(delay)
        if pending:
            await asyncio.wait(pending, timeout=PING_TIMEOUT_S + 1)
    finally:
        await link.close()
        runner.cancel()
        with contextlib.suppress(BaseException):
            await runner


def start_pinger(layout: MeshLayout, workdir: Path, interval_s: float) -> tuple[mp.Process, Any, Any, Path]:
    a, b = layout.node(1), layout.node(2)
    cfg_a = load_config(a.config_path, env={})
    ident = keys.load_identity(a.home / "keys", a.agent_id)
    out = workdir / "pings.json"
    cfg = {"cert": str(cfg_a.cert_path), "key": str(ident.priv_path), "ca": str(cfg_a.ca_cert_path),
           "me": a.agent_id, "peer_id": b.agent_id, "peer_url": b.url,
           "peer_pub": str(b.home / "keys" / f"{b.agent_id}.pub"), "max_bytes": cfg_a.a2a.max_message_bytes,
           "interval_s": interval_s, "out": str(out)}
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=pinger_main, args=(cfg, ready, stop), name="federation-bench-pinger", daemon=True)
    proc.start()
    return proc, ready, stop, out


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus`` (threads started before the call included)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def pin_mesh(pids: dict[str, int], b_cpu: int) -> dict[str, list[int]]:
    """B (and, later, the pinger) alone on ``b_cpu``; A, C and this process on the other CPUs."""
    others = set(range(os.cpu_count() or 1)) - {b_cpu}
    pin(pids["B"], {b_cpu})
    for name in ("A", "C"):
        pin(pids[name], others)
    pin(os.getpid(), others)
    return {"B + pinger": [b_cpu], "A, C, bench client": sorted(others)}


def stop_pinger(proc: mp.Process, stop: Any) -> None:
    stop.set()
    proc.join(PINGER_JOIN_S)
    if proc.is_alive():
        proc.terminate()
        proc.join(PINGER_JOIN_S)


class CpuMeter:
    """CPU seconds per wall second of each process (nodes by pid, this bench, the pinger) over a window."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.c0 = self._now()

    def _now(self) -> dict[str, float | None]:
        return {**{k: cpu_seconds(p) for k, p in self.pids.items()}, "bench": time.process_time()}

    def stop(self) -> dict[str, float | None]:
        c1, dt = self._now(), time.monotonic() - self.t0
        return {k: None if c1[k] is None or self.c0[k] is None else round((c1[k] - self.c0[k]) / dt, 3)
                for k in c1}


# ---- MCP helpers ----------------------------------------------------------------------------

class Sessions:
    """Open MCP streamable-HTTP client sessions, closed together."""

    def __init__(self) -> None:
        self.stack = contextlib.AsyncExitStack()

    async def open(self, url: str) -> ClientSession:
        r, w, *_ = await self.stack.enter_async_context(streamable_http_client(url))
        s = await self.stack.enter_async_context(ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S))
        await s.initialize()
        return s

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stack.aclose()


async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await session.call_tool(tool, args)
    if res.is_error:
        raise RuntimeError(res.content[0].text if res.content else f"{tool} failed")
    return res.structured_content


def mcp_url(spec: NodeSpec) -> str:
    return f"http://127.0.0.1:{spec.mcp_http_port}/mcp"


async def wait_until(pred, what: str, timeout_s: float, poll_s: float = POLL_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(poll_s)


# ---- the run --------------------------------------------------------------------------------

CONTROL_NS = "fedbench_control"


async def flood(a_sessions: list[ClientSession], watch: dict[str, ClientSession], pairs: list[tuple[str, str, str]],
                concurrency: int, timeout_s: float, cpu_pids: dict[str, int], batch: int = 1) -> dict[str, Any]:
    """Link every pair on A at full rate, one ``memory_link`` call per pair (``batch`` 1) or ``batch`` pairs per
    ``memory_link_many`` call; poll ``watch`` nodes until each counts every link made as peer_attested.
    Returns monotonic-ns marks, the call latencies and errors, the links made, CPU use."""
    base = {n: await peer_attested(s) for n, s in watch.items()}
    next_i = 0
    made = 0
    call_ms: list[float] = []
    errors: list[str] = []
    converged_at: dict[str, int] = {}
    progress: dict[str, int] = {}
    calls_finished = asyncio.Event()

    async def worker(w: int) -> None:
        nonlocal next_i, made
        s = a_sessions[w % len(a_sessions)]
        while next_i < len(pairs):
            chunk = pairs[next_i:next_i + batch]
            next_i += len(chunk)
            t = time.perf_counter_ns()
            try:
                n = await link_chunk(s, chunk, errors)  # not `made += await ...`: that reads made before the await
                made += n
                call_ms.append((time.perf_counter_ns() - t) / 1e6)
            except Exception as e:  # counted and reported; the flood goes on
                errors.append(f"{type(e).__name__}: {e}"[:200])

    async def poll() -> None:
        while len(converged_at) < len(watch):
            for name, s in watch.items():
                if name not in converged_at:
                    progress[name] = await peer_attested(s) - base[name]
                    if calls_finished.is_set() and progress[name] >= made:
                        converged_at[name] = time.monotonic_ns()
            await asyncio.sleep(POLL_S)

    cpu = CpuMeter(cpu_pids)
    start = time.monotonic_ns()
    poller = asyncio.create_task(poll())
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(worker(w) for w in range(concurrency)))
        calls_end = time.monotonic_ns()
        calls_finished.set()
        print(f"  {len(call_ms)} calls ({made} links) done in {(calls_end - start) / 1e9:.1f} s "
              f"({len(errors)} errors); "
              f"waiting for {', '.join(watch)}", file=sys.stderr)
        try:
            async with asyncio.timeout(timeout_s):
                await poller
        except TimeoutError:
            raise TimeoutError(f"{', '.join(watch)} did not converge within {timeout_s:g} s: "
                               f"peer_attested so far {progress} of {made}") from None
    finally:
        poller.cancel()
    end = max(converged_at.values())
    return {"start": start, "calls_end": calls_end, "end": end, "call_ms": call_ms, "errors": errors, "made": made,
            "batch": batch,
            "converged_at_s": {k: (v - start) / 1e9 for k, v in converged_at.items()}, "cpu": cpu.stop()}


async def link_chunk(s: ClientSession, chunk: list[tuple[str, str, str]], errors: list[str]) -> int:
    """One call linking ``chunk`` (memory_link for one pair, else memory_link_many); returns the links made."""
    if len(chunk) == 1:
        src, dst, rel = chunk[0]
        await call(s, "memory_link", {"src_id": src, "dst_id": dst, "relation": rel})
        return 1
    out = await call(s, "memory_link_many", {"links": [{"src_id": src, "dst_id": dst, "relation": rel}
                                                       for src, dst, rel in chunk]})
    errors.extend(r["error"]["message"][:200] for r in out["results"] if "error" in r)
    return int(out["made"])


async def peer_attested(s: ClientSession) -> int:
    return (await call(s, "memory_capabilities", {}))["links_by_attest_level"]["peer_attested"]


async def run(layout: MeshLayout, args: argparse.Namespace, workdir: Path, pids: dict[str, int]) -> dict[str, Any]:
    """Prefill, idle pings, the floods (and the control); the report (``report``)."""
    sessions = Sessions()
    proc = None
    stop = None
    try:
        a_sessions, watch = await open_sessions(sessions, layout, args)
        rng = random.Random(11)
        ids, ctl_ids, prefill_s = await prefill(a_sessions, watch, args, rng)

        # 2. idle pings on B
        proc, ready, stop, pings_path = start_pinger(layout, workdir, args.ping_interval_ms / 1000)
        if args.pin:
            pin(proc.pid, {args.pin_b_cpu})
        await wait_pinger_ready(proc, ready)
        pids = {**pids, "pinger": proc.pid}
        cpu_idle = CpuMeter(pids)
        idle_start = time.monotonic_ns()
        await asyncio.sleep(args.idle_s)
        idle_end = time.monotonic_ns()
        cpu_idle = cpu_idle.stop()

        main, batched, control = await floods(a_sessions, watch, ids, ctl_ids, args, pids, rng)
        stop_pinger(proc, stop)
        proc = None
        caps = {n: await call(s, "memory_capabilities", {}) for n, s in zip(("A", "B", "C"), watch, strict=True)}
    finally:
        if proc is not None:
            stop_pinger(proc, stop)
        await sessions.close()

    samples = json.loads(pings_path.read_text())
    keep_pings(args.keep_pings, samples, {"idle": {"start": idle_start, "end": idle_end}, "single": main,
                                          "batched": batched})
    return report(args, samples, (idle_start, idle_end), cpu_idle, prefill_s, main, control, caps, batched)


async def open_sessions(sessions: Sessions, layout: MeshLayout, args: argparse.Namespace) \
        -> tuple[list[ClientSession], tuple[ClientSession, ClientSession, ClientSession]]:
    """``--sessions`` sessions to A that make the links, and one watch session each to A, B and C."""
    a, b, c = layout.node(1), layout.node(2), layout.node(3)
    a_sessions = [await sessions.open(mcp_url(a)) for _ in range(args.sessions)]
    if args.load_family:
        # As an agent that links does: memory_link is in the graph family, not listed by the default
        # profile, and the SDK client re-lists the tools after every call to a tool it has not seen
        # listed (one extra tools/list round trip per memory_link).
        for s in a_sessions:
            await call(s, "memory_load_family", {"family": "graph"})
    sa, sb, sc = [await sessions.open(mcp_url(n)) for n in (a, b, c)]
    # The watch sessions poll memory_capabilities (admin family): listed, each poll is one request
    # to B and C, not a call plus a full tools/list.
    await asyncio.gather(*(call(s, "memory_load_family", {"family": "admin"}) for s in (sa, sb, sc)))
    return a_sessions, (sa, sb, sc)


async def prefill(a_sessions: list[ClientSession], watch: tuple[ClientSession, ClientSession, ClientSession],
                  args: argparse.Namespace, rng: random.Random) -> tuple[list[str], list[str], float]:
    """1. memories on A, replicated to B and C (and, for the control run, memories that go to C only);
    (their ids, the control's ids, seconds until B and C held them all)."""
    _, sb, sc = watch
    t0 = time.monotonic()
    sem = asyncio.Semaphore(args.concurrency)

    async def store(i: int, namespace: str) -> str:
        async with sem:
            m = await call(a_sessions[i % len(a_sessions)], "memory_store",
                           {"content": f"federation bench memory {i} " + "x" * rng.randint(20, 200),
                            "tags": ["fedbench"], "namespace": namespace})
            return m["id"]

    ids = await asyncio.gather(*(store(i, "default") for i in range(args.memories)))
    ctl_ids = (await asyncio.gather(*(store(i, CONTROL_NS) for i in range(args.memories)))
               if args.control else [])

    async def replicated() -> bool:
        mb = (await call(sb, "memory_capabilities", {}))["memories"]
        mc = (await call(sc, "memory_capabilities", {}))["memories"]
        return mb >= args.memories and mc >= args.memories + len(ctl_ids)

    await wait_until(replicated, f"{args.memories} memories on B and C", REPLICATE_TIMEOUT_S)
    prefill_s = time.monotonic() - t0
    print(f"{args.memories} memories on A, B and C in {prefill_s:.1f} s", file=sys.stderr)
    return ids, ctl_ids, prefill_s


async def floods(a_sessions: list[ClientSession], watch: tuple[ClientSession, ClientSession, ClientSession],
                 ids: list[str], ctl_ids: list[str], args: argparse.Namespace, pids: dict[str, int],
                 rng: random.Random) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
    """3. the flood (links replicated to B and C, verified there), then the batched flood; 4. the control:
    the same load on A and C, none of it reaching B (namespace shared with C only). Their ``flood`` results."""
    _, sb, sc = watch

    def pairs_of(pool: list[str], tag: str, n: int) -> list[tuple[str, str, str]]:
        return [(*rng.sample(pool, 2), f"{tag}_{i}") for i in range(n)]

    print(f"idle pings for {args.idle_s:g} s done; flood: {args.links} memory_link calls on A", file=sys.stderr)
    main = await flood(a_sessions, {"B": sb, "C": sc}, pairs_of(ids, "fedbench", args.links), args.concurrency,
                       args.timeout_s, pids)
    batched = None
    if args.batch > 1:
        await asyncio.sleep(2.0)
        print(f"batched flood: {args.batch_links} links on A, {args.batch} per memory_link_many call",
              file=sys.stderr)
        batched = await flood(a_sessions, {"B": sb, "C": sc}, pairs_of(ids, "fedbench_many", args.batch_links),
                              args.concurrency, args.timeout_s, pids, batch=args.batch)
    control = None
    if args.control:
        await asyncio.sleep(2.0)
        b_before = await peer_attested(sb)
        print(f"control: {args.links} memory_link calls on A in namespace {CONTROL_NS!r} (C only)",
              file=sys.stderr)
        control = await flood(a_sessions, {"C": sc}, pairs_of(ctl_ids, "fedbench_ctl", args.links),
                              args.concurrency, args.timeout_s, pids)
        control["b_received"] = await peer_attested(sb) - b_before
    return main, batched, control


def keep_pings(path: Path | None, samples: list[Any], phases: dict[str, Any]) -> None:
    """Every ping and each phase's window (monotonic ns) to ``path``, for testbed.bench.probes.ping_path.split."""
    if path is None:
        return
    windows = {name: [p["start"], p["end"]] for name, p in phases.items() if p is not None}
    path.write_text(json.dumps({"samples": samples, "windows": windows}))


async def wait_pinger_ready(proc: mp.Process, ready: Any) -> None:
    deadline = time.monotonic() + PINGER_START_TIMEOUT_S
    while not ready.is_set():
        if not proc.is_alive():
            raise RuntimeError(f"pinger exited with {proc.exitcode}")
        if time.monotonic() > deadline:
            raise TimeoutError("pinger did not connect to B in time")
        await asyncio.sleep(0.05)


def ping_window(samples: list[tuple[int, int, int, int]], lo: int, hi: int) -> dict[str, Any]:
    """Ping RTT summary (ms) of the pings sent in [lo, hi) monotonic ns; failed pings counted apart."""
    rows = [(t, r) for t, r, *_ in samples if lo <= t < hi]
    return summary([r / 1e6 for _, r in rows if r >= 0], failed=sum(1 for _, r in rows if r < 0))


def flood_stats(samples: list[tuple[int, int, int, int]], f: dict[str, Any]) -> dict[str, Any]:
    made = f["made"]
    calls_s, conv_s = (f["calls_end"] - f["start"]) / 1e9, (f["end"] - f["start"]) / 1e9
    return {"links_made": made, "links_per_call": f["batch"], "calls": len(f["call_ms"]),
            "call_errors": len(f["errors"]), "call_error_samples": f["errors"][:5],
            "calls_s": calls_s, "calls_per_s": len(f["call_ms"]) / calls_s, "links_per_s_calls": made / calls_s,
            "convergence_s": conv_s,
            "links_per_s_end_to_end": made / conv_s, "converged_at_s": f["converged_at_s"],
            "memory_link_call_ms": summary(f["call_ms"]), "cpu_per_wall_s": f["cpu"],
            "ping": ping_window(samples, f["start"], f["end"]),
            "ping_while_calls_run": ping_window(samples, f["start"], f["calls_end"])}


def p95_ratio(during: dict[str, Any], idle: dict[str, Any]) -> float | None:
    """p95 during a flood over p95 idle; None when either window has no successful ping."""
    return during["p95_ms"] / idle["p95_ms"] if during.get("n") and idle.get("n") else None


def report(args: argparse.Namespace, samples: list[tuple[int, int, int, int]], idle_ns: tuple[int, int], cpu_idle: Any,
           prefill_s: float, main: dict[str, Any], control: dict[str, Any] | None,
           caps: dict[str, Any], batched: dict[str, Any] | None = None) -> dict[str, Any]:
    idle = ping_window(samples, *idle_ns)
    res_main = flood_stats(samples, main)
    ratio = p95_ratio(res_main["ping"], idle)
    out = {
        "links_requested": args.links, "memories": args.memories, "prefill_s": prefill_s,
        "sessions": args.sessions, "load_family": args.load_family, "concurrency": args.concurrency,
        "ping_interval_ms": args.ping_interval_ms,
        "idle_s": args.idle_s, "ping_idle": idle, "cpu_idle_per_wall_s": cpu_idle, "flood": res_main,
        "p95_ratio": ratio, "ratio_limit": RATIO_LIMIT, "pass": ratio is not None and ratio <= RATIO_LIMIT,
        "nodes": {n: {"links_by_attest_level": cp["links_by_attest_level"], "outbox_depth": cp["outbox_depth"],
                      "dead_letters": cp["dead_letters"], "a2a": cp.get("a2a")} for n, cp in caps.items()},
    }
    if batched is not None:
        rb = flood_stats(samples, batched)
        rb["p95_ratio"] = p95_ratio(rb["ping"], idle)
        rb["pass"] = rb["p95_ratio"] is not None and rb["p95_ratio"] <= RATIO_LIMIT
        out["batched_flood"] = rb
    if control is not None:
        rc = flood_stats(samples, control)
        rc["b_received_peer_attested"] = control["b_received"]
        rc["p95_ratio_to_idle"] = p95_ratio(rc["ping"], idle)
        out["control_flood_not_reaching_b"] = rc
    return out


# ---- output ---------------------------------------------------------------------------------

def fmt(v: Any, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def markdown(res: dict[str, Any], command: str) -> str:
    f, i = res["flood"], res["ping_idle"]
    fb = res.get("batched_flood")
    ctl = res.get("control_flood_not_reaching_b")
    floods = [("one `memory_link` per call", f, res["p95_ratio"])]
    if fb is not None:
        floods.append((f"{fb['links_per_call']} links per `memory_link_many` call", fb, fb["p95_ratio"]))
    lines = [
        f"Command: `{command}`",
        "",
        f"3 local `ai-memory serve` nodes (A, B, C) on one host ({res['env']['cpus']} CPUs, Python "
        f"{res['env']['python']}). Links made on A over MCP streamable HTTP ({res['concurrency']} calls in flight "
        f"over {res['sessions']} SDK sessions, "
        f"{'each with the graph family loaded' if res.get('load_family') else 'memory_link not listed'}) between "
        f"{res['memories']} memories pre-replicated to B and C: first one `memory_link` per link, then (after 2 s) "
        f"the batched flood. A separate process holds one PeerLink to B with A's certificate and key and sends a "
        f"`ping` every {res['ping_interval_ms']:g} ms (CPU pinning: {res.get('cpu_pinning') or 'none'}); "
        f"idle = {res['idle_s']:g} s before the floods; a flood = first call until B and C both count every link "
        f"as `peer_attested`.",
        "",
        "| flood | links made / errors | convergence | links/s end to end | calls/s | call p50 / p95 / p99 (ms) "
        "| CPU cores A / B / C / client / pinger | ping p95 on B: idle → flood (ms) | ratio (limit 2×) |",
        "|---|---|---|---:|---:|---|---|---|---:|",
    ]
    for name, fl, ratio in floods:
        mc, cpu = fl["memory_link_call_ms"], fl["cpu_per_wall_s"]
        lines.append(
            f"| {name} | {fl['links_made']} / {fl['call_errors']} | {fl['convergence_s']:.2f} s | "
            f"{fl['links_per_s_end_to_end']:.0f} | {fl['calls_per_s']:.0f} | {fmt(mc.get('p50_ms'), 1)} / "
            f"{fmt(mc.get('p95_ms'), 1)} / {fmt(mc.get('p99_ms'), 1)} | {fmt(cpu.get('A'))} / {fmt(cpu.get('B'))} / "
            f"{fmt(cpu.get('C'))} / {fmt(cpu.get('bench'))} / {fmt(cpu.get('pinger'))} | {fmt(i.get('p95_ms'))} → "
            f"{fmt(fl['ping'].get('p95_ms'))} | {fmt(ratio)}× |")
    lines += ["", "| ping ACK round trip on B | n | failed | p50 ms | p95 ms | p99 ms | max ms |",
              "|---|---|---|---|---|---|---|"]
    rows = [("idle (before the floods)", i)] + [(f"during the flood, {name}", fl["ping"]) for name, fl, _ in floods]
    if ctl is not None:
        rows.append((f"control: same flood, not replicated to B ({ctl['b_received_peer_attested']} reached B)",
                     ctl["ping"]))
    for name, s in rows:
        lines.append(f"| {name} | {s.get('n', 0)} | {s.get('failed', 0)} | {fmt(s.get('p50_ms'))} | "
                     f"{fmt(s.get('p95_ms'))} | {fmt(s.get('p99_ms'))} | {fmt(s.get('max_ms'))} |")
    verdict = "PASS" if res["pass"] else "FAIL"
    lines += ["", f"Flood/idle ping p95 ratio on B, one link per call: **{fmt(res['p95_ratio'])}x** "
                  f"(limit {RATIO_LIMIT:g}x): **{verdict}**."]
    if fb is not None:
        lines += [f"Batched: **{fmt(fb['p95_ratio'])}x**: **{'PASS' if fb['pass'] else 'FAIL'}**; "
                  f"**{fb['links_per_s_end_to_end']:.0f} links/s** end to end (target 1,000)."]
    if ctl is not None:
        lines += [f"Control (A and C as busy, B receives nothing) / idle p95 ratio: "
                  f"{fmt(ctl['p95_ratio_to_idle'])}x: the share of the rise that is host CPU contention, "
                  f"not B's own work."]
    return "\n".join(lines)


def write_result(res: dict[str, Any], name: str) -> Path:
    """``res`` with the machine it ran on, as BENCH_OUT/<name>.json (the bootstrap bench writes its own so)."""
    res["env"] = machine()
    out = BENCH_OUT / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    return out


def write_perf_md(body: str, section: str = SECTION) -> None:
    """``section`` of PERFORMANCE.md (a "## " heading) replaced in place by ``body``, appended the first time."""
    path = ROOT / "PERFORMANCE.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Performance\n"
    start = text.find(section)
    new = f"{section}\n\n{body}\n"
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + new
    else:
        nxt = text.find("\n## ", start + len(section))
        end = len(text) if nxt < 0 else nxt + 1
        text = text[:start] + new + ("\n" + text[end:] if nxt >= 0 else "")
    path.write_text(text, encoding="utf-8")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--links", type=int, default=None, help="memory_link calls on A (default 10000; --quick 1000)")
    p.add_argument("--quick", action="store_true", help=f"~{QUICK_LINKS} links, 3 s idle")
    p.add_argument("--memories", type=int, default=300)
    p.add_argument("--sessions", type=int, default=8, help="MCP client sessions to A")
    p.add_argument("--concurrency", type=int, default=32, help="memory_link calls in flight")
    p.add_argument("--no-load-family", dest="load_family", action="store_false",
                   help="call memory_link without loading the graph family first (each call then costs the "
                        "SDK client a tools/list too)")
    p.add_argument("--batch", type=int, default=100,
                   help="links per memory_link_many call in the batched flood after the single one (1 = no batched "
                        "flood)")
    p.add_argument("--batch-links", type=int, default=None, help="links in the batched flood (default --links)")
    p.add_argument("--ping-interval-ms", type=float, default=10.0)
    p.add_argument("--idle-s", type=float, default=None, help="idle ping phase (default 5; --quick 3)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="bound on the flood and on convergence")
    p.add_argument("--no-control", dest="control", action="store_false",
                   help="skip the control flood (same load on A and C, namespace not shared with B)")
    p.add_argument("--no-perf-md", action="store_true", help="do not write PERFORMANCE.md")
    p.add_argument("--keep-pings", type=Path, default=None, metavar="FILE",
                   help="write every ping (sent, round trip, written, frame crc32) and the phases' windows to FILE "
                        "(read by testbed.bench.probes.ping_path.split)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="do not pin CPUs (default: B and the pinger alone on one CPU, everything else on the "
                        "others, so B's ping latency shows B's own work rather than host contention)")
    p.add_argument("--pin-b-cpu", type=int, default=1, help="the CPU for B and the pinger (default 1)")
    p.add_argument("--send-window-bytes", type=int, default=None,
                   help="every node's federation.send_window_bytes (default: the node's, 64 KiB)")
    p.add_argument("--links-per-envelope", type=int, default=None,
                   help="every node's federation.links_per_envelope (default: the node's, 100)")
    p.add_argument("--background-nice", type=int, default=None, choices=range(20), metavar="0..19",
                   help="every node's federation.background_nice (default: the node's, 0)")
    args = p.parse_args(argv)
    if args.links is None:
        args.links = QUICK_LINKS if args.quick else 10_000
    if args.batch_links is None:
        args.batch_links = args.links
    if args.idle_s is None:
        args.idle_s = 3.0 if args.quick else 5.0
    if args.memories < 2 or args.links < 1:
        p.error("need --memories >= 2 and --links >= 1")
    if args.send_window_bytes is not None and args.send_window_bytes < MIN_SEND_WINDOW_BYTES:
        p.error(f"--send-window-bytes must be >= {MIN_SEND_WINDOW_BYTES} (a node refuses less)")
    return args


def federation_settings(args: argparse.Namespace) -> dict[str, int | None]:
    """The [federation] settings given on the command line (None: the node's default)."""
    return {"send_window_bytes": args.send_window_bytes, "links_per_envelope": args.links_per_envelope,
            "background_nice": args.background_nice}


def extra_config(args: argparse.Namespace) -> str:
    """Every node's [federation] settings from the flags, and the control namespace shared by A and C only."""
    return "".join(["[federation]\n",
                    *(f"{key} = {value}\n" for key, value in federation_settings(args).items() if value is not None),
                    f"[federation.namespaces.{CONTROL_NS}]\n",
                    f'peers = ["{agent_id_for(1)}", "{agent_id_for(3)}"]\n'])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = ".venv/bin/python -m testbed.bench.federation_bench" + "".join(f" {shlex.quote(x)}"
                                                                             for x in sys.argv[1:])
    pinned = None
    with tempfile.TemporaryDirectory(prefix="fedbench") as tmp:
        layout = build_layout(Path(tmp) / "mesh", 3, mcp_http=True, extra_config=extra_config(args))
        mesh = LocalMesh(layout)
        try:
            mesh.start(timeout_s=60)
            pids = {n: mesh.procs[i].pid for i, n in ((1, "A"), (2, "B"), (3, "C"))}
            pinned = pin_mesh(pids, args.pin_b_cpu) if args.pin else None
            res = asyncio.run(asyncio.wait_for(run(layout, args, Path(tmp), pids), 3 * args.timeout_s + 120))
        finally:
            mesh.stop_all()
    res["command"] = command
    res["federation_settings"] = federation_settings(args)
    res["cpu_pinning"] = pinned
    write_result(res, "federation")
    md = markdown(res, command)
    print(md)
    if not args.no_perf_md:
        write_perf_md(md)
    return 0 if res["pass"] and res.get("batched_flood", {"pass": True})["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
