"""Recall on one FTS5 segment against the same database as filled, interleaved query by query.

    .venv/bin/python -m testbed.bench.recall_bench --keep DIR          # fills DIR once (100k memories)
    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.fts_merge_bench DIR [--pages N] [--queries N]

Copies DIR's database twice into a temp dir; one copy is merged by the storage writer's idle merging
(``fts_merge_pages`` N, default the node's), the other is left with the segments the fill left. Both are
then opened with merging off and the storage bench's recall queries (same seed, limit 10, the Service's
``DocFreqs``) run through ``Database.read`` on each in turn, the order alternating, so drift on the VM
spreads over both. Reports the segments and pages of each, the merge's steps and time, p50/p95/p99 of
each, and whether every query returned the same ids and scores. Writes bench/out/fts_merge.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from node.config import FTS_MERGE_PAGES
from node.node import GIL_SWITCH_INTERVAL_S
from storage import Database, memories
from storage.db import _SEGMENT_PAGES_SQL
from testbed.bench.storage_bench import Corpus, report_run, summarize
from testbed.paths import BENCH_OUT


def segments(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [int(n) for _, n in conn.execute(_SEGMENT_PAGES_SQL)]
    finally:
        conn.close()


def copy_db(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for suffix in ("", "-wal"):
        if (src.parent / (src.name + suffix)).exists():
            shutil.copy(src.parent / (src.name + suffix), dst / ("memory.db" + suffix))
    return dst / "memory.db"


async def merge(path: Path, pages: int, limit_s: float = 600.0) -> dict[str, Any]:
    """Open with idle merging and wait (bounded) until the writer has finished a full merge."""
    t0 = time.perf_counter()
    async with await Database.open(path, fts_merge_pages=pages) as db:
        for _ in range(int(limit_s / 0.02)):
            if db.merge_stats["merges"] >= 1 and not db.merge_stats["merging"]:
                break
            await asyncio.sleep(0.02)
        stats = dict(db.merge_stats)
    return stats | {"wall_s": round(time.perf_counter() - t0, 2)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = Corpus()
    queries = [corpus.query() for _ in range(args.queries)]  # drawn first, as the storage bench does
    src = args.keep / "home" / "data" / "memory.db"
    with tempfile.TemporaryDirectory(prefix="fts-merge-bench-") as d:
        filled, merged = copy_db(src, Path(d) / "filled"), copy_db(src, Path(d) / "merged")
        merge_stats = await merge(merged, args.pages)
        segs = {"as filled": segments(filled), "merged": segments(merged)}
        dbs = {"as filled": await Database.open(filled), "merged": await Database.open(merged)}
        try:
            freqs = {name: memories.DocFreqs() for name in dbs}
            for q in queries[:50]:  # warm the page caches, the readers and the doc freqs
                for name, db in dbs.items():
                    await db.read(memories.recall, q, 10, None, freqs[name])
            samples: dict[str, list[float]] = {name: [] for name in dbs}
            same = 0
            for i, q in enumerate(queries):
                order = list(dbs) if i % 2 == 0 else list(reversed(dbs))
                got = {}
                for name in order:
                    t = time.perf_counter()
                    hits = await dbs[name].read(memories.recall, q, 10, None, freqs[name])
                    samples[name].append(time.perf_counter() - t)
                    got[name] = [(m.id, s) for m, s in hits]
                same += got["as filled"] == got["merged"]
        finally:
            for db in dbs.values():
                await db.close()
    return {"bench": "fts_merge", "queries": len(queries), "pages_per_step": args.pages, "merge": merge_stats,
            "segments": {k: len(v) for k, v in segs.items()}, "pages": {k: sum(v) for k, v in segs.items()},
            "same_ids_and_scores": same, "modes": {k: summarize(v) for k, v in samples.items()},
            "sqlite": sqlite3.sqlite_version}


def markdown(r: dict[str, Any]) -> str:
    lines = [f"### FTS5 idle merge ({r['queries']} queries, {r['pages_per_step']} pages a step, "
             f"SQLite {r['sqlite']})", "", f"merge: {r['merge']}", "",
             "| index | segments | pages | p50 ms | p95 ms | p99 ms |", "|---|---:|---:|---:|---:|---:|"]
    for name, s in r["modes"].items():
        lines.append(f"| {name} | {r['segments'][name]} | {r['pages'][name]} | {s['p50_ms']} | {s['p95_ms']} | "
                     f"{s['p99_ms']} |")
    lines += ["", f"same ids and scores: {r['same_ids_and_scores']} of {r['queries']} queries"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("keep", type=Path, help="a directory testbed.bench.recall_bench --keep filled")
    ap.add_argument("--pages", type=int, default=FTS_MERGE_PAGES, help="merge pages per step")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "fts_merge.json")
    ap.add_argument("--switch-interval", type=float, default=GIL_SWITCH_INTERVAL_S)
    return report_run(ap.parse_args(argv), run, markdown)


if __name__ == "__main__":
    main()
