"""Permission gate cost on memory_store: no rules vs 1,000 rules (enforce), in one run.

One Service and database; the two gates take turns in blocks (round robin) so the machine's drift
spreads over both. The 1,000 rules name 200 agents over 1,000 namespaces four levels deep, with rules on
every ancestor of the namespace written to, so a decision walks a real chain (deny first, inheritance,
an ``inherit = false`` barrier). Also measured: ``Gate.admit`` alone (no store around it).

    .venv/bin/python -m testbed.bench.permissions_bench [--quick] [--calls N]

Prints a markdown table; writes bench/out/permissions.json. Target: <= 0.2 ms added at p95.
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
from node.node import GIL_SWITCH_INTERVAL_S
from node.permissions.gate import Gate
from node.permissions.rules import Operation, Request, decide_uncached
from testbed.bench.everything_on import BENCH_AGENT as AGENT
from testbed.bench.everything_on import NAMESPACE, rules_toml  # shared with testbed bench --everything-on
from testbed.bench.figures import ms_stats as stats
from testbed.bench.variants import variant
from testbed.paths import BENCH_OUT

TARGET_P95_MS = 0.2
ROUNDS = 40


async def run(calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="perm-bench-") as tmp:
        home = Path(tmp) / "home"
        raw = {"agent_id": AGENT, "home": str(home), "storage": {"synchronous": "normal"},
               "permissions": {"reload_check_s": 3600.0}}
        cfg = from_dict(raw, env={})
        keys.generate_identity(cfg.keys_dir, AGENT)
        (home / "rules-1000.toml").write_text(rules_toml(1000), encoding="utf-8")
        cfg_1000 = from_dict({**raw, "permissions": {**raw["permissions"], "config": "rules-1000.toml"}}, env={})
        svc = await open_service(cfg, require_identity=True)
        try:
            gates = {"no rules": svc.gate, "1000 rules": await Gate.open(cfg_1000, svc.db)}
            assert gates["no rules"] is not None and len(gates["1000 rules"].index) == 1000
            services = {name: variant(svc, hooks=svc.hooks, gate=gate) for name, gate in gates.items()}
            times: dict[str, list[float]] = {name: [] for name in gates}
            admit: dict[str, list[float]] = {name: [] for name in gates}
            per_round = max(1, calls // ROUNDS)
            for each in services.values():  # warm-up
                for _ in range(20):
                    await each.memory_store("warm up", namespace=NAMESPACE)
            for _ in range(ROUNDS):
                for name, gate in gates.items():
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        await services[name].memory_store("bench memory text", namespace=NAMESPACE)
                        times[name].append((time.perf_counter() - t0) * 1000)
                        t0 = time.perf_counter()
                        await gate.admit(AGENT, NAMESPACE, Operation.STORE)
                        admit[name].append((time.perf_counter() - t0) * 1000)
            # A decision not yet cached: the rule walk itself (first call per agent, namespace, operation).
            index = gates["1000 rules"].index
            cold = []
            for i in range(len(times["no rules"])):
                req = Request(f"ai:agent-{i % 200}@lab", f"{NAMESPACE}/n{i}", Operation.STORE)
                t0 = time.perf_counter()
                decide_uncached(index, req)
                cold.append((time.perf_counter() - t0) * 1000)
        finally:
            await svc.close()
    out: dict[str, Any] = {"store": {k: stats(v) for k, v in times.items()},
                           "admit": {k: stats(v) for k, v in admit.items()}, "uncached_decide": stats(cold)}
    base, ruled = out["store"]["no rules"], out["store"]["1000 rules"]
    out["added_p95_ms"] = ruled["p95_ms"] - base["p95_ms"]
    out["ratio_p95"] = ruled["p95_ms"] / base["p95_ms"]
    out["admit_added_p95_ms"] = out["admit"]["1000 rules"]["p95_ms"] - out["admit"]["no rules"]["p95_ms"]
    out["target_p95_ms"] = TARGET_P95_MS
    out["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                      "calls_per_mode": len(times["no rules"])}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="400 calls per mode instead of 4,000")
    ap.add_argument("--calls", type=int, help="memory_store calls per mode")
    args = ap.parse_args()
    calls = args.calls or (400 if args.quick else 4000)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    out = asyncio.run(run(calls))
    print("| memory_store | p50 ms | p95 ms | p99 ms |\n|---|---:|---:|---:|")
    for name, s in out["store"].items():
        print(f"| {name} | {s['p50_ms']:.3f} | {s['p95_ms']:.3f} | {s['p99_ms']:.3f} |")
    print(f"\nadded at p95: {out['added_p95_ms']:+.3f} ms (ratio {out['ratio_p95']:.3f}); target <= {TARGET_P95_MS} ms")
    for name, s in out["admit"].items():
        print(f"Gate.admit alone, {name}: p50 {s['p50_ms'] * 1000:.1f} us, p95 {s['p95_ms'] * 1000:.1f} us, "
              f"p99 {s['p99_ms'] * 1000:.1f} us")
    c = out["uncached_decide"]
    print(f"uncached rule walk, 1000 rules: p50 {c['p50_ms'] * 1000:.1f} us, p95 {c['p95_ms'] * 1000:.1f} us, "
          f"p99 {c['p99_ms'] * 1000:.1f} us")
    BENCH_OUT.mkdir(parents=True, exist_ok=True)
    (BENCH_OUT / "permissions.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
