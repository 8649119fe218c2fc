"""MCP tool-call round trips: memory_store and memory_recall over stdio and streamable HTTP at 10k memories.

Baselines measured in the same run: the direct in-process Service call, and the tool layer in-process
(schema check + dispatch, no transport). stdio is measured both ways ``ai-memory mcp`` runs: joined to
the running node over its local socket, and embedded (its own Service on the same database).

    .venv/bin/python -m testbed.bench.mcp_bench [--quick] [--memories N] [--calls N]

Prints a markdown table; writes bench/out/mcp.json. Target: recall p95 <= 10 ms end to end over stdio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from mesh import keys
from node.assemble import open_service
from node.config import from_dict
from node.mcp.backend import ServiceBackend
from node.mcp.server import start_http
from node.mcp.socket import start_local_socket
from node.service import Service
from testbed.bench.figures import pct
from testbed.paths import BENCH_OUT, ROOT

AGENT = "ai:bench@lab"
RECALL_P95_TARGET_MS = 10.0
CALL_TIMEOUT_S = 30.0
PREFILL_BATCH = 500


def words(rng: random.Random, n: int) -> list[str]:
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(4, 9))) for _ in range(n)]



def summary(samples_ns: list[int]) -> dict:
    ms = [x / 1e6 for x in samples_ns]
    return {"n": len(samples_ns), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95),
            "p99_ms": pct(ms, 99), "mean_ms": sum(samples_ns) / len(samples_ns) / 1e6}


async def measure(call: Callable[[str, dict], Awaitable[object]], calls: int, vocab: list[str],
                  rng: random.Random) -> dict[str, dict]:
    out = {}
    for tool in ("memory_store", "memory_recall"):
        for _ in range(min(20, calls)):  # warm-up: caches, first-call listing, JIT-free but page-cache warm
            await call(tool, make_args(tool, vocab, rng))
        samples = []
        for _ in range(calls):
            args = make_args(tool, vocab, rng)
            t0 = time.perf_counter_ns()
            await call(tool, args)
            samples.append(time.perf_counter_ns() - t0)
        out[tool] = summary(samples)
    return out


def make_args(tool: str, vocab: list[str], rng: random.Random) -> dict:
    if tool == "memory_store":
        return {"content": " ".join(rng.choices(vocab, k=24)), "tags": ["bench"]}
    return {"query": " ".join(rng.choices(vocab, k=rng.randint(1, 2))), "limit": 10}


def session_call(session: ClientSession) -> Callable[[str, dict], Awaitable[object]]:
    async def call(tool: str, args: dict) -> object:
        res = await session.call_tool(tool, args)
        if res.is_error:
            raise RuntimeError(res.content[0].text)
        return res.structured_content
    return call


async def direct_call(svc: Service) -> Callable[[str, dict], Awaitable[object]]:
    async def call(tool: str, args: dict) -> object:
        if tool == "memory_store":
            return await svc.memory_store(args["content"], tags=args["tags"])
        return await svc.memory_recall(args["query"], limit=args["limit"])
    return call


@contextlib.asynccontextmanager
async def stdio(toml: Path, home: Path):
    env = {"AI_MEMORY_HOME": str(home), "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "node.cli", "mcp", "--config", str(toml)],
                                   env=env, cwd=str(ROOT))
    errlog = await asyncio.to_thread(open, home / "mcp-stderr.log", "a")
    try:
        async with stdio_client(params, errlog=errlog) as (r, w):
            async with ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S) as s:
                await s.initialize()
                yield s
    finally:
        errlog.close()


@contextlib.asynccontextmanager
async def http(url: str):
    async with streamable_http_client(url) as (r, w):
        async with ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S) as s:
            await s.initialize()
            yield s


async def run(memories: int, calls: int) -> dict:
    rng = random.Random(7)
    vocab = words(rng, 3000)
    with tempfile.TemporaryDirectory(prefix="mcpb") as tmp:
        home = Path(tmp) / "h"
        home.mkdir()
        # The bench measures latency, not the per-agent budget: lift limits.requests_per_second.
        cfg = from_dict({"agent_id": AGENT, "home": str(home), "limits": {"requests_per_second": 1_000_000}},
                        env={})
        keys.generate_identity(cfg.keys_dir, AGENT)
        toml = home / "node.toml"
        toml.write_text(f'agent_id = "{AGENT}"\nhome = "{home}"\n[limits]\nrequests_per_second = 1000000\n',
                        encoding="utf-8")
        svc = await open_service(cfg, require_identity=True)
        try:
            t0 = time.perf_counter()
            for start in range(0, memories, PREFILL_BATCH):
                n = min(PREFILL_BATCH, memories - start)
                await asyncio.gather(*(svc.memory_store(" ".join(rng.choices(vocab, k=24)), tags=["prefill"])
                                       for _ in range(n)))
            prefill_s = time.perf_counter() - t0
            print(f"prefilled {memories} memories in {prefill_s:.1f} s", file=sys.stderr)

            results: dict[str, dict] = {}
            results["direct (in-process Service)"] = await measure(await direct_call(svc), calls, vocab, rng)
            results["tool layer (in-process ServiceBackend)"] = await measure(ServiceBackend(svc).call, calls,
                                                                              vocab, rng)

            sock = await start_local_socket(ServiceBackend(svc), cfg.socket_path)
            try:
                async with stdio(toml, home) as s:
                    caps = await session_call(s)("memory_capabilities", {})
                    assert caps["mcp"]["mode"] == "joined", caps["mcp"]
                    results["stdio, joined over local socket"] = await measure(session_call(s), calls, vocab, rng)
            finally:
                await sock.stop()

            async with stdio(toml, home) as s:
                caps = await session_call(s)("memory_capabilities", {})
                assert caps["mcp"]["mode"] == "embedded", caps["mcp"]
                results["stdio, embedded"] = await measure(session_call(s), calls, vocab, rng)

            handle = await start_http(ServiceBackend(svc), "127.0.0.1", 0)
            try:
                async with http(handle.url) as s:
                    results["streamable HTTP"] = await measure(session_call(s), calls, vocab, rng)
            finally:
                await handle.stop()
        finally:
            await svc.close()
    stdio_p95 = max(results[k]["memory_recall"]["p95_ms"] for k in results if k.startswith("stdio"))
    return {
        "memories": memories, "calls_per_measurement": calls, "prefill_s": prefill_s,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "target": {"recall_p95_ms_stdio": RECALL_P95_TARGET_MS, "worst_stdio_recall_p95_ms": stdio_p95,
                   "met": stdio_p95 <= RECALL_P95_TARGET_MS},
        "results": results,
    }


def table(report: dict) -> str:
    lines = [f"MCP tool-call round trip at {report['memories']} memories, "
             f"{report['calls_per_measurement']} calls each (ms)", "",
             "| path | tool | p50 | p95 | p99 |", "|---|---|---:|---:|---:|"]
    for path, tools in report["results"].items():
        for tool, s in tools.items():
            lines.append(f"| {path} | {tool} | {s['p50_ms']:.2f} | {s['p95_ms']:.2f} | {s['p99_ms']:.2f} |")
    t = report["target"]
    lines += ["", f"target: recall p95 <= {t['recall_p95_ms_stdio']} ms over stdio; worst stdio recall p95 "
                  f"{t['worst_stdio_recall_p95_ms']:.2f} ms -> {'MET' if t['met'] else 'MISSED'}"]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2k memories, 200 calls per measurement")
    p.add_argument("--memories", type=int, help="pre-filled memories (default 10000)")
    p.add_argument("--calls", type=int, help="timed calls per tool per path (default 1000)")
    p.add_argument("--out", type=Path, default=BENCH_OUT / "mcp.json")
    a = p.parse_args()
    memories = a.memories or (2_000 if a.quick else 10_000)
    calls = a.calls or (200 if a.quick else 1_000)
    report = asyncio.run(run(memories, calls))
    print(table(report))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {a.out}")
    return 0 if report["target"]["met"] else 3


if __name__ == "__main__":
    sys.exit(main())
