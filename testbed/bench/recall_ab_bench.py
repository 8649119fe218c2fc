"""Recall on a kept 100k home, this tree against an older commit, in one run: the same results, and the time.

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.recall_ab_bench --db KEPT/home/data/memory.db
        [--base 9de86fc] [--rounds 6]

``KEPT`` is a home filled once by ``python -m testbed.bench.recall_bench --keep KEPT``. Each child process opens the
database as a reader does (read-only, mmap, in-memory temp store), recalls the recall bench's 1,000 queries
once to warm its caches and its DocFreqs, then times each query once more (``memories.recall``, limit 10,
direct SQL on the child's thread). The code at ``--base`` and this tree's take turns (ab.py here). Prints
p50 / p95 / p99 per query kind (every word rare, rare and common, every word common) and over all queries,
the ratio of this tree's p50 and p95 to the base's, and whether both trees gave the same ids and scores for
every query.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

from storage import memories
from testbed.bench.ab import alternate, base_parser, pct
from testbed.bench.storage_bench import Corpus

KINDS = ("every word rare", "rare and common", "every word common")


def child(db: Path) -> dict[str, object]:
    corpus = Corpus()
    queries = [corpus.query() for _ in range(1000)]  # drawn as the recall bench draws them
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA mmap_size=268435456")
    conn.execute("PRAGMA temp_store=memory")
    df = memories.DocFreqs()
    answers = [[(m.id, s) for m, s in memories.recall(conn, q, 10, None, df)] for q in queries]
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for q in queries:
        common = df.common(conn, memories.fts_tokens(q))
        kind = KINDS[2] if all(common) else KINDS[1] if any(common) else KINDS[0]
        t = time.perf_counter()
        memories.recall(conn, q, 10, None, df)
        times[kind].append((time.perf_counter() - t) * 1e3)
    conn.close()
    digest = hashlib.sha256(json.dumps(answers).encode()).hexdigest()
    return {"times": times, "answers": digest}


def main() -> int:
    p = base_parser(__doc__, "9de86fc", 6)
    p.add_argument("--db", type=Path, required=True,
                   help="memory.db of a home kept by testbed.bench.recall_bench --keep")
    args = p.parse_args()
    if not args.db.is_file():
        p.error(f"--db {args.db}: no such file (fill one with: "
                ".venv/bin/python -m testbed.bench.recall_bench --keep DIR)")
    if args.child:
        print(json.dumps(child(args.db)))
        return 0
    if not 1 <= args.rounds <= 50:
        p.error("--rounds must be 1..50")
    runs = alternate(args.base, args.rounds, "testbed.bench.recall_ab_bench", ["--db", str(args.db.resolve())])
    if runs is None:
        return 2
    times = {name: {k: sorted(x for got in outs for x in got["times"][k]) for k in KINDS}
             for name, outs in runs.items()}
    digests = {got["answers"] for outs in runs.values() for got in outs}
    print(f"`.venv/bin/python -m testbed.bench.recall_ab_bench --db {args.db} --base {args.base} "
          f"--rounds {args.rounds}` "
          f"({os.cpu_count()} CPUs)\n")
    print("| queries | n | base p50 / p95 / p99 (ms) | this tree p50 / p95 / p99 (ms) | p50, p95 this tree / base |")
    print("|---|---:|---|---|---|")
    for kind in (*KINDS, "all"):
        b, t = ((sorted(x for k in KINDS for x in times[name][k]) if kind == "all" else times[name][kind])
                for name in ("base", "this tree"))
        if not b or not t:
            continue
        fb, ft = ([pct(v, q) for q in (50, 95, 99)] for v in (b, t))
        print(f"| {kind} | {len(t) // args.rounds} | {' / '.join(f'{x:.2f}' for x in fb)} | "
              f"{' / '.join(f'{x:.2f}' for x in ft)} | {ft[0] / fb[0]:.2f}×, {ft[1] / fb[1]:.2f}× |")
    same = len(digests) == 1
    print(f"\nSame ids and scores for every query in every child of both trees: {'yes' if same else '**no**'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
