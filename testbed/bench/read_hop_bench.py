"""The hand-off of ``Database.read``: to a reader thread and back, with nothing to read, in one run.

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.read_hop_bench [--calls 20000]
        [--db KEPT/home/data/memory.db]

Every recall hops from the event loop to a reader thread and back. Ways of making that hop, on the
same open database (a real SQLite file), the same reader function (``Database._run_read``: its thread's
read-only connection, BEGIN, the job, ROLLBACK) and the same uvloop loop, taking turns in blocks of
BLOCK calls (a node uses one way all the time, and which way ran just before moves a call-by-call
comparison: a thread idle for one call wakes faster than one idle for two):

- ``Database.read``: ``run_in_executor`` on its ThreadPoolExecutor of two readers, as the node does (for
  reads one after another the executor keeps to one thread, so to one connection);
- a lighter hand-off (not the node's): reader threads taking (future, fn, args) from one
  SimpleQueue and settling the asyncio future with one ``call_soon_threadsafe``, with two threads (which
  take reads one after another in turn) and with one.

The job does nothing (``lambda conn: None``), so what is timed is the hop, BEGIN and ROLLBACK; with ``--db``
(the database of a home kept by ``testbed.bench.recall_bench --keep``) it is ``memories.recall`` of the recall bench's
queries in turn (limit 10, one shared DocFreqs), so each block runs every query once per way. The node's
GIL switch interval is set as a running node sets it. Prints p50 / p95 / p99 per way and the ratios.
The queue's threads open their own reader connections, as ``Database``'s do.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from node.node import GIL_SWITCH_INTERVAL_S
from storage import Database, memories
from testbed.bench.storage_bench import Corpus, summarize

BLOCK = 1_000


def nothing(conn: Any) -> None:
    return None


class QueueReaders:
    """The lighter hand-off: ``n`` threads on one SimpleQueue, each result back by one call_soon_threadsafe."""

    def __init__(self, n: int, run: Callable[[Callable[..., Any], tuple[Any, ...]], Any]) -> None:
        self._run = run
        self._jobs: queue.SimpleQueue[tuple[asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._main, daemon=True) for _ in range(n)]
        for t in self._threads:
            t.start()

    def read(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.put((fut, fn, args))
        return fut

    def stop(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            fut, fn, args = job
            result = self._run(fn, args)
            fut.get_loop().call_soon_threadsafe(fut.set_result, result)


async def run(calls: int, db_path: Path | None) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="read-hop-") as tmp:
        db = await Database.open(db_path or Path(tmp) / "memory.db")
        run_read = db._run_read  # noqa: SLF001 - the very reader function Database.read runs
        two, one = QueueReaders(2, run_read), QueueReaders(1, run_read)
        if db_path is None:
            jobs: list[tuple[Any, ...]] = [(nothing,)]
        else:
            corpus, df = Corpus(), memories.DocFreqs()
            jobs = [(memories.recall, corpus.query(), 10, None, df) for _ in range(BLOCK)]
        turn = {"i": 0}

        def job() -> tuple[Any, ...]:
            turn["i"] += 1
            return jobs[turn["i"] % len(jobs)]

        ways = {
            "Database.read (run_in_executor)": lambda: db.read(*job()),
            "SimpleQueue, two threads": lambda: two.read(*job()),
            "SimpleQueue, one thread": lambda: one.read(*job()),
        }
        samples: dict[str, list[float]] = {name: [] for name in ways}
        try:
            for name in ways:  # warm: both pools' threads and their connections
                for _ in range(200):
                    await ways[name]()
            names = list(ways)
            for r in range(max(1, calls // BLOCK)):
                for k in range(len(names)):
                    name = names[(r + k) % len(names)]
                    for _ in range(min(BLOCK, calls)):
                        t0 = time.perf_counter()
                        await ways[name]()
                        samples[name].append(time.perf_counter() - t0)
        finally:
            two.stop()
            one.stop()
            await db.close()
    return {name: summarize(s) for name, s in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20_000, help="calls per way (default 20000)")
    ap.add_argument("--db", type=Path, default=None, help="a kept recall-bench database: time recalls, not no-ops")
    args = ap.parse_args()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    stats = uvloop.run(run(args.calls, args.db))
    what = "a no-op read" if args.db is None else f"recall over {args.db}"
    print(f"### Database.read hand-off ({args.calls} calls each, {what})\n")
    print("| way | p50 ms | p95 ms | p99 ms |\n|---|---:|---:|---:|")
    for name, s in stats.items():
        print(f"| {name} | {s['p50_ms']} | {s['p95_ms']} | {s['p99_ms']} |")
    old = stats["Database.read (run_in_executor)"]
    for name, new in stats.items():
        if new is not old:
            print(f"\n{name} / Database.read: p50 {new['p50_ms'] / old['p50_ms']:.2f}x, "
                  f"p95 {new['p95_ms'] / old['p95_ms']:.2f}x, p99 {new['p99_ms'] / old['p99_ms']:.2f}x")


if __name__ == "__main__":
    main()
