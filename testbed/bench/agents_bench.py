"""What acting as an agent costs: memory_store and memory_link through the MCP tool layer in-process
(``ServiceBackend.call``: the agent's admission, its delegation read, its rate budget, its own key's signature),
as the node (baseline) and as an agent, in one run.

One Service and database; the node and the agent take turns in blocks (round robin) so the machine's drift
spreads over both.

    .venv/bin/python -m testbed.bench.agents_bench [--quick] [--calls N]

Prints a markdown table; writes bench/out/agents.json. No target (issue 32 names none): the figures say what the
agent's path adds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mesh import keys
from node.assemble import open_service
from node.config import from_dict
from node.mcp.backend import ServiceBackend
from node.node import GIL_SWITCH_INTERVAL_S
from testbed.bench.figures import ms_stats as stats
from testbed.paths import BENCH_OUT

NODE = "ai:bench@lab"
AGENT = "ai:bench-agent@lab"
ROUNDS = 40


async def local_calls(backend: ServiceBackend, calls: int) -> dict[str, dict[str, list[float]]]:
    """memory_store, then memory_link between the two last stored, as the node (None) and as AGENT in turns."""
    times: dict[str, dict[str, list[float]]] = {t: {"node": [], "agent": []} for t in ("memory_store", "memory_link")}
    last: dict[str, list[str]] = {"node": [], "agent": []}
    per_round = max(1, calls // ROUNDS)
    for who, agent in (("node", None), ("agent", AGENT)):  # warm-up: the agent's key and delegation made here
        for i in range(10):
            last[who].append((await backend.call("memory_store", {"content": f"warm {i}"}, agent))["id"])
    for r in range(ROUNDS):
        for who, agent in (("node", None), ("agent", AGENT)):
            for i in range(per_round):
                t0 = time.perf_counter()
                made = await backend.call("memory_store", {"content": f"bench {r} {i}"}, agent)
                times["memory_store"][who].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await backend.call("memory_link", {"src_id": last[who][-1], "dst_id": made["id"],
                                                   "relation": "follows"}, agent)
                times["memory_link"][who].append((time.perf_counter() - t0) * 1000)
                last[who].append(made["id"])
    return times


async def run(calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="agents-bench-") as tmp:
        home = Path(tmp) / "home"
        cfg = from_dict({"agent_id": NODE, "home": str(home), "storage": {"synchronous": "normal"},
                         "limits": {"requests_per_second": 1_000_000}}, env={})
        keys.generate_identity(cfg.keys_dir, NODE)
        svc = await open_service(cfg, require_identity=True)
        try:
            times = await local_calls(ServiceBackend(svc), calls)
        finally:
            await svc.close()
    out: dict[str, Any] = {"calls_per_side": calls, "rounds": ROUNDS, "python": sys.version.split()[0],
                           "platform": platform.platform(), "cpus": os.cpu_count(), "tools": {}}
    for tool, sides in times.items():
        node, agent = stats(sides["node"]), stats(sides["agent"])
        out["tools"][tool] = {"node": node, "agent": agent,
                              "ratio_p50": agent["p50_ms"] / node["p50_ms"],
                              "ratio_p95": agent["p95_ms"] / node["p95_ms"],
                              "ratio_p99": agent["p99_ms"] / node["p99_ms"]}
    return out


def table(out: dict[str, Any]) -> str:
    lines = ["| tool | as | p50 ms | p95 ms | p99 ms |", "|---|---|---:|---:|---:|"]
    for tool, r in out["tools"].items():
        for who in ("node", "agent"):
            s = r[who]
            label = "the node (baseline)" if who == "node" else "an agent"
            lines.append(f"| {tool} | {label} | {s['p50_ms']:.3f} | {s['p95_ms']:.3f} | {s['p99_ms']:.3f} |")
        lines.append(f"| {tool} | agent / node | {r['ratio_p50']:.2f}× | {r['ratio_p95']:.2f}× | "
                     f"{r['ratio_p99']:.2f}× |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="400 calls a side instead of 4,000")
    p.add_argument("--calls", type=int, help="calls per side (node, agent) per tool")
    args = p.parse_args()
    calls = args.calls or (400 if args.quick else 4000)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    out = asyncio.run(run(calls))
    BENCH_OUT.mkdir(parents=True, exist_ok=True)
    (BENCH_OUT / "agents.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(table(out))


if __name__ == "__main__":
    main()
