"""A node at a million memories (SQLite): the fill through the group-commit writer with synchronous = full,
then recall, get, bytes on disk, the process's memory and the tables that must stay bounded, in one run.

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.million_bench [--memories N] [--queries N]
        [--gets N] [--keep DIR]

One node home with a key (every memory version signed), the default permission gate (its storage quota raised
to 64 GiB, as the size budget is) and no hooks; the
database is filled through ``Service.memory_store`` (as the CLI, MCP and federation write: fields, gate,
signature, change log, outbox, one group-commit transaction per writer batch) with the storage bench's Zipf-like
corpus, ``--concurrency`` stores in flight (the writer batches them), ``storage.synchronous = full``. Every
tenth of the fill is a slice: its rate, the process's RSS (anonymous and file-mapped apart: readers map the
file, ``READER_MMAP_BYTES``) and the file's size. Then, once the writer's idle FTS5 merge has settled:

- recall: ``Service.memory_recall`` (limit 10) and ``memories.recall`` through ``Database.read``, against the
  baseline measured in the same run, a plain bm25 ranking (FTS5 ``ORDER BY rank``, the recall bench's
  ``recall_baseline``) on a plain connection; top-10 overlap of the node's recall against it;
- get: ``Service.memory_get`` of random stored ids against ``SELECT ... WHERE id = ?`` on a plain connection;
- SQLite's quick_check of the whole file (what a node runs at start and every
  ``storage.integrity_check_interval_s``), timed;
- the bounded tables: outbox and dead letters (no peers: nothing queued), change log rows a memory, and the
  seen cache's bound (``a2a.seen_cache_size``; it lives in the receiver, not the store).

Modes take turns a block of 50 at a time. Prints a markdown table; writes bench/out/million.json. Targets:
fill >= 2,000 memories/s sustained, recall p95 <= 10 ms, overlap >= 0.9, get p95 <= 1 ms, RSS not growing
with the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mesh import keys
from node.assemble import open_service
from node.config import from_dict
from node.hooks import NoHooks
from node.node import GIL_SWITCH_INTERVAL_S
from node.service import Service
from storage import memories
from testbed.bench.recall_bench import agreement, recall_baseline, settle_writer
from testbed.bench.storage_bench import Corpus, report_run, summarize
from testbed.paths import BENCH_OUT

AGENT = "ai:bench@lab"
TARGET_FILL_PER_S = 2000.0
TARGET_RECALL_P95_MS = 10.0
TARGET_OVERLAP = 0.9
TARGET_GET_P95_MS = 1.0
SLICES = 10
BLOCK = 50


def rss() -> dict[str, int]:
    """This process's resident memory in KiB: total, anonymous, file-mapped (Linux /proc)."""
    out = {}
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def disk_bytes(db_path: Path) -> int:
    return sum(p.stat().st_size for p in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")) if p.exists())


async def fill(svc: Service, corpus: Corpus, n: int, concurrency: int) -> list[dict[str, Any]]:
    """Store ``n`` corpus memories through ``memory_store``, ``concurrency`` at a time; one row a slice."""
    slices = []
    per_slice = max(1, n // SLICES)
    done = 0
    sem = asyncio.Semaphore(concurrency)

    async def one(r: Any) -> None:
        async with sem:
            await svc.memory_store(r.content, title=r.title, namespace=r.namespace, tags=r.tags)

    for _ in range(SLICES + 1):
        if done >= n:
            break
        k = min(per_slice, n - done)
        t0 = time.perf_counter()
        for start in range(0, k, 10 * concurrency):  # bounded in flight; a slice's coroutines built in pieces
            rows = [corpus.memory(0) for _ in range(min(10 * concurrency, k - start))]
            await asyncio.gather(*(one(r) for r in rows))
        secs = time.perf_counter() - t0
        done += k
        slices.append({"memories": done, "seconds": round(secs, 2), "per_s": round(k / secs),
                       "disk_bytes": disk_bytes(svc.db.path), **rss()})
        print(f"filled {done}: {k / secs:.0f}/s, rss {slices[-1]}", file=sys.stderr)
    return slices


async def measure(svc: Service, queries: list[str], ids: list[str]) -> dict[str, Any]:
    """Recall and get, each mode against its same-run baseline, modes taking turns a block at a time."""
    conn = sqlite3.connect(f"{svc.db.path.resolve().as_uri()}?mode=ro", uri=True)
    conn.execute("PRAGMA mmap_size = 268435456")  # as the node's readers map the file

    async def direct(fn: Callable[[], Any]) -> Any:
        return fn()

    def get_direct(i: str) -> Any:
        return conn.execute("SELECT * FROM memories WHERE id = ?", (i,)).fetchone()

    recall_modes: dict[str, Callable[[str], Awaitable[Any]]] = {
        "plain bm25 (baseline), direct SQL": lambda q: direct(lambda: recall_baseline(conn, q, 10)),
        "memories.recall, db.read": lambda q: svc.db.read(memories.recall, q, 10, None, svc.doc_freqs),
        "Service.memory_recall": lambda q: svc.memory_recall(q, limit=10),
    }
    get_modes: dict[str, Callable[[str], Awaitable[Any]]] = {
        "SELECT by id (baseline), direct SQL": lambda i: direct(lambda: get_direct(i)),
        "Service.memory_get": lambda i: svc.memory_get(i),
    }
    for q in queries[:BLOCK]:  # warm: page cache, reader connections, DocFreqs
        for fn in recall_modes.values():
            await fn(q)
    recall_s, results = await _turns(recall_modes, queries)
    get_s, _ = await _turns(get_modes, ids)
    conn.close()
    base = "plain bm25 (baseline), direct SQL"
    # The recall bench's agreement: plain bm25 as its "old", the node's query as its "new", the Service's ids.
    overlaps, same_scores, service_same = agreement({
        "old query, db.read": results[base], "new query, db.read": results["memories.recall, db.read"],
        "Service, everything on": results["Service.memory_recall"]})
    return {"recall": {k: summarize(v) for k, v in recall_s.items()},
            "get": {k: summarize(v) for k, v in get_s.items()},
            "overlap_top10": round(sum(overlaps) / len(overlaps), 4), "queries_with_equal_scores": same_scores,
            "service_same_ids_as_query": service_same}


async def _turns(modes: dict[str, Callable[[str], Awaitable[Any]]],
                 args: list[str]) -> tuple[dict[str, list[float]], dict[str, list[Any]]]:
    names = list(modes)
    samples: dict[str, list[float]] = {n: [0.0] * len(args) for n in names}
    results: dict[str, list[Any]] = {n: [None] * len(args) for n in names}
    for b, start in enumerate(range(0, len(args), BLOCK)):
        for k in range(len(names)):
            name = names[(b + k) % len(names)]
            for i in range(start, min(start + BLOCK, len(args))):
                t0 = time.perf_counter()
                results[name][i] = await modes[name](args[i])
                samples[name][i] = time.perf_counter() - t0
    return samples, results


def sample_ids(conn: sqlite3.Connection, k: int) -> list[str]:
    """``k`` stored ids drawn at random (by rowid, fixed seed)."""
    top = conn.execute("SELECT max(rowid) FROM memories").fetchone()[0] or 0
    rng = random.Random(3)
    ids: list[str] = []
    for _ in range(20 * k):
        if len(ids) >= k or not top:
            break
        row = conn.execute("SELECT id FROM memories WHERE rowid = ?", (rng.randint(1, top),)).fetchone()
        if row is not None:
            ids.append(row[0])
    return ids


async def bounded(svc: Service, n: int) -> dict[str, Any]:
    def counts(conn: sqlite3.Connection) -> dict[str, int]:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: S608 (fixed names)
                for t in ("memories", "a2a_outbox", "a2a_dead_letters", "change_log", "signed_events")}
    c = await svc.db.read(counts)
    return {"rows": c, "change_log_rows_per_memory": round(c["change_log"] / max(1, n), 3),
            "seen_cache_bound": svc.cfg.a2a.seen_cache_size}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = Corpus()
    queries = [corpus.query() for _ in range(args.queries)]
    with tempfile.TemporaryDirectory(prefix="million-bench-") as tmp:
        home = (args.keep or Path(tmp)) / "home"
        filled = (home / "filled.json").exists()
        # The storage quota stays on (its check is on the write path), raised as the size budget is: the default
        # 100 MiB holds ~430k of this corpus's memories.
        cfg = from_dict({"agent_id": AGENT, "home": str(home), "storage": {"synchronous": "full"},
                         "limits": {"max_db_bytes": 64 * 1024 ** 3, "requests_per_second": 10 ** 9},
                         "permissions": {"max_bytes_per_agent": 64 * 1024 ** 3}}, env={})
        if not filled:
            home.mkdir(parents=True, exist_ok=True)
            keys.generate_identity(cfg.keys_dir, AGENT)
        t0 = time.perf_counter()
        svc = await open_service(cfg, require_identity=True, hooks=NoHooks())
        open_s = time.perf_counter() - t0
        try:
            start_rss = rss()
            slices = [] if filled else await fill(svc, corpus, args.memories, args.concurrency)
            if args.keep and not filled:
                (home / "filled.json").write_text(json.dumps({"memories": args.memories}), encoding="utf-8")
            settle = await settle_writer(svc.db, 1.0)
            ids = await svc.db.read(sample_ids, args.gets)
            result = await measure(svc, queries, ids)
            t1 = time.perf_counter()
            findings = await svc.db.check_integrity()
            check_s = time.perf_counter() - t1
            result.update({"fill": slices, "open_s": round(open_s, 3), "rss_kib_at_open": start_rss,
                           "rss_kib_after_queries": rss(), "settle": settle, "disk_bytes": disk_bytes(svc.db.path),
                           "quick_check_s": round(check_s, 2), "quick_check_ok": findings is not None and findings.ok,
                           "bounded": await bounded(svc, args.memories)})
        finally:
            await svc.close()
    n = args.memories
    rates = [s["per_s"] for s in result["fill"]]
    result.update({"bench": "million", "memories": n, "queries": len(queries), "gets": len(ids),
                   "concurrency": args.concurrency, "bytes_per_memory": round(result["disk_bytes"] / n),
                   "fill_per_s_overall": round(n / sum(s["seconds"] for s in result["fill"])) if rates else None,
                   "fill_per_s_slowest_slice": min(rates) if rates else None,
                   "sqlite": sqlite3.sqlite_version, "python": platform.python_version(), "cpus": os.cpu_count()})
    result["target"] = _targets(result)
    return result


def _targets(r: dict[str, Any]) -> dict[str, Any]:
    rec, get = r["recall"]["Service.memory_recall"], r["get"]["Service.memory_get"]
    return {"fill_sustained": (r["fill_per_s_slowest_slice"] or 0) >= TARGET_FILL_PER_S,
            "recall_p95": rec["p95_ms"] <= TARGET_RECALL_P95_MS, "overlap": r["overlap_top10"] >= TARGET_OVERLAP,
            "get_p95": get["p95_ms"] <= TARGET_GET_P95_MS}


def markdown(r: dict[str, Any]) -> str:
    lines = [f"### a node at {r['memories']:,} memories (SQLite {r['sqlite']}, synchronous = full, "
             f"{r['concurrency']} stores in flight)", "",
             "| fill slice (memories) | memories/s | RSS MiB (anon / file) | file MiB |", "|---|---:|---:|---:|"]
    for s in r["fill"]:
        lines.append(f"| {s['memories']:,} | {s['per_s']:,} | {s['VmRSS'] / 1024:.0f} ({s['RssAnon'] / 1024:.0f} / "
                     f"{s['RssFile'] / 1024:.0f}) | {s['disk_bytes'] / 2 ** 20:.0f} |")
    lines += ["", f"fill: {r['fill_per_s_overall']} memories/s overall, slowest slice "
              f"{r['fill_per_s_slowest_slice']}; bytes on disk a memory: {r['bytes_per_memory']}; quick_check of the "
              f"whole file: {r['quick_check_s']} s; open: {r['open_s']} s", "",
              "| mode | p50 ms | p95 ms | p99 ms | p95 vs baseline |", "|---|---:|---:|---:|---:|"]
    for kind, base in (("recall", "plain bm25 (baseline), direct SQL"), ("get", "SELECT by id (baseline), direct SQL")):
        for name, s in r[kind].items():
            lines.append(f"| {kind}: {name} | {s['p50_ms']} | {s['p95_ms']} | {s['p99_ms']} | "
                         f"{s['p95_ms'] / r[kind][base]['p95_ms']:.2f}x |")
    b = r["bounded"]
    lines += ["", f"top-10 overlap against plain bm25: {r['overlap_top10']}; rows: {b['rows']}; change log rows a "
              f"memory: {b['change_log_rows_per_memory']}; seen cache bound: {b['seen_cache_bound']}; RSS after the "
              f"queries: {r['rss_kib_after_queries']}", "", f"targets: {r['target']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memories", type=int, default=1_000_000, help="memories to fill (default 1,000,000)")
    ap.add_argument("--queries", type=int, default=1000, help="recall queries per mode (default 1000)")
    ap.add_argument("--gets", type=int, default=1000, help="memory_get calls per mode (default 1000)")
    ap.add_argument("--concurrency", type=int, default=64, help="stores in flight during the fill (default 64)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="fill DIR/home once and reuse it (the serve-to-ready bench can start a node on it)")
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "million.json")
    ap.add_argument("--switch-interval", type=float, default=GIL_SWITCH_INTERVAL_S,
                    help="sys.setswitchinterval, as the node sets it")
    return report_run(ap.parse_args(argv), run, markdown)


if __name__ == "__main__":
    main()
