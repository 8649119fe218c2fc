"""Knowledge-graph benchmark: depth-5 memory_kg_query and memory_find_paths on a 100k-link graph,
SQLite-CTE vs Postgres-CTE vs Postgres-AGE in one run; and recall at 100k memories on SQLite and Postgres.

    .venv/bin/python -m testbed.bench.kg_bench [--quick | --million] [--kg-only] [--backends sqlite-cte,...]
        [--out bench/out/kg.json]

Postgres runs in a throwaway cluster this script starts (initdb + pg_ctl as the postgres user, Unix
socket, fsync off on all three so the write path does not colour the read figures) and always stops.
The same fixed-seed graph goes into each backend through the storage layer (with its change-log
entries, so AGE's graph is built by the same in-transaction sync the node uses). Queries are timed
end to end through ``Service.kg`` (validation, the walk, path reconstruction), one at a time.

The gate (issue 14): AGE ships enabled by default only if its depth-5 p95 is >= 30% below the CTE's on
the same Postgres, for both operations. The verdict is printed and written to the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.assemble import open_service
from node.config import from_dict
from node.service import Service
from storage import changelog, links, memories
from storage.kg_ops import KG_BACKENDS
from storage.links import LinkRow
from storage.memories import MemoryRow
from testbed.bench.figures import pct, save
from testbed.bench.storage_bench import Corpus
from testbed.env.postgres import server_binaries_present, throwaway_cluster
from testbed.paths import BENCH_OUT

SEED = 14
T0 = 1_700_000_000_000
RELATIONS = ("related_to", "derived_from", "contradicts", "supports")
# Rows per write job while loading (one transaction each).
LOAD_CHUNK = 5_000


@dataclass(frozen=True)
class Sizes:
    memories: int
    links: int
    queries: int
    recall_memories: int
    recall_queries: int


FULL = Sizes(memories=20_000, links=100_000, queries=60, recall_memories=100_000, recall_queries=500)
MILLION = Sizes(memories=200_000, links=1_000_000, queries=60, recall_memories=1_000_000, recall_queries=500)
QUICK = Sizes(memories=2_000, links=10_000, queries=50, recall_memories=10_000, recall_queries=200)



def summary(samples_s: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in samples_s]
    return {"p50": round(pct(ms, 50), 3), "p95": round(pct(ms, 95), 3), "p99": round(pct(ms, 99), 3),
            "mean": round(statistics.fmean(ms), 3)}


def graph_rows(sizes: Sizes) -> tuple[list[str], list[LinkRow]]:
    """A fixed-seed directed graph: every memory has out-links to a few others, a third of them to near
    neighbours in id order (local clusters and cycles), the rest anywhere."""
    rnd = random.Random(SEED)
    ids = [str(uuid.UUID(int=rnd.getrandbits(128), version=4)) for _ in range(sizes.memories)]
    pairs: set[tuple[int, int]] = set()
    while len(pairs) < sizes.links:
        a = rnd.randrange(sizes.memories)
        b = (a + rnd.randint(1, 50)) % sizes.memories if rnd.random() < 0.33 else rnd.randrange(sizes.memories)
        if a != b:
            pairs.add((a, b))
    rows = [LinkRow(link_id=uuid.UUID(int=rnd.getrandbits(128)).hex * 2, src_id=ids[a], dst_id=ids[b],
                    relation=RELATIONS[rnd.randrange(4)], observed_by="ai:bench@local", valid_from=T0 + n,
                    attest_level="unsigned", created_at=T0 + n)
            for n, (a, b) in enumerate(sorted(pairs))]
    return ids, rows


def load_graph(conn: Any, ids: list[str], rows: list[LinkRow], first: int, last: int) -> None:
    for i in range(first, min(last, len(ids))):
        memories.insert(conn, MemoryRow(id=ids[i], namespace="default", content=f"node {i}",
                                        origin="ai:bench@local", created_at=T0, updated_at=T0))
    for row in rows[first * len(rows) // len(ids):min(last, len(ids)) * len(rows) // len(ids)]:
        links.insert(conn, row)
        changelog.append(conn, "link", row.link_id, 1, row.created_at)


async def open_bench_service(home: Path, storage: dict[str, Any]) -> Service:
    cfg = from_dict({"agent_id": "ai:bench@local", "home": str(home),
                     "storage": {"synchronous": "normal", **storage}}, env={})
    return await open_service(cfg)


async def bench_kg(svc: Service, ids: list[str], sizes: Sizes) -> dict[str, Any]:
    rnd = random.Random(SEED + 1)
    as_of = T0 + 10 * sizes.links
    starts = [ids[rnd.randrange(len(ids))] for _ in range(sizes.queries)]
    q_times, reached, truncated = [], [], 0
    for s in starts:
        t = time.perf_counter()
        r = await svc.kg.query(s, depth=5, as_of=as_of)
        q_times.append(time.perf_counter() - t)
        reached.append(r["count"])
        truncated += r["truncated"]
    # Destinations 3-5 hops away, so most path queries have answers.
    pairs = []
    for s in starts:
        r = await svc.kg.query(s, depth=4, as_of=as_of, limit=200)
        far = [n["memory_id"] for n in r["neighbours"] if n["depth"] >= 3] or [ids[rnd.randrange(len(ids))]]
        pairs.append((s, far[rnd.randrange(len(far))]))
    p_times, found = [], []
    for s, d in pairs:
        t = time.perf_counter()
        r = await svc.kg.find_paths(s, d, max_depth=5, limit=10, as_of=as_of)
        p_times.append(time.perf_counter() - t)
        found.append(r["count"])
    return {"kg_query_depth5": {**summary(q_times), "mean_neighbours": round(statistics.fmean(reached), 1),
                                "truncated": truncated, "queries": len(starts)},
            "find_paths_depth5": {**summary(p_times), "mean_paths": round(statistics.fmean(found), 2),
                                  "queries": len(pairs)}}


async def bench_after_write(svc: Service, ids: list[str], sizes: Sizes, rounds: int = 5) -> dict[str, Any]:
    """A depth-5 memory_kg_query right after a link is written: AGE rebuilds its in-memory graph on the next
    walk of each backend after any write to the graph, the CTEs have nothing to rebuild."""
    rnd = random.Random(SEED + 2)
    as_of = T0 + 10 * sizes.links
    times = []
    for n in range(rounds):
        row = LinkRow(link_id=uuid.UUID(int=rnd.getrandbits(128)).hex * 2, src_id=ids[rnd.randrange(len(ids))],
                      dst_id=ids[rnd.randrange(len(ids))], relation=RELATIONS[0], observed_by="ai:bench@local",
                      valid_from=T0 + sizes.links + n, attest_level="unsigned", created_at=T0 + sizes.links + n)

        def write(conn: Any, row: LinkRow = row) -> None:
            links.insert(conn, row)
            changelog.append(conn, "link", row.link_id, 1, row.created_at)

        await svc.db.write(write)
        start = ids[rnd.randrange(len(ids))]
        t = time.perf_counter()
        await svc.kg.query(start, depth=5, as_of=as_of)
        times.append(time.perf_counter() - t)
    return {"p50": round(pct([x * 1000 for x in times], 50), 1), "max": round(max(times) * 1000, 1),
            "rounds": rounds}


async def bench_recall(svc: Service, sizes: Sizes) -> dict[str, Any]:
    corpus = Corpus()
    rows = [corpus.memory(T0 + i) for i in range(sizes.recall_memories)]
    for i in range(0, len(rows), LOAD_CHUNK):
        chunk = rows[i:i + LOAD_CHUNK]
        await svc.db.write(lambda conn, chunk=chunk: [memories.insert(conn, r) for r in chunk])
    queries = [corpus.query() for _ in range(sizes.recall_queries)]
    times, hits = [], 0
    for q in queries:
        t = time.perf_counter()
        r = await svc.db.read(memories.recall, q, 10, None, svc.doc_freqs)
        times.append(time.perf_counter() - t)
        hits += bool(r)
    return {**summary(times), "memories": sizes.recall_memories, "queries": len(queries), "with_hits": hits}


def backend_storage(name: str, cluster: Any) -> dict[str, Any]:
    if name == "sqlite-cte":
        return {}
    if name == "postgres-cte":
        return {"backend": "postgres", "dsn": cluster.dsn(cluster.create_db())}
    return {"backend": "postgres", "dsn": cluster.dsn(cluster.create_db(age=True)), "age": "on"}


async def run(sizes: Sizes, tmp: Path, cluster: Any, recall: bool = True,
              kg_backends: tuple[str, ...] = KG_BACKENDS) -> dict[str, Any]:
    ids, rows = graph_rows(sizes)
    out: dict[str, Any] = {"kg": {}, "recall": {}, "load_s": {}}
    for name in kg_backends:
        storage = backend_storage(name, cluster)
        svc = await open_bench_service(tmp / name, storage)
        try:
            assert svc.kg.backend == name, (svc.kg.backend, name)
            t = time.perf_counter()
            step = max(1, LOAD_CHUNK * len(ids) // len(rows))
            for first in range(0, len(ids), step):
                await svc.db.write(load_graph, ids, rows, first, first + step)
            out["load_s"][name] = round(time.perf_counter() - t, 1)
            print(f"{name}: loaded {len(ids)} memories, {len(rows)} links in {out['load_s'][name]} s", flush=True)
            out["kg"][name] = await bench_kg(svc, ids, sizes)
            out["kg"][name]["kg_query_after_write"] = await bench_after_write(svc, ids, sizes)
            print(f"{name}: {out['kg'][name]}", flush=True)
        finally:
            await svc.close()
    recalls = (("sqlite", {}), ("postgres", {"backend": "postgres", "dsn": cluster.dsn(cluster.create_db())}))
    for name, storage in recalls if recall else ():
        svc = await open_bench_service(tmp / f"recall-{name}", storage)
        try:
            out["recall"][name] = await bench_recall(svc, sizes)
            print(f"recall {name}: {out['recall'][name]}", flush=True)
        finally:
            await svc.close()
    if {"postgres-cte", "postgres-age"} <= set(kg_backends):
        cte, age = out["kg"]["postgres-cte"], out["kg"]["postgres-age"]
        gains = {op: round(1 - age[op]["p95"] / cte[op]["p95"], 3) for op in ("kg_query_depth5", "find_paths_depth5")}
        out["age_gate"] = {"p95_reduction_vs_postgres_cte": gains,
                           "enable_by_default": all(g >= 0.30 for g in gains.values())}
    return out


def table(res: dict[str, Any]) -> str:
    lines = ["| backend | operation | p50 ms | p95 ms | p99 ms | mean result |", "|---|---|---|---|---|---|"]
    for name, ops in res["kg"].items():
        q, p = ops["kg_query_depth5"], ops["find_paths_depth5"]
        lines.append(f"| {name} | memory_kg_query depth 5 | {q['p50']} | {q['p95']} | {q['p99']} | "
                     f"{q['mean_neighbours']} neighbours ({q['truncated']} truncated) |")
        lines.append(f"| {name} | memory_find_paths depth 5 | {p['p50']} | {p['p95']} | {p['p99']} | "
                     f"{p['mean_paths']} paths |")
        w = ops["kg_query_after_write"]
        lines.append(f"| {name} | memory_kg_query depth 5 after a link write | {w['p50']} | | max {w['max']} | "
                     f"{w['rounds']} rounds |")
    lines += ["", "| recall (limit 10) | memories | p50 ms | p95 ms | p99 ms | with hits |",
              "|---|---|---|---|---|---|"]
    for name, r in res["recall"].items():
        lines.append(f"| {name} | {r['memories']} | {r['p50']} | {r['p95']} | {r['p99']} | "
                     f"{r['with_hits']}/{r['queries']} |")
    g = res.get("age_gate")
    if g is None:
        return "\n".join(lines)
    lines += ["", f"AGE p95 reduction vs Postgres-CTE: {g['p95_reduction_vs_postgres_cte']} -> "
                  f"{'enable by default' if g['enable_by_default'] else 'keep behind storage.age (default off)'}"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k links, 10k recall memories (a smoke run)")
    ap.add_argument("--million", action="store_true", help="1M links on 200k memories, recall at 1M memories")
    ap.add_argument("--kg-only", action="store_true", help="the graph walks only, no recall")
    ap.add_argument("--backends", default=",".join(KG_BACKENDS), help="graph backends to run, comma-separated")
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "kg.json")
    args = ap.parse_args()
    if not server_binaries_present():
        print("PostgreSQL 15 server binaries are missing: apt-get install -y postgresql-15", file=sys.stderr)
        return 2
    sizes = QUICK if args.quick else MILLION if args.million else FULL
    kg_backends = tuple(b for b in args.backends.split(",") if b)
    if not set(kg_backends) <= set(KG_BACKENDS):
        print(f"--backends: each one of {', '.join(KG_BACKENDS)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kg-bench-") as tmp, throwaway_cluster() as cluster:
        if not cluster.has_age():
            print("the Apache AGE extension is not installed (see shared/vendor/README.md)", file=sys.stderr)
            return 2
        res = asyncio.run(run(sizes, Path(tmp), cluster, recall=not args.kg_only, kg_backends=kg_backends))
    res["sizes"] = sizes.__dict__
    save(res, args.out)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
