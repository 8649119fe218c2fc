"""Where a recall's time goes, step by step, on a home kept by ``testbed.bench.recall_bench --keep DIR``.

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.probes.recall_steps DIR [--queries 1000]

Opens the kept home as the recall bench does (a key, the 1,000-rule gate, the daemon post_recall hook),
then times, taking turns query by query over the bench's queries (the order rotating):

- the hand-off alone: ``Database.read`` of a no-op;
- ``memories.recall`` on a reader connection opened as ``Database`` opens them, in a read transaction,
  on the event loop's thread (no hand-off);
- ``memories.recall`` through ``Database.read``;
- the post_recall hook alone (the daemon's round trip, no results);
- ``Service.memory_recall`` with everything on.

Prints p50 / p95 / p99 / mean per step.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from node.assemble import open_service
from node.config import from_dict
from node.hooks import HookEvent, NoHooks
from node.hooks.pipeline import HookPipeline
from node.node import GIL_SWITCH_INTERVAL_S
from storage import memories
from storage.db import _open_reader
from testbed.bench import recall_bench as rb
from testbed.bench.everything_on import hooks_toml
from testbed.bench.storage_bench import Corpus, summarize
from testbed.bench.variants import variant


async def run(base: Path, n_queries: int) -> dict[str, dict[str, float]]:
    corpus = Corpus()
    queries = [corpus.query() for _ in range(n_queries)]  # the recall bench's queries
    hooks_toml(base / "hooks.toml", "bench-daemon", "daemon", [sys.executable, str(base / "daemon.py")])
    cfg = from_dict({"agent_id": rb.AGENT, "home": str(base / "home"), "storage": {"synchronous": "normal"},
                     "limits": {"max_db_bytes": 4 * 1024 ** 3},
                     "permissions": {"config": "rules.toml", "reload_check_s": 3600.0}}, env={})
    svc = await open_service(cfg, require_identity=True, hooks=NoHooks())
    daemon = HookPipeline(base / "hooks.toml", cfg.hooks)
    conn = _open_reader(svc.db.path)
    try:
        await rb.settle_writer(svc.db, 1.0)
        gate, df = svc.gate, memories.DocFreqs()

        def in_txn(q: str) -> Any:
            conn.execute("BEGIN")
            try:
                return memories.recall(conn, q, 10, None, df)
            finally:
                conn.execute("ROLLBACK")

        async def inline(q: str) -> Any:
            return in_txn(q)

        on = variant(svc, hooks=daemon, gate=gate)

        async def everything_on(q: str) -> Any:
            return await on.memory_recall(q, limit=10)

        steps: dict[str, Callable[[str], Awaitable[Any]]] = {
            "hand-off alone (no-op Database.read)": lambda q: svc.db.read(lambda c: None),
            "recall, reader connection, no hand-off": inline,
            "recall, Database.read": lambda q: svc.db.read(memories.recall, q, 10, None, svc.doc_freqs),
            "post_recall hook alone": lambda q: daemon.fire(HookEvent.POST_RECALL, {
                "query": q, "limit": 10, "namespace": None, "results": []}),
            "Service, everything on": everything_on,
        }
        names = list(steps)
        for q in queries[:50]:  # warm
            for name in names:
                await steps[name](q)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i, q in enumerate(queries):
            for k in range(len(names)):
                name = names[(i + k) % len(names)]
                t0 = time.perf_counter()
                await steps[name](q)
                samples[name].append(time.perf_counter() - t0)
    finally:
        conn.close()
        await daemon.close()
        await svc.close()
    return {name: summarize(s) for name, s in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("keep", type=Path, help="a directory filled by testbed.bench.recall_bench --keep")
    ap.add_argument("--queries", type=int, default=1000)
    args = ap.parse_args()
    if not (args.keep / "filled.json").exists():
        raise SystemExit(f"{args.keep} was not filled by testbed.bench.recall_bench --keep")
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    stats = asyncio.run(run(args.keep, args.queries))
    print("| step | p50 ms | p95 ms | p99 ms | mean ms |\n|---|---:|---:|---:|---:|")
    for name, s in stats.items():
        print(f"| {name} | {s['p50_ms']} | {s['p95_ms']} | {s['p99_ms']} | {s['mean_ms']} |")


if __name__ == "__main__":
    main()
