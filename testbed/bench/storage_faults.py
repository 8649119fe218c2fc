"""Storage faults across a mesh: Postgres restarted, ``kill -9``ed and failed over under one node while another
node's disk fills, with clients writing on every node; what each fault costs and what is lost (nothing).

Three real node processes: node-1 on the Postgres backend (a primary with a synchronous streaming standby, the
DSN naming both with ``target_session_attrs=read-write``: testbed/bench/pg_faults.py's servers), node-2 on SQLite
with its home on a small tmpfs this run mounts, node-3 on SQLite. Clients write memories through every node's
local socket at a steady ``--rate`` (writes a second per node; each memory is shared with every peer, so each is
stored three times) while, round after round, these faults come one after another (each after ``--settle``
seconds of writes):

- ``pg restart``: node-1's primary restarted (``pg_ctl restart``);
- ``pg kill -9``: its postmaster ``kill -9``ed, then started (crash recovery);
- ``disk full``: node-2's filesystem filled (writes refused ``storage_full``, /readyz 503), ``--hold`` seconds,
  then the filler removed;
- ``both``: node-2's disk filled and, while it is full, node-1's primary stopped (its database away); ``--hold``
  seconds with both, then the server started and the space freed at the same moment;
- ``pg promotion``: the primary ``kill -9``ed for good and its standby promoted; the old primary is then made a
  standby of the new one (a new base backup, untimed), so the next round fails over back.

For each fault and node: the seconds from the fault being over (the server answering again, the space freed) to
that node's /readyz answering 200 (``ready_after_s``), and from the fault's start to that (``down_s``, its
duration); p50 / p95 (nearest rank) over the rounds; the latency of that node's acknowledged writes whose call
overlapped the fault against its writes that overlapped none (p50 / p95 / p99 and the ratios: the same-run
baseline). Afterwards (once the peers have caught up, bounded) every acknowledged write must be stored exactly
once on its own node and exactly once on each of its two peers; the figures, per fault (the writes acknowledged
on any node while it lasted) and per node: writes acknowledged, lost, duplicated, the refusals by code, the
times each node's log says a condition began and ended.

    python -m testbed.bench.storage_faults [--rounds 3] [--writers 2] [--rate 20] [--settle 2] [--hold 2]
                                           [--tmpfs-mb 256] [--out bench/out/storage_faults.json]

Needs root (to mount the tmpfs) and PostgreSQL 15; refuses with the reason otherwise (exit 2). The tmpfs is
unmounted and every process stopped on the way out, whatever happened. Writes the JSON to ``--out`` and the
markdown table beside it (``.md``), one line per fault to stderr as it ends; exit 1 when a write was lost or
duplicated, a node exited or a SQLite file is damaged. The fault tests (tests/node/test_disk_full.py,
tests/integration/test_postgres_faults.py) pin each fault on its own under assertions; this run is not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from testbed.bench.figures import percentile
from testbed.bench.pg_faults import (
    PASSWORD,
    RETRY_DELAYS_S,
    Writers,
    pg_counts,
    readyz,
    sqlite_counts,
)
from testbed.env import disk, doctor
from testbed.env.postgres import Cluster, rebuild_standby, standby, throwaway_cluster
from testbed.errors import TestbedError
from testbed.mesh import LocalMesh, MeshLayout, NodeSpec, build_layout
from testbed.paths import BENCH_OUT

PG_NODE, FULL_NODE, PLAIN_NODE = 1, 2, 3
NODES = (PG_NODE, FULL_NODE, PLAIN_NODE)
UNAVAILABLE, FULL = "storage_unavailable", "storage_full"
FAULTS = ("pg restart", "pg kill -9", "disk full", "both", "pg promotion")
# Every wait is bounded (seconds): a condition shown, a node ready again, writes going on, the peers caught up.
SEEN_WITHIN_S = 60.0
READY_WITHIN_S = 120.0
REPLICATED_WITHIN_S = 300.0
POLL_S = 0.05
# Room on node-2's tmpfs for its home and every memory of a run (about 2 KB each, replicas included): filling it
# writes that much into memory once per fault, and the run needs it free.
TMPFS_MB = 256
FILLER = "filler"
# The log lines that say when a store's condition began and ended (once each, never once per refused call).
CONDITION_EVENTS = ("storage_unavailable", "storage_available", "storage_full", "storage_space_available")


@dataclass
class FaultResult:
    """One fault on one node in one round: seconds from the fault being over to /readyz 200 (``ready_after_s``)
    and from its start (``down_s``); whether /readyz was seen answering 503 with ``code`` meanwhile; the node's
    writes acknowledged and refused (by code) from the fault's start to ready."""

    fault: str
    round: int
    node: int
    code: str
    ready_after_s: float
    down_s: float
    seen: bool
    acked: int
    refused: dict[str, int]


@dataclass
class Summary:
    """A fault on a node over its rounds: p50 / p95 (nearest rank) of ready_after_s and down_s."""

    fault: str
    node: int
    rounds: int
    ready_after_p50_s: float
    ready_after_p95_s: float
    down_p50_s: float
    down_p95_s: float
    seen_every_round: bool
    refused: dict[str, int]


@dataclass
class NodeTally:
    """One node's writes: acknowledged; of those not stored on it, or stored there more than once; not stored, or
    stored more than once, on a peer (counted once per peer); the calls refused, by code."""

    node: int
    acked: int
    lost: int
    duplicated: int
    replica_lost: int
    replica_duplicated: int
    refused: dict[str, int]


@dataclass
class Window:
    """A fault's time, from its start to every node it struck answering /readyz 200 again (``began``, ``ended``:
    time.monotonic): the slice of each node's acknowledged writes that came in it (``spans``: node -> [start, end)
    in its writers' list) and the calls refused meanwhile on any node, by code."""

    fault: str
    round: int
    began: float
    ended: float
    spans: dict[int, tuple[int, int]]
    refused: dict[str, int]


@dataclass
class FaultTally:
    """A fault over its rounds: the writes acknowledged on any node while it lasted; of those, the writes missing
    afterwards on a node that should hold them (their own or a peer), and those stored more than once on one;
    the calls refused meanwhile, by code."""

    fault: str
    rounds: int
    acked: int
    lost: int
    duplicated: int
    refused: dict[str, int]


@dataclass
class Latency:
    """Acknowledged writes' calls: how many, p50 / p95 / p99 (nearest rank), ms."""

    samples: int
    p50_ms: float
    p95_ms: float
    p99_ms: float


@dataclass
class LatencyRow:
    """A fault on a node it struck: that node's acknowledged writes whose call overlapped the fault (all rounds)
    against the same node's writes whose call overlapped no fault of the run (the same-run baseline), and the
    ratios."""

    fault: str
    node: int
    during: Latency
    healthy: Latency
    p50_ratio: float
    p99_ratio: float


@dataclass
class Tally:
    """The run's writes (``lost`` and ``duplicated`` count every store: a write's own node and each peer); every
    stored memory of the run found more than once on a node, acknowledged or not (``stored_twice``); the
    condition log lines by node; the SQLite files' quick_check; the node processes that exited."""

    acked: int
    lost: int
    duplicated: int
    stored_twice: int
    nodes: list[NodeTally]
    faults: list[FaultTally]
    latencies: list[LatencyRow]
    refused: dict[str, int]
    log_events: dict[int, dict[str, int]]
    quick_check: dict[int, str]
    exited: list[int] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.stored_twice or self.exited) and all(
            v == "ok" for v in self.quick_check.values())


# ---- the rig ------------------------------------------------------------------------------------------------------

class StorageRig:
    """The two servers (``servers[0]`` takes writes: the roles swap at each promotion) and the three-node mesh,
    node-1 on Postgres, node-2's home on a tmpfs, node-3 on SQLite; the mesh's processes in ``mesh``."""

    def __init__(self, layout: MeshLayout, servers: list[Cluster], dbname: str) -> None:
        self.layout = layout
        self.servers = servers
        self.dbname = dbname
        self.mesh = LocalMesh(layout)

    @property
    def primary(self) -> Cluster:
        return self.servers[0]

    def node(self, index: int) -> NodeSpec:
        return self.layout.node(index)

    def socket(self, index: int) -> Path:
        return self.node(index).home / "run" / "node.sock"

    @property
    def filler(self) -> Path:
        return self.node(FULL_NODE).home / FILLER

    def current_dsn(self) -> str:
        """A DSN of whichever server takes writes now (no password: the clusters trust local users)."""
        hosts = ",".join(str(c.root) for c in self.servers)
        return f"host={hosts} user=postgres dbname={self.dbname} target_session_attrs=read-write"

    # ---- the faults (blocking: run in a thread) ----

    def fill(self) -> None:
        disk.fill(self.filler)

    def free(self) -> None:
        self.filler.unlink()

    def kill_and_start(self) -> None:
        self.primary.kill_postmaster()
        self.primary.start()

    def fail_over(self) -> None:
        """kill -9 of the primary and its standby promoted: the roles swap."""
        self.primary.kill_postmaster()
        self.servers[1].promote()
        self.servers.reverse()

    def rebuild_standby(self) -> None:
        """The primary failed over from, made a synchronous standby of the new one (so the next round can fail
        over again)."""
        rebuild_standby(self.servers[1], self.primary)


@contextlib.contextmanager
def storage_rig(root: Path, *, tmpfs_bytes: int = TMPFS_MB << 20) -> Iterator[StorageRig]:
    """A StorageRig with its node processes started; everything stopped, unmounted and removed on exit. Raises
    TestbedError ``tmpfs_refused`` before anything starts where the tmpfs cannot be mounted."""
    layout = build_layout(root / "mesh", 3, mcp_http=False, retry_delays_s=RETRY_DELAYS_S)
    home = layout.node(FULL_NODE).home
    built = home.with_name(home.name + ".built")
    home.rename(built)
    with disk.tmpfs(home, tmpfs_bytes):
        shutil.copytree(built, home, dirs_exist_ok=True)
        shutil.rmtree(built)
        # Its log beside the tmpfs, as journald would hold it: the lines of a full disk are kept.
        (home / "node.log").symlink_to(root / "node-2.log")
        with throwaway_cluster(synchronous_commit=True) as primary:
            dbname = primary.create_db()
            with standby(primary) as replica:
                rig = StorageRig(layout, [primary, replica], dbname)
                dsn = (f"host={primary.root},{replica.root} port={primary.port},{replica.port} user=postgres "
                       f"dbname={dbname} password={PASSWORD} target_session_attrs=read-write")
                with layout.node(PG_NODE).config_path.open("a", encoding="utf-8") as f:
                    f.write(f'\n[storage]\nbackend = "postgres"\ndsn = "{dsn}"\n')
                with rig.mesh:
                    yield rig


# ---- watching readiness -------------------------------------------------------------------------------------------

class ReadyWatch:
    """Polls every node's /readyz all along and keeps each change: (time, status, reason codes) per node."""

    def __init__(self, rig: StorageRig, http: aiohttp.ClientSession) -> None:
        self.rig = rig
        self.http = http
        self.changes: dict[int, list[tuple[float, int, frozenset[str]]]] = {i: [] for i in NODES}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ReadyWatch:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 10.0)

    async def _watch(self) -> None:
        while not self._stop.is_set():
            for i in NODES:
                status, body = await readyz(self.http, self.rig.node(i))
                codes = frozenset(str(r.get("code")) for r in body.get("reasons", []))
                if not self.changes[i] or self.changes[i][-1][1:] != (status, codes):
                    self.changes[i].append((time.monotonic(), status, codes))
            await asyncio.sleep(POLL_S)

    def saw(self, node: int, code: str, since: float, until: float = float("inf")) -> bool:
        """Whether node's /readyz answered 503 with ``code`` at some time in [since, until]."""
        changes = self.changes[node]
        for k, (t, status, codes) in enumerate(changes):
            ends = changes[k + 1][0] if k + 1 < len(changes) else float("inf")
            if status == 503 and code in codes and t <= until and ends >= since:
                return True
        return False

    def outages(self, node: int) -> list[str]:
        """Each spell of node's /readyz answering other than 200: its reason codes (0: no answer)."""
        spells: list[set[str]] = []
        was_ready = True
        for _, status, codes in self.changes[node]:
            if status != 200:
                if was_ready:
                    spells.append(set())
                spells[-1] |= codes or {str(status)}
            was_ready = status == 200
        return ["+".join(sorted(codes)) for codes in spells]

    async def until(self, node: int, code: str, since: float) -> None:
        """Wait (bounded) until node's /readyz has answered 503 with ``code`` since ``since``."""
        deadline = time.monotonic() + SEEN_WITHIN_S
        while not self.saw(node, code, since):
            if time.monotonic() > deadline:
                raise TimeoutError(f"node-{node} never answered /readyz 503 {code} within {SEEN_WITHIN_S:g} s")
            await asyncio.sleep(POLL_S)


async def ready_at(http: aiohttp.ClientSession, spec: NodeSpec) -> float:
    """Wait (bounded) until node ``spec``'s /readyz answers 200; the monotonic time it did."""
    deadline = time.monotonic() + READY_WITHIN_S
    while (await readyz(http, spec))[0] != 200:
        if time.monotonic() > deadline:
            raise TimeoutError(f"node-{spec.index} was not ready {READY_WITHIN_S:g} s after the fault")
        await asyncio.sleep(POLL_S)
    return time.monotonic()


# ---- the faults ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Leg:
    """One fault on one node: ``begin`` brings it on (None: ``end`` does it whole, as a restart does); ``end``
    returns once it is over (the server answering again, the space freed); ``code``: /readyz's reason meanwhile."""

    node: int
    code: str
    end: Callable[[], None]
    begin: Callable[[], None] | None = None


def legs(rig: StorageRig, name: str) -> list[Leg]:
    """The legs of fault ``name`` (one of FAULTS) on the rig as it is now (which server is the primary)."""
    primary = rig.primary
    if name == "pg restart":
        return [Leg(PG_NODE, UNAVAILABLE, primary.restart)]
    if name == "pg kill -9":
        return [Leg(PG_NODE, UNAVAILABLE, rig.kill_and_start)]
    if name == "pg promotion":
        return [Leg(PG_NODE, UNAVAILABLE, rig.fail_over)]
    if name == "disk full":
        return [Leg(FULL_NODE, FULL, rig.free, rig.fill)]
    if name == "both":
        return [Leg(FULL_NODE, FULL, rig.free, rig.fill), Leg(PG_NODE, UNAVAILABLE, primary.start, primary.stop)]
    raise ValueError(f"unknown fault {name!r}; the faults: {', '.join(FAULTS)}")


class Run:
    """The writers on every node and the readiness watch, through the faults of a run."""

    def __init__(self, rig: StorageRig, http: aiohttp.ClientSession, writers: dict[int, Writers],
                 watch: ReadyWatch, hold_s: float) -> None:
        self.rig = rig
        self.http = http
        self.writers = writers
        self.watch = watch
        self.hold_s = hold_s
        self.windows: list[Window] = []

    async def writes_go_on(self) -> None:
        """Wait (bounded) until every node has acknowledged 10 more writes."""
        await asyncio.gather(*(w.more_than(len(w.acked) + 10) for w in self.writers.values()))

    async def fault(self, name: str, round_: int) -> list[FaultResult]:
        """Bring fault ``name``'s legs on one after another (each seen on /readyz), ``hold_s``, end them at once,
        and wait for each node to be ready again. A leg's duration runs from its own start."""
        fault_legs = legs(self.rig, name)
        fault_began = time.monotonic()
        before = {i: (len(w.acked), Counter(w.refused)) for i, w in self.writers.items()}
        began: dict[int, float] = {}
        for leg in fault_legs:
            if leg.begin is not None:
                began[leg.node] = time.monotonic()
                await asyncio.to_thread(leg.begin)
                await self.watch.until(leg.node, leg.code, began[leg.node])
        if began:
            await asyncio.sleep(self.hold_s)

        async def finish(leg: Leg) -> FaultResult:
            started = began.get(leg.node, time.monotonic())
            await asyncio.to_thread(leg.end)
            over = time.monotonic()
            ready = await ready_at(self.http, self.rig.node(leg.node))
            w = self.writers[leg.node]
            acked, refused = before[leg.node]
            return FaultResult(fault=name, round=round_, node=leg.node, code=leg.code,
                               ready_after_s=round(ready - over, 3), down_s=round(ready - started, 3),
                               seen=self.watch.saw(leg.node, leg.code, started, ready), acked=len(w.acked) - acked,
                               refused=dict(w.refused - refused))

        results = list(await asyncio.gather(*(finish(leg) for leg in fault_legs)))
        self.windows.append(Window(
            fault=name, round=round_, began=fault_began, ended=time.monotonic(),
            spans={i: (before[i][0], len(w.acked)) for i, w in self.writers.items()},
            refused=dict(sum((w.refused - before[i][1] for i, w in self.writers.items()), Counter()))))
        return results


@dataclass(frozen=True)
class Load:
    """A run's shape: ``rounds`` rounds of ``faults``; ``writers`` clients on each node writing ``rate`` memories a
    second in all (per node); ``settle_s`` of writes before each fault; ``hold_s``: how long a full disk or a
    stopped server lasts once /readyz shows it."""

    rounds: int = 3
    faults: tuple[str, ...] = FAULTS
    writers: int = 2
    rate: float = 20.0
    settle_s: float = 2.0
    hold_s: float = 2.0


def progress(results: list[FaultResult]) -> None:
    for f in results:
        print(f"round {f.round} {f.fault}: node-{f.node} ready {f.ready_after_s} s after it was over "
              f"({f.down_s} s from its start), acked {f.acked}, refused {_codes(f.refused)}", file=sys.stderr)


async def run(rig: StorageRig, load: Load) -> tuple[list[FaultResult], Tally, dict[int, list[str]]]:
    """Writers on every node through the rounds of faults; returns each fault's figures, the run's tally and each
    node's spells of not being ready (their reason codes)."""
    for name in load.faults:
        legs(rig, name)  # an unknown name is refused before anything runs
    results: list[FaultResult] = []
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)))
        writers = {i: await stack.enter_async_context(Writers(rig.socket(i), load.writers, f"node-{i}",
                                                              interval_s=load.writers / load.rate)) for i in NODES}
        watch = await stack.enter_async_context(ReadyWatch(rig, http))
        r = Run(rig, http, writers, watch, load.hold_s)
        for round_ in range(1, load.rounds + 1):
            for name in load.faults:
                await r.writes_go_on()
                await asyncio.sleep(load.settle_s)
                results += await r.fault(name, round_)
                progress(results[-2:] if name == "both" else results[-1:])
                if name == "pg promotion" and round_ < load.rounds:
                    await asyncio.to_thread(rig.rebuild_standby)
            await r.writes_go_on()
        not_ready = {i: watch.outages(i) for i in NODES}
    return results, await tally(rig, writers, r.windows, results), not_ready


# ---- counting -----------------------------------------------------------------------------------------------------

def _stored(rig: StorageRig) -> dict[int, Counter[str]]:
    """Each node's stored memories of the run: content -> rows."""
    return {PG_NODE: pg_counts(rig.current_dsn()),
            **{i: sqlite_counts(rig.node(i).home / "data" / "memory.db") for i in (FULL_NODE, PLAIN_NODE)}}


def fault_tallies(windows: list[Window], writers: dict[int, Writers],
                  stored: dict[int, Counter[str]]) -> list[FaultTally]:
    """Per fault, in the order they came: the writes acknowledged while it lasted, over its rounds, counted."""
    out = []
    for fault in dict.fromkeys(w.fault for w in windows):
        rows = [w for w in windows if w.fault == fault]
        written = [c for w in rows for i, (a, b) in w.spans.items() for c in writers[i].acked[a:b]]
        out.append(FaultTally(fault=fault, rounds=len(rows), acked=len(written),
                              lost=sum(1 for c in written if any(not stored[j][c] for j in NODES)),
                              duplicated=sum(1 for c in written if any(stored[j][c] > 1 for j in NODES)),
                              refused=dict(sum((Counter(w.refused) for w in rows), Counter()))))
    return out


def latency(samples_s: list[float]) -> Latency:
    s = sorted(samples_s) or [0.0]
    return Latency(samples=len(samples_s), p50_ms=round(percentile(s, 50) * 1e3, 2),
                   p95_ms=round(percentile(s, 95) * 1e3, 2), p99_ms=round(percentile(s, 99) * 1e3, 2))


def _overlaps(sent: float, answered: float, windows: list[Window]) -> bool:
    return any(answered >= w.began and sent <= w.ended for w in windows)


def latency_rows(results: list[FaultResult], windows: list[Window], writers: dict[int, Writers]) -> list[LatencyRow]:
    """Per fault and node it struck: the latency of the writes whose call overlapped the fault, against that
    node's writes whose call overlapped no fault."""
    rows = []
    for fault, node in dict.fromkeys((f.fault, f.node) for f in results):
        calls = [(at - s, at) for s, at in zip(writers[node].latencies_s, writers[node].acked_at, strict=True)]
        mine = [w for w in windows if w.fault == fault]
        d = latency([b - a for a, b in calls if _overlaps(a, b, mine)])
        h = latency([b - a for a, b in calls if not _overlaps(a, b, windows)])
        rows.append(LatencyRow(fault=fault, node=node, during=d, healthy=h,
                               p50_ratio=round(d.p50_ms / h.p50_ms, 2) if h.p50_ms else 0.0,
                               p99_ratio=round(d.p99_ms / h.p99_ms, 2) if h.p99_ms else 0.0))
    return rows


async def tally(rig: StorageRig, writers: dict[int, Writers], windows: list[Window],
                results: list[FaultResult]) -> Tally:
    """Count every acknowledged write on every node, once each has caught up (bounded)."""
    deadline = time.monotonic() + REPLICATED_WITHIN_S
    while True:
        stored = await asyncio.to_thread(_stored, rig)
        if all(stored[j][c] for w in writers.values() for c in w.acked for j in NODES):
            break
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    nodes = []
    for i, w in writers.items():
        peers = [j for j in NODES if j != i]
        nodes.append(NodeTally(
            node=i, acked=len(w.acked), lost=sum(1 for c in w.acked if not stored[i][c]),
            duplicated=sum(1 for c in w.acked if stored[i][c] > 1),
            replica_lost=sum(1 for c in w.acked for j in peers if not stored[j][c]),
            replica_duplicated=sum(1 for c in w.acked for j in peers if stored[j][c] > 1), refused=dict(w.refused)))
    return Tally(acked=sum(n.acked for n in nodes), lost=sum(n.lost + n.replica_lost for n in nodes),
                 duplicated=sum(n.duplicated + n.replica_duplicated for n in nodes),
                 stored_twice=sum(1 for j in NODES for n in stored[j].values() if n > 1), nodes=nodes,
                 faults=fault_tallies(windows, writers, stored), latencies=latency_rows(results, windows, writers),
                 refused=dict(sum((Counter(w.refused) for w in writers.values()), Counter())),
                 log_events={i: log_events(rig.node(i)) for i in NODES},
                 quick_check={i: quick_check(rig.node(i).home / "data" / "memory.db") for i in (FULL_NODE, PLAIN_NODE)},
                 exited=[i for i, p in rig.mesh.procs.items() if p.poll() is not None])


def log_events(spec: NodeSpec) -> dict[str, int]:
    """How many times node ``spec``'s log says a store's condition began or ended, by event."""
    seen: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for line in (spec.home / "node.log").read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(line).get("event")
                    if event in CONDITION_EVENTS:
                        seen[event] += 1
    return dict(seen)


def quick_check(path: Path) -> str:
    """SQLite's quick_check of the file (read-only, beside its running node): "ok" or its first complaint."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return str(conn.execute("PRAGMA quick_check").fetchone()[0])
    finally:
        conn.close()


# ---- the report ---------------------------------------------------------------------------------------------------

def summaries(results: list[FaultResult]) -> list[Summary]:
    """Per fault and node, in the order they first came: p50 / p95 over the rounds."""
    keys = list(dict.fromkeys((f.fault, f.node) for f in results))
    out = []
    for fault, node in keys:
        rows = [f for f in results if (f.fault, f.node) == (fault, node)]
        ready, down = sorted(f.ready_after_s for f in rows), sorted(f.down_s for f in rows)
        out.append(Summary(fault=fault, node=node, rounds=len(rows), ready_after_p50_s=percentile(ready, 50),
                           ready_after_p95_s=percentile(ready, 95), down_p50_s=percentile(down, 50),
                           down_p95_s=percentile(down, 95), seen_every_round=all(f.seen for f in rows),
                           refused=dict(sum((Counter(f.refused) for f in rows), Counter()))))
    return out


def _lat(x: Latency) -> str:
    return f"{x.samples}: {x.p50_ms} / {x.p95_ms} / {x.p99_ms}"


def _codes(refused: dict[str, int]) -> str:
    return ", ".join(f"{code} {n}" for code, n in sorted(refused.items())) or "-"


def table(results: list[FaultResult], t: Tally, not_ready: dict[int, list[str]]) -> str:
    """The run's figures in markdown."""
    lines = ["| fault | node | rounds | over to /readyz 200 p50 / p95 (s) | duration p50 / p95 (s) | 503 seen "
             "(every round) | refused on that node meanwhile |", "|---|---|---:|---|---|:-:|---|"]
    for s in summaries(results):
        backend = "Postgres" if s.node == PG_NODE else "SQLite"
        seen = "yes" if s.seen_every_round else "NO"
        lines.append(f"| {s.fault} | node-{s.node} ({backend}) | {s.rounds} | {s.ready_after_p50_s} / "
                     f"{s.ready_after_p95_s} | {s.down_p50_s} / {s.down_p95_s} | {seen} | {_codes(s.refused)} |")
    lines += ["", "| writes acked while the fault lasted (any node, all rounds) | rounds | acked | lost | duplicated | "
                  "refused meanwhile (any node) |", "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {f.fault} | {f.rounds} | {f.acked} | {f.lost} | {f.duplicated} | {_codes(f.refused)} |"
              for f in t.faults]
    lines += ["", "| write latency on the node struck | while the fault lasted: n, p50 / p95 / p99 (ms) | outside "
                  "every fault: n, p50 / p95 / p99 (ms) | ratio p50 / p99 |", "|---|---|---|---|"]
    lines += [f"| {r.fault}, node-{r.node} | {_lat(r.during)} | {_lat(r.healthy)} | {r.p50_ratio} / {r.p99_ratio} |"
              for r in t.latencies]
    lines += ["", "| writes of | acked | lost on it | duplicated on it | lost on a peer | duplicated on a peer | "
                  "refused |", "|---|---:|---:|---:|---:|---:|---|"]
    for n in t.nodes:
        lines.append(f"| node-{n.node} | {n.acked} | {n.lost} | {n.duplicated} | {n.replica_lost} | "
                     f"{n.replica_duplicated} | {_codes(n.refused)} |")
    lines += ["", f"writes acknowledged {t.acked}, lost {t.lost}, duplicated {t.duplicated} (each store counted: "
                  f"its own node and both peers); memories stored twice anywhere {t.stored_twice}; "
                  f"refused {_codes(t.refused)}",
              "condition log lines: " + "; ".join(f"node-{i} {_codes(e)}" for i, e in t.log_events.items()),
              "spells not ready: " + "; ".join(f"node-{i} {len(v)} ({_codes(Counter(v))})"
                                               for i, v in not_ready.items()),
              f"quick_check: {', '.join(f'node-{i} {v}' for i, v in t.quick_check.items())}; "
              f"node processes exited: {t.exited or 'none'}"]
    return "\n".join(lines)


def report(results: list[FaultResult], t: Tally, not_ready: dict[int, list[str]],
           args: dict[str, Any]) -> dict[str, Any]:
    """The run as JSON: its arguments, every fault, the summaries, the tally, the spells not ready."""
    return {"args": args, "faults": [asdict(f) for f in results], "summary": [asdict(s) for s in summaries(results)],
            "tally": asdict(t), "not_ready": not_ready}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the faults (default 3)")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"which faults, in order (default {','.join(FAULTS)})")
    ap.add_argument("--writers", type=int, default=2, help="concurrent clients of each node's socket (default 2)")
    ap.add_argument("--rate", type=float, default=20.0, help="writes a second on each node, its clients together "
                                                              "(default 20)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of writes before each fault (default 2)")
    ap.add_argument("--hold", type=float, default=2.0, help="seconds a full disk or a stopped server lasts, once "
                                                          "/readyz shows it (default 2)")
    ap.add_argument("--tmpfs-mb", type=int, default=TMPFS_MB, help=f"node-2's filesystem (default {TMPFS_MB})")
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "storage_faults.json")
    args = ap.parse_args()
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    if unknown := [f for f in faults if f not in FAULTS]:
        ap.error(f"unknown fault(s) {unknown}; the faults: {', '.join(FAULTS)}")
    if args.rounds < 1 or args.writers < 1 or args.rate <= 0:
        ap.error("--rounds and --writers must be at least 1, --rate above 0")
    if reason := doctor.missing("postgres"):
        print(reason, file=sys.stderr)
        return 2
    # A SIGTERM unwinds like ^C: the nodes and servers stopped, the tmpfs unmounted, the temp dir removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with tempfile.TemporaryDirectory(prefix="sf-") as tmp, \
                storage_rig(Path(tmp), tmpfs_bytes=args.tmpfs_mb << 20) as rig:
            load = Load(rounds=args.rounds, faults=faults, writers=args.writers, rate=args.rate,
                        settle_s=args.settle, hold_s=args.hold)
            results, t, not_ready = asyncio.run(run(rig, load))
    except TestbedError as e:
        print(f"storage_faults: error [{e.code}]: {e.message}", file=sys.stderr)
        return 2
    except TimeoutError as e:
        print(f"storage_faults: a bounded wait ran out: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report(results, t, not_ready, {k: str(v) for k, v in vars(args).items()}),
                                   indent=2))
    md = table(results, t, not_ready)
    args.out.with_suffix(".md").write_text(md + "\n")
    print(md)
    return 0 if t.clean else 1


if __name__ == "__main__":
    sys.exit(main())
