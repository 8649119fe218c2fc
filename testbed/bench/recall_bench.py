"""Recall at 100k memories: the old query against today's, and the Service with everything on, in one run.

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.recall_bench [--quick] [--memories N] [--queries N]
        [--keep DIR] [--settle-s S] [--block B]

One node home with a key (memory versions signed), a permission gate of 1,000 rules (enforce) and a
daemon ``post_recall`` hook; its database is filled through ``Service.memory_store`` with the storage
bench's Zipf-like corpus (storage.synchronous = normal for the fill). The recall queries are the storage
bench's (same seed: 1-3 words, limit 10). Modes take turns a block of ``--block`` queries (50) at a time, the
first mode rotating from block to block, so the machine's drift spreads over all of them while each mode runs
as a node would, one recall after another of its own kind (``--block 1`` takes turns query by query: each query
then runs right after other modes' work on other connections and caches, which a node never does). The modes:

- old query: the earlier recall (every word ranked by FTS5's ORDER BY rank sorter over the 500-row window),
  kept here as ``recall_baseline``, through ``Database.read`` and on a plain connection;
- new query: ``storage.memories.recall`` with the Service's ``DocFreqs``, the same two ways;
- Service, nothing on: ``memory_recall`` with no hooks and no gate (still signed rows);
- Service, everything on: ``memory_recall`` with the daemon post_recall hook and the 1,000-rule gate.

Overlap: mean over the queries of |old top-10 ∩ new top-10| / 10 (target >= 0.9); also how many queries
give the same ten scores to 1e-5 (a common word adds at most ~1e-6 to a score, so the rest are ties).
Between the fill and the queries the bench settles (``--settle-s``, 1 s, then for as long as the writer's
idle FTS5 merge runs; 0 queries at once, beside it): the JSON says how long and how far the merge had got.
Prints a markdown table; writes bench/out/recall.json. Target: new-query p95 <= 5 ms at 100k.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sqlite3
import statistics
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
from node.hooks.pipeline import HookPipeline
from node.node import GIL_SWITCH_INTERVAL_S
from storage import memories

# The baseline selects and builds rows exactly as recall does, hence the private names.
from storage.memories import _COLUMNS, MemoryRow, _row, fts_tokens
from testbed.bench.everything_on import DAEMON, hooks_toml, rules_toml
from testbed.bench.storage_bench import Corpus, report_run, summarize
from testbed.bench.variants import variant
from testbed.paths import BENCH_OUT

AGENT = "ai:bench@lab"
TARGET_P95_MS = 5.0
TARGET_OVERLAP = 0.9
FILL_BATCH = 500
NAMESPACES = ("work", "home", "lab")


# ---- the baseline: recall as it was before "Recall at 100k" (commit 6422cb2) --------------------

def recall_baseline(conn: sqlite3.Connection, query: str, limit: int = 10, namespace: str | None = None,
                    rank_window: int = memories.RANK_WINDOW) -> list[tuple[MemoryRow, float]]:
    tokens = fts_tokens(query)
    if not tokens or limit <= 0:
        return []
    hits = _search_baseline(conn, " AND ".join(tokens), limit, namespace, rank_window)
    if not hits and len(tokens) > 1:
        hits = _search_baseline(conn, " OR ".join(tokens), limit, namespace, rank_window)
    return hits


def _search_baseline(conn: sqlite3.Connection, match: str, limit: int, namespace: str | None,
                     rank_window: int) -> list[tuple[MemoryRow, float]]:
    cols = ", ".join(f"m.{c.strip()}" for c in _COLUMNS.split(","))
    ns_join, ns_where, ns_args = ("", "", ()) if namespace is None else \
        ("JOIN memories AS m ON m.rowid = f.rowid", "AND m.namespace = ?", (namespace,))
    start = conn.execute(f"SELECT f.rowid FROM memories_fts AS f {ns_join} WHERE memories_fts MATCH ? {ns_where} "
                         "ORDER BY f.rowid DESC LIMIT 1 OFFSET ?", (match, *ns_args, rank_window - 1)).fetchone()
    floor = start[0] if start else -(2 ** 63)
    if namespace is None:
        sql = (f"SELECT {cols}, f.rank FROM (SELECT rowid, rank FROM memories_fts WHERE memories_fts MATCH ? "
               "AND rowid >= ? ORDER BY rank LIMIT ?) AS f JOIN memories AS m ON m.rowid = f.rowid ORDER BY f.rank")
        rows = conn.execute(sql, (match, floor, limit))
    else:
        sql = (f"SELECT {cols}, f.rank FROM memories_fts AS f JOIN memories AS m ON m.rowid = f.rowid "
               "WHERE memories_fts MATCH ? AND f.rowid >= ? AND m.namespace = ? ORDER BY f.rank LIMIT ?")
        rows = conn.execute(sql, (match, floor, namespace, limit))
    return [(_row(r[:-1]), -r[-1]) for r in rows]


# ---- the run ---------------------------------------------------------------------------------

def bench_rules(n: int) -> str:
    """``n`` rules: the permissions bench's, with the last three letting this agent store and recall here."""
    text = rules_toml(n - len(NAMESPACES))
    for ns in NAMESPACES:
        text += (f'[[rules]]\nagent = "{AGENT}"\nnamespace = "{ns}"\noperations = ["store", "recall"]\n'
                 'action = "allow"\ninherit = true\n')
    return text


async def fill(svc: Any, corpus: Corpus, n: int) -> float:
    """Store ``n`` corpus memories through ``memory_store`` (signed, gated); returns seconds."""
    t0 = time.perf_counter()
    for start in range(0, n, FILL_BATCH):
        rows = [corpus.memory(0) for _ in range(min(FILL_BATCH, n - start))]
        await asyncio.gather(*(svc.memory_store(r.content, title=r.title, namespace=r.namespace, tags=r.tags)
                               for r in rows))
    return time.perf_counter() - t0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = Corpus()
    queries = [corpus.query() for _ in range(args.queries)]  # drawn first, as the storage bench does
    with tempfile.TemporaryDirectory(prefix="recall-bench-") as tmp:
        base = args.keep or Path(tmp)
        home = base / "home"
        marker = base / "filled.json"
        filled = json.loads(marker.read_text(encoding="utf-8")) if marker.exists() else None
        if filled is not None and filled != {"memories": args.memories, "rules": args.rules}:
            raise SystemExit(f"{base} was filled as {filled}: use another --keep directory")
        if filled is None and base.exists() and any(base.iterdir()):
            raise SystemExit(f"{base} is not empty and was not filled by this bench")
        home.mkdir(parents=True, exist_ok=True)
        (home / "rules.toml").write_text(bench_rules(args.rules), encoding="utf-8")
        (base / "daemon.py").write_text(DAEMON, encoding="utf-8")
        hooks_toml(base / "hooks.toml", "bench-daemon", "daemon", [sys.executable, str(base / "daemon.py")])
        # 100k signed memories pass the default 100 MB database budget.
        cfg = from_dict({"agent_id": AGENT, "home": str(home), "storage": {"synchronous": "normal"},
                         "limits": {"max_db_bytes": 4 * 1024 ** 3},
                         "permissions": {"config": "rules.toml", "reload_check_s": 3600.0}}, env={})
        if filled is None:
            keys.generate_identity(cfg.keys_dir, AGENT)
        svc = await open_service(cfg, require_identity=True, hooks=NoHooks())
        daemon = HookPipeline(base / "hooks.toml", cfg.hooks)
        try:
            assert svc.identity is not None and svc.gate is not None and len(svc.gate.index) == args.rules
            if filled is None:
                fill_s = await fill(svc, corpus, args.memories)
                print(f"filled {args.memories} memories in {fill_s:.1f} s", file=sys.stderr)
                if args.keep:
                    marker.write_text(json.dumps({"memories": args.memories, "rules": args.rules}), encoding="utf-8")
            else:
                fill_s = 0.0
                print(f"reusing the {args.memories} memories in {base}", file=sys.stderr)
            settle = await settle_writer(svc.db, args.settle_s) if args.settle_s else None
            signed = sum(1 for r in await svc.db.read(memories.list_, None, 100) if r.signature)
            merge_at_queries = dict(getattr(svc.db, "merge_stats", {}))
            result = await measure(svc, daemon, queries, args.block)
            result["settle"] = settle
            result["fts_merge_at_queries"] = merge_at_queries
            result["fts_merge_after_queries"] = dict(getattr(svc.db, "merge_stats", {}))
            result["fill_seconds"] = round(fill_s, 1) if filled is None else None
            result["signed_in_newest_100"] = signed
        finally:
            await daemon.close()
            await svc.close()
    result.update({"bench": "recall", "memories": args.memories, "queries": len(queries), "limit": 10,
                   "block": args.block,
                   "rules": args.rules, "switch_interval_s": args.switch_interval,
                   "sqlite": sqlite3.sqlite_version, "python": platform.python_version(),
                   "machine": platform.machine()})
    return result


async def settle_writer(db: Any, min_s: float, max_s: float = 300.0) -> dict[str, Any]:
    """Wait ``min_s``, then while the writer's idle FTS5 merge is under way (bounded by ``max_s``), so the
    queries measure the index as the node leaves it rather than the merge running beside them. Code without
    idle merging only waits ``min_s``. Returns the seconds waited and the merge counters."""
    t0 = time.perf_counter()
    await asyncio.sleep(min_s)
    for _ in range(int(max_s / 0.05)):
        if not getattr(db, "merge_stats", {}).get("merging"):
            break
        await asyncio.sleep(0.05)
    waited = time.perf_counter() - t0
    print(f"settled for {waited:.1f} s: {getattr(db, 'merge_stats', None)}", file=sys.stderr)
    return {"seconds": round(waited, 2), "fts_merge": dict(getattr(db, "merge_stats", {}))}


async def measure(svc: Any, daemon: HookPipeline, queries: list[str], block: int) -> dict[str, Any]:
    gate = svc.gate
    conn = sqlite3.connect(f"{svc.db.path.resolve().as_uri()}?mode=ro", uri=True)
    direct_df = memories.DocFreqs()

    variants = {(hooks is daemon, with_gate): variant(svc, hooks=hooks, gate=gate if with_gate else None)
                for hooks in (NoHooks(), daemon) for with_gate in (False, True)}

    async def service(hooks: Any, with_gate: bool, q: str) -> list[dict[str, Any]]:
        return list(await variants[hooks is daemon, with_gate].memory_recall(q, limit=10))

    async def direct(fn: Callable[[], Any]) -> Any:
        return fn()

    modes: dict[str, Callable[[str], Awaitable[Any]]] = {
        "old query, db.read": lambda q: svc.db.read(recall_baseline, q, 10),
        "new query, db.read": lambda q: svc.db.read(memories.recall, q, 10, None, svc.doc_freqs),
        "old query, direct SQL": lambda q: direct(lambda: recall_baseline(conn, q, 10)),
        "new query, direct SQL": lambda q: direct(lambda: memories.recall(conn, q, 10, None, direct_df)),
        "Service, nothing on": lambda q: service(NoHooks(), False, q),
        "Service, everything on": lambda q: service(daemon, True, q),
    }
    names = list(modes)
    for q in queries[:50]:  # warm: page cache, reader connections, the daemon, the DocFreqs caches
        for name in names:
            await modes[name](q)
    # Each query's kind, by the words bm25 clamps (in at least half the memories): what the profile split by.
    kinds = [_kind(direct_df.common(conn, fts_tokens(q))) for q in queries]
    samples: dict[str, list[float]] = {name: [0.0] * len(queries) for name in names}
    results: dict[str, list[Any]] = {name: [None] * len(queries) for name in names}
    # Query by query (block 1) or a block of queries per mode; either way the first mode rotates, so drift
    # falls on every mode.
    for b, start in enumerate(range(0, len(queries), block)):
        for k in range(len(names)):
            name = names[(b + k) % len(names)]
            for i in range(start, min(start + block, len(queries))):
                t0 = time.perf_counter()
                res = await modes[name](queries[i])
                samples[name][i] = time.perf_counter() - t0
                results[name][i] = res
    overlaps, same_scores, everything_hits = agreement(results)
    conn.close()
    stats = {name: summarize(s) for name, s in samples.items()}
    by_kind = {kind: {"queries": kinds.count(kind),
                      "overlap_top10": round(statistics.fmean(o for o, k in zip(overlaps, kinds, strict=True)
                                                              if k == kind), 4),
                      **{name: summarize([t for t, k in zip(samples[name], kinds, strict=True) if k == kind])
                         for name in ("old query, db.read", "new query, db.read")}}
               for kind in KINDS if kind in kinds}
    old_p95, new_p95 = stats["old query, db.read"]["p95_ms"], stats["new query, db.read"]["p95_ms"]
    old_p50 = stats["old query, db.read"]["p50_ms"]
    overlap = sum(overlaps) / len(overlaps)
    return {"modes": stats, "by_kind": by_kind, "overlap_top10": round(overlap, 4),
            "queries_with_equal_scores": same_scores,
            "everything_on_same_ids_as_new": everything_hits,
            "ratio_p95_old_over_new": round(old_p95 / new_p95, 2),
            "ratio_p50_old_over_new": round(old_p50 / stats["new query, db.read"]["p50_ms"], 2),
            "target": {"p95_ms": TARGET_P95_MS, "overlap": TARGET_OVERLAP,
                       "met": new_p95 <= TARGET_P95_MS and overlap >= TARGET_OVERLAP,
                       "everything_on_met": stats["Service, everything on"]["p95_ms"] <= TARGET_P95_MS}}


def agreement(results: dict[str, list[Any]]) -> tuple[list[float], int, int]:
    """Per query, |old top-10 ∩ new top-10| / 10; how many queries gave the same ten scores to 1e-5; how many
    gave everything-on the new query's ids."""
    overlaps, same_scores, everything_hits = [], 0, 0
    for i in range(len(results["old query, db.read"])):
        old, new = results["old query, db.read"][i], results["new query, db.read"][i]
        old_ids, new_ids = {m.id for m, _ in old}, {m.id for m, _ in new}
        overlaps.append(len(old_ids & new_ids) / min(10, len(old_ids)) if old_ids else float(not new_ids))
        same_scores += len(old) == len(new) and all(abs(a - b) <= 1e-5 for (_, a), (_, b) in zip(old, new, strict=True))
        everything_hits += [r["id"] for r in results["Service, everything on"][i]] == [m.id for m, _ in new]
    return overlaps, same_scores, everything_hits


KINDS = ("every word rare", "rare and common words", "every word common")


def _kind(common: list[bool]) -> str:
    return KINDS[2] if all(common) else KINDS[1] if any(common) else KINDS[0]


def markdown(r: dict[str, Any]) -> str:
    old = r["modes"]["old query, db.read"]
    lines = [f"### recall bench ({r['memories']} memories, {r['queries']} queries, limit 10, SQLite {r['sqlite']}, "
             f"{r['rules']} rules, GIL switch interval {r['switch_interval_s']} s, modes take turns every "
             f"{r['block']} {'query' if r['block'] == 1 else 'queries'})", "",
             "| mode | p50 ms | p95 ms | p99 ms | p95 vs old query, db.read |", "|---|---:|---:|---:|---:|"]
    for name, s in r["modes"].items():
        lines.append(f"| {name} | {s['p50_ms']} | {s['p95_ms']} | {s['p99_ms']} | "
                     f"{round(s['p95_ms'] / old['p95_ms'], 2)}x |")
    t = r["target"]
    lines += ["", f"old/new p95 ratio (db.read): **{r['ratio_p95_old_over_new']}x** "
              f"(p50 {r['ratio_p50_old_over_new']}x); "
              f"top-10 overlap: **{r['overlap_top10']}** ({r['queries_with_equal_scores']}/{r['queries']} queries "
              f"with the same ten scores to 1e-5; everything-on gives the new query's ids for "
              f"{r['everything_on_same_ids_as_new']}); target p95 <= {t['p95_ms']} ms and overlap >= "
              f"{t['overlap']}: {'met' if t['met'] else 'not met'}; everything on: "
              f"{'met' if t['everything_on_met'] else 'not met'}", "",
              f"settle: {r.get('settle')}; FTS5 idle merge when the queries started: "
              f"{r.get('fts_merge_at_queries') or 'none (no idle merging in this code)'}, after: "
              f"{r.get('fts_merge_after_queries') or 'none'}", "",
              "| db.read by query kind (common = in at least half the memories) | queries | old p50 | old p95 | "
              "new p50 | new p95 | top-10 overlap |", "|---|---:|---:|---:|---:|---:|---:|"]
    for kind, k in r["by_kind"].items():
        o, n = k["old query, db.read"], k["new query, db.read"]
        lines.append(f"| {kind} | {k['queries']} | {o['p50_ms']} | {o['p95_ms']} | {n['p50_ms']} | {n['p95_ms']} | "
                     f"{k['overlap_top10']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k memories, 200 queries: a smoke run")
    ap.add_argument("--memories", type=int, default=None, help="memories to fill (default 100000)")
    ap.add_argument("--queries", type=int, default=None, help="recall queries per mode (default 1000)")
    ap.add_argument("--rules", type=int, default=1000, help="permission rules in the gate")
    ap.add_argument("--block", type=int, default=50,
                    help="queries a mode runs before the next mode's turn (default 50; 1: query by query)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="fill the node home under this directory once and reuse it in later runs")
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "recall.json")
    ap.add_argument("--settle-s", type=float, default=1.0,
                    help="after the fill, wait this long and then until the writer's idle FTS5 merge is done "
                         "before querying (0: query at once, beside the merge)")
    ap.add_argument("--switch-interval", type=float, default=GIL_SWITCH_INTERVAL_S,
                    help=f"GIL switch interval in seconds (default {GIL_SWITCH_INTERVAL_S}, as a running node sets)")
    args = ap.parse_args(argv)
    args.memories = args.memories or (10_000 if args.quick else 100_000)
    args.queries = args.queries or (200 if args.quick else 1_000)
    if not 1 <= args.block <= args.queries:
        ap.error(f"--block must be 1..{args.queries} (the number of queries)")
    return report_run(args, run, markdown)


if __name__ == "__main__":
    main()
