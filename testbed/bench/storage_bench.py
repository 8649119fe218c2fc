"""Storage benchmark: group commit vs commit-per-row, and FTS recall latency at 10k and 100k memories.

    .venv/bin/python -m testbed.bench.storage_bench [--quick] [--out bench/out/storage.json] [--fts-merge-pages N]

Writes go through ``Database.write`` (group commit) or ``Database.write_per_commit`` (one transaction per
row) from N concurrent writers, each on a fresh database file in a temp dir. Recall runs 1-3 word
queries drawn from the same Zipf-ish vocabulary as the corpus. Prints a markdown table, writes JSON.

The write path is a ``Target`` (an async ``store(row)``): storage directly (group commit, commit per row)
and the node service's ``memory_store`` (validation, UUID, change log, on group commit), same rows. Every
database merges its FTS5 segments when the writer is idle, as a node does (``--fts-merge-pages``, 0 = off);
after each recall fill the bench settles (1 s, then until that merge is done) before the queries.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from node import config as node_config
from node.assemble import open_service
from node.config import from_dict
from node.node import GIL_SWITCH_INTERVAL_S
from storage import Database, memories
from storage.memories import MemoryRow
from testbed.paths import BENCH_OUT

SEED = 20240611


@dataclass(frozen=True)
class Sizes:
    write_rows: int
    writers: int
    recall_sizes: tuple[int, ...]
    queries: int


FULL = Sizes(write_rows=10_000, writers=50, recall_sizes=(10_000, 100_000), queries=1_000)
QUICK = Sizes(write_rows=2_000, writers=50, recall_sizes=(2_000, 10_000), queries=200)


# ---- synthetic corpus ------------------------------------------------------------------------

class Corpus:
    """A fixed-seed vocabulary of a few thousand pseudo-words drawn with Zipf-like (1/rank^s) weights."""

    def __init__(self, seed: int = SEED, vocab_size: int = 4_000, s: float = 1.05) -> None:
        self.rng = random.Random(seed)
        syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["an", "er", "is", "on", "ul"]
        words: set[str] = set()
        while len(words) < vocab_size:
            words.add("".join(self.rng.choice(syllables) for _ in range(self.rng.randint(1, 4))))
        self.vocab = sorted(words)  # sorted first: set order varies with PYTHONHASHSEED
        self.rng.shuffle(self.vocab)
        weights = [1.0 / (rank + 1) ** s for rank in range(vocab_size)]
        self.cum = list(itertools.accumulate(weights))

    def words(self, k: int) -> list[str]:
        return self.rng.choices(self.vocab, cum_weights=self.cum, k=k)

    def memory(self, now_ms: int, origin: str = "ai:bench@local") -> MemoryRow:
        r = self.rng
        return MemoryRow(id=str(uuid.UUID(int=r.getrandbits(128), version=4)),
                         namespace=r.choice(("work", "home", "lab")),
                         title=" ".join(self.words(r.randint(3, 6))), content=" ".join(self.words(r.randint(15, 50))),
                         tags=tuple(self.words(r.randint(0, 3))), priority=r.randint(1, 9), origin=origin,
                         created_at=now_ms, updated_at=now_ms)

    def query(self) -> str:
        return " ".join(self.words(self.rng.randint(1, 3)))


# ---- write targets ---------------------------------------------------------------------------

class Target(Protocol):
    name: str

    async def store(self, row: MemoryRow) -> None: ...


class GroupCommitTarget:
    name = "group commit (db.write)"

    def __init__(self, db: Database) -> None:
        self.db = db

    async def store(self, row: MemoryRow) -> None:
        await self.db.write(memories.insert, row)


class PerCommitTarget:
    name = "commit per row (db.write_per_commit)"

    def __init__(self, db: Database) -> None:
        self.db = db

    async def store(self, row: MemoryRow) -> None:
        await self.db.write_per_commit(memories.insert, row)


class ServiceTarget:
    name = "group commit through Service.memory_store"

    def __init__(self, svc) -> None:
        self.svc = svc

    async def store(self, row: MemoryRow) -> None:
        await self.svc.memory_store(row.content, title=row.title, namespace=row.namespace, tags=row.tags)


async def run_writers(target: Target, rows: list[MemoryRow], writers: int) -> float:
    """Store ``rows`` from ``writers`` concurrent tasks; returns elapsed seconds."""
    chunks = [rows[i::writers] for i in range(writers)]

    async def writer(chunk: list[MemoryRow]) -> None:
        for row in chunk:
            await target.store(row)

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for chunk in chunks:
            tg.create_task(writer(chunk))
    return time.perf_counter() - t0


def _bulk_insert(conn: sqlite3.Connection, rows: list[MemoryRow]) -> None:
    for row in rows:
        memories.insert(conn, row)


async def fill(db: Database, corpus: Corpus, n: int, now_ms: int) -> None:
    """Top the database up to ``n`` memories quickly (500 rows per job); setup, not measured."""
    have = await db.read(memories.count)
    while have < n:
        k = min(500, n - have)
        await db.write(_bulk_insert, [corpus.memory(now_ms + have + i) for i in range(k)])
        have += k


# ---- measurements ----------------------------------------------------------------------------

def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]


def summarize(samples_s: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in samples_s]
    return {"p50_ms": round(pct(ms, 50), 3), "p95_ms": round(pct(ms, 95), 3), "p99_ms": round(pct(ms, 99), 3),
            "mean_ms": round(statistics.fmean(ms), 3), "max_ms": round(max(ms), 3)}


def merge_stats(db: Database) -> dict | None:
    """The writer's idle FTS5 merge counters (None on code without idle merging)."""
    stats = getattr(db, "merge_stats", None)
    return dict(stats) if stats is not None else None


async def settle(db: Database, min_s: float = 1.0, max_s: float = 300.0) -> float:
    """Wait ``min_s``, then while the writer's idle FTS5 merge runs (bounded): recall then measures the index
    as the node leaves it, not the merge beside it. Code without idle merging waits ``min_s``. Returns s."""
    t0 = time.perf_counter()
    await asyncio.sleep(min_s)
    for _ in range(int(max_s / 0.05)):
        if not (merge_stats(db) or {}).get("merging"):
            break
        await asyncio.sleep(0.05)
    return round(time.perf_counter() - t0, 2)


async def bench_writes(tmp: Path, corpus: Corpus, sizes: Sizes, fts_merge_pages: int) -> tuple[dict, Database]:
    now = int(time.time() * 1000)
    rows = [corpus.memory(now + i) for i in range(sizes.write_rows)]
    result = {}
    # The node's idle FTS5 merging (storage.fts_merge_pages); 0 leaves the argument out, for older code.
    opts = {"fts_merge_pages": fts_merge_pages} if fts_merge_pages else {}
    per_db = await Database.open(tmp / "per_commit.db", **opts)
    try:
        secs = await run_writers(PerCommitTarget(per_db), rows, sizes.writers)
        result["per_commit"] = {"rows": len(rows), "seconds": round(secs, 3), "inserts_per_s": round(len(rows) / secs),
                                "commits": per_db.commit_stats[0], "fts_merge": merge_stats(per_db)}
    finally:
        await per_db.close()
    group_db = await Database.open(tmp / "group_commit.db", **opts)
    secs = await run_writers(GroupCommitTarget(group_db), rows, sizes.writers)
    commits, jobs = group_db.commit_stats
    result["group_commit"] = {"rows": len(rows), "seconds": round(secs, 3), "inserts_per_s": round(len(rows) / secs),
                              "commits": commits, "mean_batch": round(jobs / max(commits, 1), 1),
                              "fts_merge": merge_stats(group_db)}
    result["ratio"] = round(result["group_commit"]["inserts_per_s"] / result["per_commit"]["inserts_per_s"], 2)
    svc = await open_service(from_dict({"agent_id": "ai:bench@local", "home": str(tmp / "svc")}, env={}))
    try:
        secs = await run_writers(ServiceTarget(svc), rows, sizes.writers)
        commits, jobs = svc.db.commit_stats
        result["service"] = {"rows": len(rows), "seconds": round(secs, 3), "inserts_per_s": round(len(rows) / secs),
                             "commits": commits, "mean_batch": round(jobs / max(commits, 1), 1),
                             "fts_merge": merge_stats(svc.db)}
    finally:
        await svc.close()
    result["writers"] = sizes.writers
    return result, group_db


async def bench_recall(db: Database, corpus: Corpus, queries: list[str], limit: int = 10) -> dict:
    doc_freqs = memories.DocFreqs()  # as the Service keeps one per database
    for q in queries[:50]:  # warm the page cache, the reader connections and doc_freqs
        await db.read(memories.recall, q, limit, None, doc_freqs)
    through_read, hits = [], 0
    for q in queries:
        t0 = time.perf_counter()
        res = await db.read(memories.recall, q, limit, None, doc_freqs)
        through_read.append(time.perf_counter() - t0)
        hits += bool(res)
    # The same queries on a plain connection in this thread: the SQL cost without the thread hop.
    conn = sqlite3.connect(f"{db.path.resolve().as_uri()}?mode=ro", uri=True)
    direct = []
    for q in queries:
        t0 = time.perf_counter()
        memories.recall(conn, q, limit, None, doc_freqs)
        direct.append(time.perf_counter() - t0)
    conn.close()
    return {"memories": await db.read(memories.count), "queries": len(queries), "limit": limit,
            "queries_with_hits": hits, "db_read": summarize(through_read), "direct_sql": summarize(direct)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a fast smoke run")
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "storage.json")
    ap.add_argument("--fts-merge-pages", type=int, default=getattr(node_config, "FTS_MERGE_PAGES", 0),
                    help="the databases' idle FTS5 merge pages per step (default: the node's; 0 = off)")
    ap.add_argument("--switch-interval", type=float, default=GIL_SWITCH_INTERVAL_S,
                    help=f"GIL switch interval in seconds (default {GIL_SWITCH_INTERVAL_S}, as a running node sets; "
                         "Python's own default is 0.005)")
    args = ap.parse_args(argv)
    return report_run(args, run, markdown)


def report_run(args: argparse.Namespace, run: Callable[[argparse.Namespace], Awaitable[dict]],
               markdown: Callable[[dict], str]) -> dict:
    """A bench's main after parsing: the node's GIL switch interval, ``run``, its JSON to ``args.out``, its
    table printed."""
    sys.setswitchinterval(args.switch_interval)
    report = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(markdown(report))
    print(f"\nJSON: {args.out}")
    return report


async def run(args: argparse.Namespace) -> dict:
    """The write and recall measurements at the sizes ``args`` asks for; the report as a dict."""
    sizes = QUICK if args.quick else FULL
    corpus = Corpus()
    queries = [corpus.query() for _ in range(sizes.queries)]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="storage-bench-") as d:
        tmp = Path(d)
        writes, db = await bench_writes(tmp, corpus, sizes, args.fts_merge_pages)
        recall = []
        try:
            now = int(time.time() * 1000)
            for n in sizes.recall_sizes:
                await fill(db, corpus, n, now)
                settled = await settle(db)
                recall.append(await bench_recall(db, corpus, queries)
                              | {"settle_s": settled, "fts_merge": merge_stats(db)})
        finally:
            await db.close()
    return {"bench": "storage", "quick": args.quick, "switch_interval_s": args.switch_interval,
            "sizes": asdict(sizes), "writes": writes, "recall": recall,
            "sqlite": sqlite3.sqlite_version, "python": platform.python_version(), "machine": platform.machine(),
            "total_seconds": round(time.perf_counter() - t_start, 1)}


def markdown(r: dict) -> str:
    w = r["writes"]
    lines = [f"### storage bench ({'quick' if r['quick'] else 'full'}, SQLite {r['sqlite']}, GIL switch interval "
             f"{r['switch_interval_s']} s, {r['total_seconds']} s)", "",
             f"| writes ({w['writers']} concurrent writers) | rows | inserts/s | commits |",
             "|---|---:|---:|---:|",
             f"| commit per row | {w['per_commit']['rows']} | {w['per_commit']['inserts_per_s']} | "
             f"{w['per_commit']['commits']} |",
             f"| group commit (mean batch {w['group_commit']['mean_batch']}) | {w['group_commit']['rows']} | "
             f"{w['group_commit']['inserts_per_s']} | {w['group_commit']['commits']} |",
             f"| **ratio** group / per-row | | **{w['ratio']}x** | |",
             f"| Service.memory_store on group commit (mean batch {w['service']['mean_batch']}) | "
             f"{w['service']['rows']} | {w['service']['inserts_per_s']} | {w['service']['commits']} |", "",
             "| recall (limit 10) | memories | queries | with hits | p50 ms | p95 ms | p99 ms | direct-SQL p95 ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in r["recall"]:
        s = x["db_read"]
        lines.append(f"| db.read | {x['memories']} | {x['queries']} | {x['queries_with_hits']} | {s['p50_ms']} | "
                     f"{s['p95_ms']} | {s['p99_ms']} | {x['direct_sql']['p95_ms']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
