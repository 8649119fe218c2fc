"""CPU per ``Service.memory_store`` on a node home as it stands (a fresh one, or a million bench's ``--keep`` home
copied first: the probe adds memories to it), the process's and the storage writer thread's apart.

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.probes.store_cpu HOME [--stores 10000]

The million bench's node (a key, the default gate with its quota raised as the bench raises it, no hooks,
``synchronous = full``), the storage bench's corpus (another seed), 64 stores in flight. Judging the fill by CPU
per store rather than by its rate separates what grows with the store from what the machine's load does to it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from mesh import keys
from node.assemble import open_service
from node.config import NodeConfig, from_dict
from node.hooks import NoHooks
from node.node import GIL_SWITCH_INTERVAL_S
from testbed.bench.million_bench import AGENT
from testbed.bench.storage_bench import Corpus

IN_FLIGHT = 64


def thread_cpu_s(tid: int) -> float:
    """A thread's user + system CPU seconds (Linux /proc)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def config(home: Path) -> NodeConfig:
    """The million bench's node at ``home``, its key made when missing."""
    cfg = from_dict({"agent_id": AGENT, "home": str(home), "storage": {"synchronous": "full"},
                     "limits": {"max_db_bytes": 64 * 1024 ** 3, "requests_per_second": 10 ** 9},
                     "permissions": {"max_bytes_per_agent": 64 * 1024 ** 3}}, env={})
    if not cfg.keys_dir.exists() or not any(cfg.keys_dir.iterdir()):
        home.mkdir(parents=True, exist_ok=True)
        keys.generate_identity(cfg.keys_dir, AGENT)
    return cfg


async def probe(cfg: NodeConfig, stores: int) -> str:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    svc = await open_service(cfg, require_identity=True, hooks=NoHooks())
    try:
        corpus = Corpus(seed=7)
        rows = [corpus.memory(0) for _ in range(stores)]
        held = await svc.db.read(lambda c: c.execute("SELECT count(*) FROM memories").fetchone()[0])
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(r: object) -> None:
            async with sem:
                await svc.memory_store(r.content, title=r.title, namespace=r.namespace, tags=r.tags)  # type: ignore[attr-defined]

        tid = svc.db.writer_thread_id
        assert tid is not None
        w0, c0, t0 = thread_cpu_s(tid), time.process_time(), time.perf_counter()
        for start in range(0, stores, 10 * IN_FLIGHT):
            await asyncio.gather(*(one(r) for r in rows[start:start + 10 * IN_FLIGHT]))
        wall, cpu, wcpu = time.perf_counter() - t0, time.process_time() - c0, thread_cpu_s(tid) - w0
        return (f"{stores} stores onto {held:,} memories: {stores / wall:.0f}/s wall; "
                f"CPU a store {cpu / stores * 1e6:.0f} us (writer thread {wcpu / stores * 1e6:.0f} us); "
                f"commits {svc.db.commit_stats}; load {os.getloadavg()[0]:.1f}")
    finally:
        await svc.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("home", type=Path, help="a node home (created when missing; memories are added to it)")
    ap.add_argument("--stores", type=int, default=10_000)
    args = ap.parse_args(argv)
    print(asyncio.run(probe(config(args.home), args.stores)))


if __name__ == "__main__":
    main()
