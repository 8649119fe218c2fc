"""Recall on Postgres against recall on SQLite, same store, same queries, same run: p50/p95/p99 of
``memories.recall`` through ``Database.read`` (limit 10), the Postgres/SQLite ratio, the top-10 overlap with the
SQLite ranking, and ``EXPLAIN (ANALYZE, BUFFERS)`` of the slowest Postgres queries (where the time goes).

    .venv/bin/python -m testbed.bench.pg_recall_bench [--quick] [--memories N] [--queries N] [--out OUT/pg_recall.json]

The store: the storage bench's fixed-seed Zipf-like corpus (testbed/bench/storage_bench.py ``Corpus``), written
through each engine's storage layer in write jobs of LOAD_CHUNK memories; Postgres is a throwaway cluster this
script starts (Unix socket, the fixtures' settings), VACUUM ANALYZEd after the fill as autovacuum would. The
queries (1-3 words of the same vocabulary) take turns in blocks of BLOCK, SQLite then Postgres, so a slow phase of
the VM hits both. Overlap per query: |SQLite top-10 ∩ Postgres top-10| / the SQLite top-10's size (1 where both
are empty).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from storage import memories
from storage.backend import open_database
from storage.db import Database
from testbed.bench.figures import pct, save
from testbed.bench.storage_bench import Corpus
from testbed.env.postgres import server_binaries_present, throwaway_cluster
from testbed.paths import BENCH_OUT

SEED = 31
T0 = 1_700_000_000_000
LOAD_CHUNK = 2_000
BLOCK = 50
WARMUP = 50
# Plans printed for this many of the slowest Postgres queries.
PLANS = 3
TARGET_RATIO = 1.5
TARGET_OVERLAP = 0.9


@dataclass(frozen=True)
class Sizes:
    memories: int
    queries: int


FULL = Sizes(100_000, 1_000)
QUICK = Sizes(10_000, 200)



def summary(samples_s: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in samples_s]
    return {"p50_ms": round(pct(ms, 50), 2), "p95_ms": round(pct(ms, 95), 2), "p99_ms": round(pct(ms, 99), 2),
            "mean_ms": round(statistics.fmean(ms), 2), "n": len(ms)}


async def fill(db: Database, rows: list[memories.MemoryRow]) -> float:
    t = time.perf_counter()
    for i in range(0, len(rows), LOAD_CHUNK):
        chunk = rows[i:i + LOAD_CHUNK]
        await db.write(lambda conn, chunk=chunk: [memories.insert(conn, r) for r in chunk])
    return time.perf_counter() - t


async def timed(db: Database, doc_freqs: memories.DocFreqs, q: str) -> tuple[float, list[str]]:
    t = time.perf_counter()
    hits = await db.read(memories.recall, q, 10, None, doc_freqs)
    return time.perf_counter() - t, [m.id for m, _ in hits]


def overlap(sqlite_ids: list[str], pg_ids: list[str]) -> float:
    if not sqlite_ids:
        return float(not pg_ids)
    return len(set(sqlite_ids) & set(pg_ids)) / len(sqlite_ids)


def explain(conn: Any, q: str) -> str:
    """The Postgres recall's window statements for ``q`` (ANDed, then ORed; the recall runs the second only when
    the first finds nothing) in both shapes (through the GIN index, through the rowid index: the recall takes one
    by its guess of the matches), each under EXPLAIN (ANALYZE, BUFFERS)."""
    tokens = memories.fts_tokens(q)
    out = []
    for op in (" & ", " | ") if len(tokens) > 1 else (" & ",):
        for by_index in (True, False):
            sql, params = memories.pg_window(tokens, op, None, memories.RANK_WINDOW, tokens, by_index=by_index)
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
            out.append(f"{op.strip()} {'GIN' if by_index else 'rowid'}:\n" + "\n".join(str(r[0]) for r in rows))
    return "\n--\n".join(out)


async def run(sizes: Sizes, tmp: Path, dsn: str) -> dict[str, Any]:
    corpus = Corpus(SEED)
    rows = [corpus.memory(T0 + i) for i in range(sizes.memories)]
    queries = [corpus.query() for _ in range(sizes.queries + WARMUP)]
    warm, queries = queries[:WARMUP], queries[WARMUP:]
    dbs = {"sqlite": await open_database(backend="sqlite", path=tmp / "memory.db", dsn=""),
           "postgres": await open_database(backend="postgres", path=Path(), dsn=dsn)}
    freqs = {name: memories.DocFreqs() for name in dbs}
    out: dict[str, Any] = {"fill_s": {}}
    try:
        for name, db in dbs.items():
            out["fill_s"][name] = round(await fill(db, rows), 1)
            print(f"filled {name}: {sizes.memories} memories in {out['fill_s'][name]} s", flush=True)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("VACUUM (ANALYZE) memories")  # as autovacuum does after many inserts
        for name, db in dbs.items():
            for q in warm:
                await timed(db, freqs[name], q)
        times: dict[str, list[float]] = {name: [0.0] * len(queries) for name in dbs}
        ids: dict[str, list[list[str]]] = {name: [[] for _ in queries] for name in dbs}
        for first in range(0, len(queries), BLOCK):
            for name, db in dbs.items():
                for i in range(first, min(first + BLOCK, len(queries))):
                    times[name][i], ids[name][i] = await timed(db, freqs[name], queries[i])
        slowest = sorted(range(len(queries)), key=lambda i: -times["postgres"][i])[:PLANS]
        plans = {queries[i]: await dbs["postgres"].read(explain, queries[i]) for i in slowest}
    finally:
        for db in dbs.values():
            await db.close()
    overlaps = [overlap(a, b) for a, b in zip(ids["sqlite"], ids["postgres"], strict=True)]
    stats = {name: summary(t) for name, t in times.items()}
    ratio = stats["postgres"]["p95_ms"] / stats["sqlite"]["p95_ms"]
    mean_overlap = statistics.fmean(overlaps)
    out.update({"memories": sizes.memories, "queries": len(queries), "recall": stats,
                "ratio_p95_postgres_over_sqlite": round(ratio, 2),
                "ratio_p50_postgres_over_sqlite": round(stats["postgres"]["p50_ms"] / stats["sqlite"]["p50_ms"], 2),
                "top10_overlap": round(mean_overlap, 4),
                "queries_with_hits": {name: sum(bool(x) for x in ids[name]) for name in ids},
                "target": {"ratio_p95": TARGET_RATIO, "overlap": TARGET_OVERLAP,
                           "met": ratio <= TARGET_RATIO and mean_overlap >= TARGET_OVERLAP},
                "slowest_postgres_plans": plans})
    return out


def table(r: dict[str, Any]) -> str:
    lines = [f"{r['memories']} memories, {r['queries']} queries (limit 10), same run; top-10 overlap with the SQLite "
             f"ranking {r['top10_overlap']}", "", "| engine | p50 ms | p95 ms | p99 ms |", "|---|---|---|---|"]
    for name, s in r["recall"].items():
        lines.append(f"| {name} | {s['p50_ms']} | {s['p95_ms']} | {s['p99_ms']} |")
    lines.append(f"\nPostgres / SQLite: p95 {r['ratio_p95_postgres_over_sqlite']}x, p50 "
                 f"{r['ratio_p50_postgres_over_sqlite']}x (target p95 <= {TARGET_RATIO}x, overlap >= "
                 f"{TARGET_OVERLAP}: {'met' if r['target']['met'] else 'not met'})")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k memories, 200 queries (a smoke run)")
    ap.add_argument("--memories", type=int)
    ap.add_argument("--queries", type=int)
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "pg_recall.json")
    args = ap.parse_args()
    if not server_binaries_present():
        print("PostgreSQL 15 server binaries are missing: apt-get install -y postgresql-15", file=sys.stderr)
        return 2
    base = QUICK if args.quick else FULL
    sizes = Sizes(args.memories or base.memories, args.queries or base.queries)
    with tempfile.TemporaryDirectory(prefix="pg-recall-bench-") as tmp, throwaway_cluster() as cluster:
        res = asyncio.run(run(sizes, Path(tmp), cluster.dsn(cluster.create_db())))
    save(res, args.out)
    for q, plan in res["slowest_postgres_plans"].items():
        print(f"\nEXPLAIN (ANALYZE, BUFFERS), recall {q!r}:\n{plan}")
    print()
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
