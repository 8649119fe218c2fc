"""Move a store from one engine to the other (``ai-memory migrate``): an SQLite file to a Postgres database and
back, as Synapse's ``synapse_port_db`` does.

Rows are copied as they are, column by column: signatures, hashes, sequence numbers, and SQLite's rowids as the
Postgres tables' ``rowid`` column (the insertion order both engines read) and back. Every signature therefore
still verifies and the audit chain is the same chain; at the end each table's rows are counted on both sides, the
chain heads compared and the target's chain walked (``Report``).

- The source is only read. An SQLite file is held in SQLite's exclusive locking mode for the whole run: a process
  that has it open (a node, ``ai-memory mcp``) makes the run refuse (``in_use``), and none can open it meanwhile.
  A Postgres source is refused while another client is connected to its database, and the run holds the node's
  write lock (``storage.pg.WRITE_LOCK_KEY``) so nothing writes there meanwhile.
- The target is made with the node's own migrations (``prepare``) and must hold no rows (``inspect`` says what it
  holds, read-only). Each batch is one transaction on the target that also records how far the copy got
  (``am_migrate``: per table the last key copied, and the source's fingerprint), so a run stopped anywhere (kill
  -9, the server away) goes on from there when run again, provided the source is as it was. The marker table goes
  in the transaction that ends the run; an SQLite target that still holds it is refused by the node
  (``foreign_database``), so a half-copied file is never served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from storage.errors import StorageCode, StorageError
from storage.events import ChainReport
from storage.migrations import MAX_SUPPORTED_SCHEMA
from storage.portsides import TABLES, Mark, Shape, Side, Store, TargetState, inspect, open_side

# Rows per batch: one read from the source, one transaction on the target (with the resume cursor).
BATCH_ROWS = 5_000


@dataclass(frozen=True)
class Progress:
    """One step of the copy, as an observer is told it: ``done`` of ``total`` rows are in the target, ``copied``
    of them by this run in ``seconds``."""

    table: str
    done: int
    total: int
    copied: int
    seconds: float
    finished: bool


@dataclass(frozen=True)
class TableCheck:
    table: str
    source: int
    target: int

    @property
    def ok(self) -> bool:
        return self.source == self.target


@dataclass(frozen=True)
class Report:
    """What a run did and what it compared at the end."""

    source: str
    target: str
    resumed: bool
    seconds: float
    copied: dict[str, int]
    tables: tuple[TableCheck, ...]
    source_head: tuple[int, str] | None
    target_head: tuple[int, str] | None
    chain: ChainReport
    schema: int

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tables) and self.source_head == self.target_head and self.chain.ok

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "source": self.source, "target": self.target, "resumed": self.resumed,
                "seconds": round(self.seconds, 3), "schema": self.schema, "copied": self.copied,
                "tables": [{**asdict(t), "ok": t.ok} for t in self.tables],
                "audit_head": {"source": _head(self.source_head), "target": _head(self.target_head),
                               "ok": self.source_head == self.target_head},
                "audit_chain": {"ok": self.chain.ok, "checked": self.chain.checked,
                                "first_bad_seq": self.chain.first_bad_seq, "reason": self.chain.reason}}


def _head(head: tuple[int, str] | None) -> dict[str, Any] | None:
    return None if head is None else {"seq": head[0], "event_hash": head[1]}


# ---- the run --------------------------------------------------------------------------------------

async def prepare(store: Store) -> int:
    """Create (or bring up to date) the target's schema with the node's own migrations; its version."""
    from storage.backend import open_database
    db = await open_database(backend=store.engine, path=store.path, dsn=store.dsn)
    try:
        return db.schema_version
    finally:
        await db.close()


def refuse_held(store: Store, state: TargetState) -> None:
    """A target that holds rows (and no run under way) is refused, naming what it holds."""
    if state.marks is None and state.held:
        shown = ", ".join(f"{t}: {n}" for t, n in state.held.items())
        raise StorageError(StorageCode.TARGET_NOT_EMPTY,
                           f"the target {store.where()} is not empty ({shown}); migrate moves a store into an empty "
                           "one: give another target, or empty this one (nothing was changed)")


def fingerprint(side: Side) -> dict[str, Any]:
    """What a resumed run checks the source against: its schema, its rows per table, its audit chain's head."""
    return {"source": side.store.where(), "schema": side.version(), "counts": side.counts(),
            "head": side.head()}


def check_resume(state: TargetState, now: dict[str, Any], target: Store) -> None:
    """A run under way goes on only from the source it began with, unchanged since."""
    before = state.fingerprint or {}
    was = {"schema": before.get("schema"), "counts": before.get("counts"),
           "head": None if before.get("head") is None else tuple(before["head"])}
    if was == {k: now[k] for k in was}:
        return
    diff = [f"{t} {was['counts'].get(t)} -> {n}" for t, n in now["counts"].items()
            if isinstance(was["counts"], dict) and was["counts"].get(t) != n]
    what = ", ".join(diff[:5]) or "its audit chain's head or schema differ"
    raise StorageError(StorageCode.SOURCE_CHANGED,
                       f"the migration into {target.where()} began from {before.get('source', '?')}, and the source "
                       f"is no longer as it was then ({what}); empty the target and run `ai-memory migrate` again")


def shapes(source: Side, target: Side) -> list[Shape]:
    """Each table's columns and key, the same on both sides (the target's column order)."""
    out = []
    for table in TABLES:
        s, t = source.shape(table), target.shape(table)
        if set(s.columns) != set(t.columns) or s.key != t.key:
            raise StorageError(StorageCode.SCHEMA_MISMATCH,
                               f"{table} differs between {source.store.where()} ({', '.join(s.columns)}; key "
                               f"{s.key}) and {target.store.where()} ({', '.join(t.columns)}; key {t.key})")
        out.append(t)
    return out


class Copy:
    """The copy of every table from ``source`` into ``target``, batch by batch, from where ``marks`` say it got;
    ``observer`` is told each step."""

    def __init__(self, source: Side, target: Side, *, marks: dict[str, Mark], totals: dict[str, int],
                 observer: Callable[[Progress], None], batch_rows: int = BATCH_ROWS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if batch_rows < 1:
            raise StorageError(StorageCode.BAD_SETTING, f"batch_rows must be >= 1, got {batch_rows}")
        self.source, self.target = source, target
        self.marks = dict(marks)
        self.totals = totals
        self.observer = observer
        self.batch_rows = batch_rows
        self.clock = clock
        self.copied: dict[str, int] = {}

    def run(self, shapes: Sequence[Shape]) -> None:
        for shape in shapes:
            self.marks[shape.table] = self.table(shape, self.marks.get(shape.table, Mark()))

    def table(self, shape: Shape, mark: Mark) -> Mark:
        total, started, copied = self.totals[shape.table], self.clock(), 0
        self.observer(Progress(shape.table, mark.copied, total, 0, 0.0, mark.done))
        if mark.done:
            return mark
        # Bounded: the source is held for the run, so it has no rows past those counted.
        for _ in range(total // self.batch_rows + 2):
            rows = self.source.read(shape, mark.last_key, self.batch_rows)
            last = rows[-1][shape.key_index] if rows else mark.last_key
            mark = Mark(int(last), mark.copied + len(rows), len(rows) < self.batch_rows)
            self.target.write(shape, rows, mark)
            copied += len(rows)
            self.copied[shape.table] = copied
            self.observer(Progress(shape.table, mark.copied, total, copied, self.clock() - started, mark.done))
            if mark.done:
                return mark
        raise StorageError(StorageCode.SOURCE_CHANGED, f"{shape.table} in {self.source.store.where()} holds more "
                                                       f"rows than the {total} counted when the run began")


def compare(source: Side, target: Side, *, copied: dict[str, int], resumed: bool, seconds: float) -> Report:
    """Count every table on both sides, compare the audit chains' heads and walk the target's chain."""
    src, tgt = source.counts(), target.counts()
    return Report(source=source.store.where(), target=target.store.where(), resumed=resumed, seconds=seconds,
                  copied=copied, tables=tuple(TableCheck(t, src[t], tgt[t]) for t in TABLES),
                  source_head=source.head(), target_head=target.head(), chain=target.verify_chain(),
                  schema=target.version())


def high_waters(source: Side, shapes: Sequence[Shape]) -> dict[str, int]:
    return {s.table: n for s in shapes if (n := source.high_water(s))}


def _same_schema(store: Store, version: int) -> None:
    if version > MAX_SUPPORTED_SCHEMA:
        raise StorageError(StorageCode.SCHEMA_TOO_NEW,
                           f"{store.where()} was written by schema {version}, this build supports up to "
                           f"{MAX_SUPPORTED_SCHEMA}: migrate with the build that wrote it (left unchanged)")
    if version < MAX_SUPPORTED_SCHEMA:
        raise StorageError(StorageCode.SCHEMA_MISMATCH,
                           f"{store.where()} is at schema {version}, this build's is {MAX_SUPPORTED_SCHEMA}: open it "
                           "once with this build (`ai-memory status`), which brings it up to date, then migrate "
                           "(left unchanged)")


def _same_place(source: Store, target: Store) -> bool:
    if source.engine != target.engine:
        return False
    if source.engine == "sqlite":
        return source.path.resolve() == target.path.resolve()
    return source.dsn == target.dsn


async def migrate(source: Store, target: Store, *, observer: Callable[[Progress], None],
                  batch_rows: int = BATCH_ROWS, clock: Callable[[], float] = time.monotonic) -> Report:
    """Copy the store at ``source`` into ``target`` (empty, or holding a run under way from this same source),
    every table in batches; then compare both sides and, when they agree, end the run. The Report says what was
    compared; ``ok`` False leaves the run's record in the target (the node will not take it as a finished store).

    Raises StorageError: in_use (the source or target is held by another process), target_not_empty,
    source_changed (a run under way began from a source that has changed since), schema_mismatch,
    schema_too_new, storage_unavailable, and the engines' own errors."""
    if _same_place(source, target):
        raise StorageError(StorageCode.BAD_SETTING, f"the source and the target are both {source.where()}")
    started = clock()
    state = await asyncio.to_thread(inspect, target)
    refuse_held(target, state)
    src = await asyncio.to_thread(open_side, source, source=True)
    try:
        now = await asyncio.to_thread(fingerprint, src)
        _same_schema(source, int(now["schema"]))
        if state.marks is not None:
            check_resume(state, now, target)
        else:
            await prepare(target)
        tgt = await asyncio.to_thread(open_side, target, source=False)
        try:
            run = Run(src, tgt, fingerprint=now, marks=state.marks, observer=observer, batch_rows=batch_rows,
                      clock=clock)
            return await asyncio.to_thread(run.go, started)
        finally:
            await asyncio.to_thread(tgt.close)
    finally:
        await asyncio.to_thread(src.close)


@dataclass
class Run:
    """One run between two open sides: the copy, the comparison, and the run's end when they agree."""

    source: Side
    target: Side
    fingerprint: dict[str, Any]
    marks: dict[str, Mark] | None
    observer: Callable[[Progress], None]
    batch_rows: int
    clock: Callable[[], float]

    def go(self, started: float) -> Report:
        _same_schema(self.target.store, self.target.version())
        table_shapes = shapes(self.source, self.target)
        if self.marks is None:
            self.target.start(self.fingerprint)
        copy = Copy(self.source, self.target, marks=self.marks or {}, totals=self.fingerprint["counts"],
                    observer=self.observer, batch_rows=self.batch_rows, clock=self.clock)
        copy.run(table_shapes)
        report = compare(self.source, self.target, copied=copy.copied, resumed=self.marks is not None,
                         seconds=0.0)
        if report.ok:
            self.target.finish(high_waters(self.source, table_shapes), table_shapes)
        return dataclasses.replace(report, seconds=self.clock() - started)
