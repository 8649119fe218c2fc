"""Postgres faults under a running node: what a restart, a kill -9 of the postmaster and a failover cost.

A two-node mesh of real node processes: node-1 on the Postgres backend (a primary with a synchronous streaming
standby, the DSN naming both with ``target_session_attrs=read-write``), node-2 on SQLite, its peer. Clients write
memories through node-1's local socket without pause, and one through node-2's (whose writes node-1 must take as
they arrive), while the primary is restarted (``pg_ctl restart``), ``kill -9``ed and started again, then
``kill -9``ed for good and its standby promoted. Every acknowledged write is counted; afterwards each must be
stored exactly once on node-1's database and replicated exactly once to node-2, and node-2's exactly once on
node-1. For each fault: the seconds from the server answering again (the restart or start returned, the promotion
finished) to node-1's /readyz answering 200, and from the fault to that.

    python -m testbed.bench.pg_faults [--writers 4] [--settle 2] [--out bench/out/pg_faults.json]

tests/integration/test_postgres_faults.py runs the same rig under assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from node.config import LimitsConfig
from node.errors import ServiceError
from node.mcp.socket import SocketClientBackend
from testbed.env import doctor
from testbed.env.postgres import Cluster, standby, throwaway_cluster
from testbed.mesh import LocalMesh, NodeSpec, build_layout
from testbed.paths import BENCH_OUT

# Every wait here is bounded (seconds): a node back, the peer caught up, a writer's call.
READY_WITHIN_S = 120.0
REPLICATED_WITHIN_S = 180.0
CALL_TIMEOUT_S = 60.0
POLL_S = 0.05
# node-1 retries a send soon and often: the peer was never away, only node-1's database.
RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 2.0, 5.0, 5.0, 10.0, 10.0, 30.0)
# Written in the DSN to show it never reaches a message or a log line (the test clusters trust local users).
PASSWORD = "pgfaults-secret-not-for-logs"
CONTENT_PREFIX = "pgfault"


@dataclass
class FaultResult:
    """One fault: seconds from the server answering again to /readyz 200 (``ready_after_s``) and from the fault
    to it (``down_s``); whether /readyz was seen answering 503 storage_unavailable meanwhile; the writes
    acknowledged and refused (by code) from the fault to ready."""

    fault: str
    ready_after_s: float
    down_s: float
    seen_unavailable: bool
    acked: int
    refused: dict[str, int]


@dataclass
class Tally:
    """Every write of the run: those acknowledged by node-1, and of those lost or stored twice on node-1 and on
    its peer; those acknowledged by the peer (its sends to node-1 meeting the outages), and of those lost or
    stored twice on node-1."""

    acked: int
    lost: int
    duplicated: int
    peer_lost: int
    peer_duplicated: int
    from_peer: int = 0
    from_peer_lost: int = 0
    from_peer_duplicated: int = 0
    refused: dict[str, int] = field(default_factory=dict)


class Writers:
    """``n`` clients of a node's local socket, each storing memories one after another (``interval_s`` apart: 0,
    without pause); a refused call is counted by its code and the client goes on."""

    def __init__(self, socket: Path, n: int, name: str = "writer", interval_s: float = 0.0) -> None:
        self.socket = socket
        self.n = n
        self.name = name
        self.interval_s = interval_s
        self.acked: list[str] = []
        # Each acknowledged write's call: seconds, and when it was answered (time.monotonic); [k] is acked[k]'s.
        self.latencies_s: list[float] = []
        self.acked_at: list[float] = []
        self.refused: Counter[str] = Counter()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Writers:
        self._tasks = [asyncio.create_task(self._write(i)) for i in range(self.n)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), CALL_TIMEOUT_S + 10)

    async def _write(self, i: int) -> None:
        client = await SocketClientBackend.connect(self.socket, limits=LimitsConfig(), call_timeout_s=CALL_TIMEOUT_S)
        try:
            k = 0
            while not self._stop.is_set():
                k += 1
                content = f"{CONTENT_PREFIX} {self.name} {i} write {k}"
                sent = time.monotonic()
                try:
                    await client.call("memory_store", {"content": content})
                except ServiceError as e:
                    self.refused[e.code] += 1
                    await self._pause(max(self.interval_s, 0.02))
                else:
                    self.acked.append(content)
                    self.acked_at.append(time.monotonic())
                    self.latencies_s.append(self.acked_at[-1] - sent)
                    if self.interval_s:
                        await self._pause(self.interval_s)
        finally:
            await client.close()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def more_than(self, n: int, within_s: float = READY_WITHIN_S) -> None:
        """Wait until more than ``n`` writes are acknowledged (bounded)."""
        deadline = time.monotonic() + within_s
        while len(self.acked) <= n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"writes did not go on: {len(self.acked)} acknowledged, "
                                   f"refused {dict(self.refused)}")
            await asyncio.sleep(POLL_S)


async def readyz(http: aiohttp.ClientSession, spec: NodeSpec) -> tuple[int, dict[str, Any]]:
    """node ``spec``'s /readyz: (status, body); (0, {}) when it does not answer."""
    try:
        async with http.get(f"http://127.0.0.1:{spec.health_port}/readyz") as r:
            return r.status, await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return 0, {}


def unavailable(body: dict[str, Any]) -> bool:
    return any(r.get("code") == "storage_unavailable" for r in body.get("reasons", []))


class Rig:
    """The clusters (a primary and its synchronous standby) and the two-node mesh, node-1 on Postgres."""

    def __init__(self, root: Path, primary: Cluster, replica: Cluster, dbname: str) -> None:
        self.primary = primary
        self.replica = replica
        self.dbname = dbname
        self.dsn = (f"host={primary.root},{replica.root} port={primary.port},{replica.port} user=postgres "
                    f"dbname={dbname} password={PASSWORD} target_session_attrs=read-write")
        self.layout = build_layout(root / "mesh", 2, mcp_http=False, retry_delays_s=RETRY_DELAYS_S)
        self.node, self.peer = self.layout.node(1), self.layout.node(2)
        with self.node.config_path.open("a", encoding="utf-8") as f:
            f.write(f'\n[storage]\nbackend = "postgres"\ndsn = "{self.dsn}"\n')
        self.mesh = LocalMesh(self.layout)

    @property
    def socket(self) -> Path:
        return self.node.home / "run" / "node.sock"

    @property
    def peer_socket(self) -> Path:
        return self.peer.home / "run" / "node.sock"

    def current_dsn(self) -> str:
        """A DSN of whichever server takes writes now (no password: the clusters trust local users)."""
        return (f"host={self.primary.root},{self.replica.root} user=postgres dbname={self.dbname} "
                "target_session_attrs=read-write")


@contextlib.contextmanager
def rig(root: Path) -> Iterator[Rig]:
    """A Rig with its node processes started; everything stopped and removed on exit."""
    with throwaway_cluster(synchronous_commit=True) as primary:
        dbname = primary.create_db()
        with standby(primary) as replica:
            r = Rig(root, primary, replica, dbname)
            with r.mesh:
                yield r


async def fault(r: Rig, writers: Writers, http: aiohttp.ClientSession, name: str,
                act: Callable[[], None]) -> FaultResult:
    """Run ``act`` (blocking: the fault and the server's return), then wait for node-1's /readyz 200."""
    seen = False
    acked, refused = len(writers.acked), Counter(writers.refused)
    stop = asyncio.Event()

    async def watch() -> None:
        nonlocal seen
        while not stop.is_set():
            status, body = await readyz(http, r.node)
            seen = seen or (status == 503 and unavailable(body))
            await asyncio.sleep(POLL_S)

    watcher = asyncio.create_task(watch())
    started = time.monotonic()
    try:
        await asyncio.to_thread(act)
        back = time.monotonic()
        ready = await _ready(r, http)
    finally:
        stop.set()
        await watcher
    return FaultResult(fault=name, ready_after_s=round(ready - back, 3), down_s=round(ready - started, 3),
                       seen_unavailable=seen, acked=len(writers.acked) - acked,
                       refused=dict(writers.refused - refused))


async def _ready(r: Rig, http: aiohttp.ClientSession) -> float:
    deadline = time.monotonic() + READY_WITHIN_S
    while (await readyz(http, r.node))[0] != 200:
        if time.monotonic() > deadline:
            raise TimeoutError(f"node-1 was not ready {READY_WITHIN_S:g} s after the fault")
        await asyncio.sleep(POLL_S)
    return time.monotonic()


def faults(r: Rig) -> list[tuple[str, Callable[[], None]]]:
    """The faults in order: each leaves a primary for the next."""
    def kill_and_start() -> None:
        r.primary.kill_postmaster()
        r.primary.start()

    def failover() -> None:
        r.primary.kill_postmaster()
        r.replica.promote()

    return [("restart", r.primary.restart), ("kill -9", kill_and_start), ("promotion", failover)]


async def run(r: Rig, n_writers: int = 4, settle_s: float = 2.0,
              between: Callable[[Rig, Writers], Awaitable[None]] | None = None) -> tuple[list[FaultResult], Tally]:
    """Writers through every fault (``settle_s`` of writes before each), on node-1 and (one) on its peer, whose
    writes node-1 must take as they come; ``between`` runs after the first fault (the test looks at what an
    operator sees there). Returns each fault's figures and the run's tally."""
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
        async with Writers(r.socket, n_writers) as writers, Writers(r.peer_socket, 1, "peer-writer") as sending:
            for i, (name, act) in enumerate(faults(r)):
                await writers.more_than(len(writers.acked) + 10)
                await asyncio.sleep(settle_s)
                results.append(await fault(r, writers, http, name, act))
                if i == 0 and between is not None:
                    await between(r, writers)
                await writers.more_than(len(writers.acked) + 10)
    return results, await tally(r, writers, sending)


async def tally(r: Rig, writers: Writers, sending: Writers) -> Tally:
    """Count every acknowledged write on node-1's database and on node-2's, once each has caught up."""
    deadline = time.monotonic() + REPLICATED_WITHIN_S
    while True:
        stored = await asyncio.to_thread(pg_counts, r.current_dsn())
        peer = await asyncio.to_thread(sqlite_counts, r.peer.home / "data" / "memory.db")
        caught_up = all(peer[c] for c in writers.acked) and all(stored[c] for c in sending.acked)
        if caught_up or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    return Tally(acked=len(writers.acked), lost=sum(1 for c in writers.acked if not stored[c]),
                 duplicated=sum(1 for n in stored.values() if n > 1),
                 peer_lost=sum(1 for c in writers.acked if not peer[c]),
                 peer_duplicated=sum(1 for n in peer.values() if n > 1), from_peer=len(sending.acked),
                 from_peer_lost=sum(1 for c in sending.acked if not stored[c]),
                 from_peer_duplicated=sum(1 for c in sending.acked if stored[c] > 1), refused=dict(writers.refused))


def pg_counts(dsn: str) -> Counter[str]:
    """The run's memories stored in the database at ``dsn``: content -> rows."""
    with psycopg.connect(dsn) as c:
        return Counter({content: n for content, n in c.execute(
            "SELECT content, count(*) FROM memories WHERE content LIKE %s GROUP BY content",
            (f"{CONTENT_PREFIX} %",)).fetchall()})


def sqlite_counts(path: Path) -> Counter[str]:
    """The run's memories stored in the SQLite file at ``path`` (read-only, beside its node): content -> rows."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return Counter({content: n for content, n in conn.execute(
            "SELECT content, count(*) FROM memories WHERE content LIKE ? GROUP BY content",
            (f"{CONTENT_PREFIX} %",)).fetchall()})
    finally:
        conn.close()


def table(results: list[FaultResult], t: Tally) -> str:
    lines = ["| fault | ready after the server is back (s) | fault to ready (s) | 503 seen | acked meanwhile | "
             "refused meanwhile |", "|---|---|---|---|---|---|"]
    for f in results:
        lines.append(f"| {f.fault} | {f.ready_after_s} | {f.down_s} | {f.seen_unavailable} | {f.acked} | "
                     f"{f.refused or '-'} |")
    lines += ["", f"writes acknowledged {t.acked}, lost {t.lost}, duplicated {t.duplicated}; on the peer lost "
                  f"{t.peer_lost}, duplicated {t.peer_duplicated}; refused {t.refused or '-'}",
              f"the peer's writes sent to the node meanwhile {t.from_peer}, lost {t.from_peer_lost}, duplicated "
              f"{t.from_peer_duplicated}"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, default=4, help="concurrent clients of the node's socket (default 4)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of writes before each fault (default 2)")
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "pg_faults.json")
    args = ap.parse_args()
    if reason := doctor.missing("postgres"):
        print(reason, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pgf-") as tmp, rig(Path(tmp)) as r:
        results, t = asyncio.run(run(r, args.writers, args.settle))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"faults": [asdict(f) for f in results], "tally": asdict(t)}, indent=2))
    print(table(results, t))
    bad = (t.lost, t.duplicated, t.peer_lost, t.peer_duplicated, t.from_peer_lost, t.from_peer_duplicated)
    return 0 if not any(bad) else 1


if __name__ == "__main__":
    sys.exit(main())
