"""Migrate benchmark: ``ai-memory migrate``'s move of a store of 100k memories, 100k links and their audit events
from SQLite to Postgres and back, several runs, p50/p95/p99 of the whole move and rows/s per table.

    .venv/bin/python -m testbed.bench.migrate_bench [--quick] [--runs 5] [--batch-rows N] [--out bench/out/migrate.json]

The store is filled once through the storage layer's batch paths (write jobs of LOAD_CHUNK memories or links,
each with its audit events and change-log entries, as the node writes them: ``memories.insert``,
``links.insert_many``, ``events.append_many``, ``changelog.append_many``). The same rows are written into an
empty Postgres database the same way: that fill, timed, is the baseline each direction's move is set against (how
long the node's own write path takes to put this store into Postgres). Then each run moves the SQLite store into
a fresh Postgres database and that one back into a fresh SQLite file (``storage.port.migrate``, what the command
runs, with the run's final comparison: counts per table, the chain heads, the target's chain walked), each checked
``ok``. Postgres is a throwaway cluster this script starts (Unix socket), with fsync turned on as a real server
has it. Everything runs on this machine's 2 cores: the copying process and the server share them.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from storage import Database, changelog, events, links, memories
from storage.backend import open_database
from storage.links import LinkRow
from storage.port import BATCH_ROWS, Progress, Report, migrate
from storage.portsides import Store
from testbed.bench.figures import pct, save
from testbed.bench.storage_bench import Corpus
from testbed.env.postgres import Cluster, server_binaries_present, throwaway_cluster
from testbed.paths import BENCH_OUT

SEED = 31
T0 = 1_700_000_000_000
# Rows per write job while filling (one transaction each, as a node's batch paths write them).
LOAD_CHUNK = 2_000
RELATIONS = ("related_to", "derived_from", "contradicts", "supports")


@dataclass(frozen=True)
class Sizes:
    memories: int
    links: int
    runs: int


FULL = Sizes(memories=100_000, links=100_000, runs=5)
QUICK = Sizes(memories=10_000, links=10_000, runs=3)



def summary(samples: list[float]) -> dict[str, float]:
    return {"p50": round(pct(samples, 50), 2), "p95": round(pct(samples, 95), 2), "p99": round(pct(samples, 99), 2),
            "mean": round(statistics.fmean(samples), 2), "runs": len(samples)}


# ---- the store ---------------------------------------------------------------------------------------

def _signature(rng: random.Random) -> bytes:
    return rng.randbytes(64)  # the copy moves bytes: a real Ed25519 signature is 64 of them too


def _memory_job(conn: Any, rows: list[memories.MemoryRow], rng: random.Random) -> None:
    for m in rows:
        memories.insert(conn, m)
    events.append_many(conn, "memory", [(None, m.origin, rng.randbytes(32).hex(), m.signature, m.created_at)
                                        for m in rows])
    changelog.append_many(conn, "memory", [(m.id, m.version, m.created_at) for m in rows])


def _link_job(conn: Any, rows: list[LinkRow]) -> None:
    links.insert_many(conn, rows)
    events.append_many(conn, "link", [(r.link_id, r.observed_by, r.link_id, r.signature, r.created_at)
                                      for r in rows])
    changelog.append_many(conn, "link", [(r.link_id, 1, r.created_at) for r in rows])


def store_rows(sizes: Sizes) -> tuple[list[memories.MemoryRow], list[LinkRow]]:
    """The fixed-seed store: signed-looking memories of a Zipf vocabulary, and links between them."""
    corpus, rng = Corpus(SEED), random.Random(SEED)
    mems = []
    for i in range(sizes.memories):
        m = corpus.memory(T0 + i, origin="ai:bench@local")
        mems.append(memories.MemoryRow(**{**{f: getattr(m, f) for f in m.__dataclass_fields__},
                                          "signature": _signature(rng), "signed_by": "ai:bench@local",
                                          "attest_level": "self_signed", "signed_set": 2}))
    ids = [m.id for m in mems]
    rows = [LinkRow(link_id=uuid.UUID(int=rng.getrandbits(128)).hex * 2, src_id=ids[rng.randrange(len(ids))],
                    dst_id=ids[rng.randrange(len(ids))], relation=RELATIONS[n % 4], observed_by="ai:bench@local",
                    valid_from=T0 + n, confidence=0.9, signature=_signature(rng), attest_level="self_signed",
                    signed_by="ai:bench@local", created_at=T0 + n) for n in range(sizes.links)]
    return mems, rows


async def fill(db: Database, mems: list[memories.MemoryRow], rows: list[LinkRow]) -> float:
    """Write the store through the storage layer's batch paths; the seconds it took."""
    rng = random.Random(SEED + 1)
    t = time.perf_counter()
    for i in range(0, len(mems), LOAD_CHUNK):
        await db.write(_memory_job, mems[i:i + LOAD_CHUNK], rng)
    for i in range(0, len(rows), LOAD_CHUNK):
        await db.write(_link_job, rows[i:i + LOAD_CHUNK])
    return time.perf_counter() - t


# ---- the moves -----------------------------------------------------------------------------------------

class Rates:
    """Each table's rows/s as the copy reports it when the table is done."""

    def __init__(self) -> None:
        self.rows_per_s: dict[str, float] = {}

    def __call__(self, p: Progress) -> None:
        if p.finished and p.copied:
            self.rows_per_s[p.table] = p.copied / max(p.seconds, 1e-9)


async def move(source: Store, target: Store, batch_rows: int) -> tuple[Report, dict[str, float]]:
    rates = Rates()
    report = await migrate(source, target, observer=rates, batch_rows=batch_rows)
    if not report.ok:
        raise SystemExit(f"the move {source.where()} -> {target.where()} did not compare equal: {report.as_dict()}")
    return report, rates.rows_per_s


def fsync_on(cluster: Cluster) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        c.execute("ALTER SYSTEM SET fsync = on")
        c.execute("SELECT pg_reload_conf()")


async def run(sizes: Sizes, tmp: Path, cluster: Cluster, batch_rows: int,
              say: Callable[[str], None]) -> dict[str, Any]:
    mems, rows = store_rows(sizes)
    sqlite_src = Store("sqlite", tmp / "source.db")
    fill_s: dict[str, float] = {}
    for name, store in (("sqlite", sqlite_src), ("postgres", Store("postgres", dsn=cluster.dsn(cluster.create_db())))):
        db = await open_database(backend=store.engine, path=store.path, dsn=store.dsn)
        try:
            fill_s[name] = await fill(db, mems, rows)
        finally:
            await db.close()
        say(f"fill {name} through the storage layer: {fill_s[name]:.1f} s")
    times: dict[str, list[float]] = {"sqlite_to_postgres": [], "postgres_to_sqlite": []}
    rates: dict[str, list[dict[str, float]]] = {k: [] for k in times}
    rows_moved = 0
    for n in range(sizes.runs):
        name = cluster.create_db()
        pg = Store("postgres", dsn=cluster.dsn(name))
        back = Store("sqlite", tmp / f"back-{n}.db")
        for direction, (src, dst) in (("sqlite_to_postgres", (sqlite_src, pg)), ("postgres_to_sqlite", (pg, back))):
            report, per_table = await move(src, dst, batch_rows)
            times[direction].append(report.seconds)
            rates[direction].append(per_table)
            rows_moved = sum(t.target for t in report.tables)
            say(f"run {n + 1}: {direction} {report.seconds:.2f} s, {rows_moved} rows, ok")
        cluster.drop_db(name)
        await asyncio.to_thread(_remove, back.path)
    out: dict[str, Any] = {"rows": rows_moved, "fill_s": {k: round(v, 2) for k, v in fill_s.items()}}
    for direction, samples in times.items():
        baseline = fill_s["postgres" if direction == "sqlite_to_postgres" else "sqlite"]
        per_table = {t: round(statistics.median(r[t] for r in rates[direction] if t in r))
                     for t in rates[direction][0]}
        out[direction] = {"seconds": summary(samples), "rows_per_s": round(rows_moved / pct(samples, 50)),
                          "vs_fill_p50": round(pct(samples, 50) / baseline, 3), "per_table_rows_per_s": per_table}
    return out


def _remove(path: Path) -> None:
    for end in ("", "-wal", "-shm"):
        Path(f"{path}{end}").unlink(missing_ok=True)


def table(res: dict[str, Any]) -> str:
    lines = [f"{res['rows']} rows ({res['sizes']['memories']} memories, {res['sizes']['links']} links, their audit "
             f"events and change-log entries); baseline: the storage layer's fill of the same rows "
             f"(SQLite {res['fill_s']['sqlite']} s, Postgres {res['fill_s']['postgres']} s)", "",
             "| direction | p50 s | p95 s | p99 s | rows/s at p50 | p50 / fill of the target engine |",
             "|---|---|---|---|---|---|"]
    for d in ("sqlite_to_postgres", "postgres_to_sqlite"):
        s = res[d]["seconds"]
        lines.append(f"| {d.replace('_', ' ')} | {s['p50']} | {s['p95']} | {s['p99']} | {res[d]['rows_per_s']} | "
                     f"{res[d]['vs_fill_p50']} |")
    lines += ["", "| table | rows/s SQLite -> Postgres (p50) | rows/s Postgres -> SQLite (p50) |", "|---|---|---|"]
    to_pg, to_sq = res["sqlite_to_postgres"]["per_table_rows_per_s"], res["postgres_to_sqlite"]["per_table_rows_per_s"]
    for t in to_pg:
        lines.append(f"| {t} | {to_pg[t]} | {to_sq.get(t, '-')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k memories and links, 3 runs (a smoke run)")
    ap.add_argument("--runs", type=int, help="runs of the move each way (default 5; --quick 3)")
    ap.add_argument("--batch-rows", type=int, default=BATCH_ROWS, help="rows per batch (default: the command's)")
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "migrate.json")
    args = ap.parse_args()
    if not server_binaries_present():
        print("PostgreSQL 15 server binaries are missing: apt-get install -y postgresql-15", file=sys.stderr)
        return 2
    sizes = QUICK if args.quick else FULL
    if args.runs:
        sizes = Sizes(sizes.memories, sizes.links, args.runs)
    with tempfile.TemporaryDirectory(prefix="migrate-bench-") as tmp, throwaway_cluster() as cluster:
        fsync_on(cluster)
        res = asyncio.run(run(sizes, Path(tmp), cluster, args.batch_rows, lambda s: print(s, flush=True)))
    res["sizes"] = sizes.__dict__
    res["batch_rows"] = args.batch_rows
    save(res, args.out)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
