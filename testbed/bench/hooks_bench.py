"""Hook overhead on recall: no hook, a daemon post_recall hook, an exec post_recall hook, in one run.

The same Service and database serve every mode; modes take turns in blocks (round robin) so that the
machine's drift spreads over all of them. The exec modes spawn a process per recall: a Python hook
(what most operators write) and a /bin/sh one (the spawn itself, without an interpreter's start-up).
Also measured: the bare runner round trip of each mode (no recall around it).

    .venv/bin/python -m testbed.bench.hooks_bench [--quick] [--memories N] [--calls N]

Prints a markdown table; writes bench/out/hooks.json. Target: daemon overhead <= 1 ms at p95
(daemon recall p95 minus no-hook recall p95).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from node.assemble import open_service
from node.config import from_dict
from node.hooks import HookEvent, NoHooks
from node.hooks.pipeline import HookPipeline
from node.node import GIL_SWITCH_INTERVAL_S
from node.service import Service
from testbed.bench.everything_on import DAEMON, hooks_toml  # shared with testbed bench --everything-on
from testbed.bench.figures import pct
from testbed.bench.variants import variant
from testbed.paths import BENCH_OUT

AGENT = "ai:bench@lab"
DAEMON_P95_OVERHEAD_TARGET_MS = 1.0
PREFILL_BATCH = 500
ROUNDS = 50

EXEC_PY = r'''
import json, sys
json.load(sys.stdin)
print(json.dumps({"decision": "allow"}))
'''
EXEC_SH = "#!/bin/sh\ncat >/dev/null\necho '{\"decision\": \"allow\"}'\n"


def words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9))) for _ in range(n)]



def summary(samples_ns: list[int]) -> dict[str, float]:
    ms = [x / 1e6 for x in samples_ns]
    return {"n": len(samples_ns), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95),
            "p99_ms": pct(ms, 99), "mean_ms": sum(samples_ns) / len(samples_ns) / 1e6}


async def run(memories: int, calls: int, exec_calls: int) -> dict[str, Any]:
    rng = random.Random(11)
    vocab = words(rng, 3000)
    with tempfile.TemporaryDirectory(prefix="hookb") as tmp:
        base = Path(tmp)
        (base / "daemon.py").write_text(DAEMON)
        (base / "exec.py").write_text(EXEC_PY)
        (base / "exec.sh").write_text(EXEC_SH)
        (base / "exec.sh").chmod(0o755)
        modes: dict[str, tuple[str, list[str]]] = {
            "daemon post_recall (python)": ("daemon", [sys.executable, str(base / "daemon.py")]),
            "exec post_recall (python)": ("exec", [sys.executable, str(base / "exec.py")]),
            "exec post_recall (/bin/sh)": ("exec", [str(base / "exec.sh")]),
        }
        cfg = from_dict({"agent_id": AGENT, "home": str(base / "h")}, env={})
        pipelines: dict[str, Any] = {"no hook": NoHooks()}
        for i, (label, (mode, command)) in enumerate(modes.items()):
            path = base / f"hooks-{i}.toml"
            hooks_toml(path, f"bench-{i}", mode, command)
            pipelines[label] = HookPipeline(path, cfg.hooks)
        svc = await open_service(cfg, hooks=NoHooks())
        try:
            t0 = time.perf_counter()
            for start in range(0, memories, PREFILL_BATCH):
                n = min(PREFILL_BATCH, memories - start)
                await asyncio.gather(*(svc.memory_store(" ".join(rng.choices(vocab, k=24))) for _ in range(n)))
            print(f"prefilled {memories} memories in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

            recall = await interleaved(svc, pipelines, calls, exec_calls, rng, vocab)
            hits = await svc.memory_recall(" ".join(rng.choices(vocab, k=1)), limit=10)
            bare = await fire_only(pipelines, {"query": "q", "limit": 10, "namespace": None, "results": hits},
                                   calls, exec_calls)
            states = {label: p.snapshot()["hooks"][0]["counts"] for label, p in pipelines.items()
                      if label != "no hook"}
        finally:
            for pipeline in pipelines.values():
                await pipeline.close()
            await svc.close()
    overhead = recall["daemon post_recall (python)"]["p95_ms"] - recall["no hook"]["p95_ms"]
    return {
        "memories": memories, "calls": calls, "exec_calls": exec_calls, "rounds": ROUNDS,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "recall": recall, "fire_only": bare, "hook_counts": states,
        "target": {"daemon_p95_overhead_ms": DAEMON_P95_OVERHEAD_TARGET_MS, "measured_ms": overhead,
                   "met": overhead <= DAEMON_P95_OVERHEAD_TARGET_MS},
    }


async def interleaved(svc: Service, pipelines: dict[str, Any], calls: int, exec_calls: int,
                      rng: random.Random, vocab: list[str]) -> dict[str, dict[str, float]]:
    """Recall latency per mode, the modes taking turns in ROUNDS blocks."""
    samples: dict[str, list[int]] = {label: [] for label in pipelines}
    services = {label: variant(svc, hooks=pipeline, gate=svc.gate) for label, pipeline in pipelines.items()}
    for each in services.values():  # warm-up: daemons started, page cache warm
        for _ in range(10):
            await each.memory_recall(" ".join(rng.choices(vocab, k=2)), limit=10)
    for _ in range(ROUNDS):
        for label, each in services.items():
            for _ in range((exec_calls if label.startswith("exec") else calls) // ROUNDS):
                query = " ".join(rng.choices(vocab, k=rng.randint(1, 2)))
                t = time.perf_counter_ns()
                await each.memory_recall(query, limit=10)
                samples[label].append(time.perf_counter_ns() - t)
    return {label: summary(s) for label, s in samples.items()}


async def fire_only(pipelines: dict[str, Any], payload: dict[str, Any], calls: int,
                    exec_calls: int) -> dict[str, dict[str, float]]:
    """The hook round trip alone (pipeline.fire with a recall-sized payload), per hooked mode."""
    out = {}
    for label, pipeline in pipelines.items():
        if label == "no hook":
            continue
        s = []
        for _ in range(exec_calls if label.startswith("exec") else calls):
            t = time.perf_counter_ns()
            await pipeline.fire(HookEvent.POST_RECALL, payload)
            s.append(time.perf_counter_ns() - t)
        out[label] = summary(s)
    return out


def table(report: dict[str, Any]) -> str:
    base = report["recall"]["no hook"]
    lines = [f"recall (limit 10) at {report['memories']} memories; {report['calls']} calls per mode "
             f"({report['exec_calls']} for exec), {report['rounds']} interleaved rounds (ms)", "",
             "| mode | p50 | p95 | p99 | p95 overhead | fire alone p50 | fire alone p95 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, s in report["recall"].items():
        f = report["fire_only"].get(label)
        over = "" if label == "no hook" else f"{s['p95_ms'] - base['p95_ms']:+.2f}"
        fire = f"| {f['p50_ms']:.2f} | {f['p95_ms']:.2f} |" if f else "| | |"
        lines.append(f"| {label} | {s['p50_ms']:.2f} | {s['p95_ms']:.2f} | {s['p99_ms']:.2f} | {over} {fire}")
    t = report["target"]
    lines += ["", f"target: daemon overhead <= {t['daemon_p95_overhead_ms']} ms at p95; measured "
                  f"{t['measured_ms']:.3f} ms -> {'MET' if t['met'] else 'MISSED'}"]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2k memories, 500 calls (100 exec) per mode")
    p.add_argument("--memories", type=int, help="pre-filled memories (default 10000)")
    p.add_argument("--calls", type=int, help="timed recalls per no-hook/daemon mode (default 2000)")
    p.add_argument("--exec-calls", type=int, help="timed recalls per exec mode (default 300)")
    p.add_argument("--out", type=Path, default=BENCH_OUT / "hooks.json")
    a = p.parse_args()
    memories = a.memories or (2_000 if a.quick else 10_000)
    calls = a.calls or (500 if a.quick else 2_000)
    exec_calls = a.exec_calls or (100 if a.quick else 300)
    # As the node runs (node.node.run_serve): a 0.5 ms GIL switch interval and uvloop when installed.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        import uvloop
        report = uvloop.run(run(memories, calls, exec_calls))
    except ImportError:
        report = asyncio.run(run(memories, calls, exec_calls))
    print(table(report))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {a.out}")
    return 0 if report["target"]["met"] else 3


if __name__ == "__main__":
    sys.exit(main())
