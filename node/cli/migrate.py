"""``ai-memory migrate``: move the node's store from SQLite to Postgres or back (storage/port.py), with the node
stopped. Progress per table on stderr (quiet under --json); at the end what was compared and what the operator
changes in the config. Exit 0 when both sides compare equal, 3 when they do not (the target keeps its run record),
1 when the move could not run (the node runs, the target holds rows, the source changed under a run under way)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from node.cli.common import EXIT_CHECK, EXIT_OK, check_home, emit, refuse_while_the_node_runs, run_async
from node.config import NodeConfig
from storage.errors import StorageCode, StorageError
from storage.port import BATCH_ROWS, Progress, migrate
from storage.portsides import Store

if TYPE_CHECKING:
    from node.cli.common import Commands

ENGINES = ("postgres", "sqlite")
# Off a terminal (a log, a pipe), a table's progress is a line at most this often, and one when it is done (s).
PROGRESS_EVERY_S = 5.0


def add_parsers(sub: Commands) -> None:
    """migrate."""
    mp = sub.add_parser("migrate", help="move the store from SQLite to Postgres or back, every row as it is "
                                        "(signatures, audit chain); the node must be stopped; an interrupted run "
                                        "goes on when run again; exit 3 when the two sides do not compare equal")
    mp.add_argument("--to", choices=ENGINES, required=True, help="the engine to move the store to")
    mp.add_argument("--dsn", help="the empty Postgres database to move into (default: storage.dsn)")
    mp.add_argument("--path", type=Path, help="the SQLite file to move into (default: storage.path)")
    mp.add_argument("--batch-rows", type=int, default=BATCH_ROWS,
                    help=f"rows per batch, each one transaction on the target (default {BATCH_ROWS})")
    mp.add_argument("--json", action="store_true")
    mp.set_defaults(handler=_migrate)


def _migrate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    source, target = ends(cfg, args.to, dsn=args.dsn, path=args.path)
    check_home(cfg)
    refuse_while_the_node_runs(cfg, "migrate")
    quiet = getattr(args, "json", False)
    observer: Callable[[Progress], None] = (lambda p: None) if quiet else ProgressLines(sys.stderr)
    report = run_async(migrate(source, target, observer=observer, batch_rows=args.batch_rows))
    result = {**report.as_dict(), "next": next_step(target, report.ok, source)}
    emit(args, result, _lines)
    return EXIT_OK if report.ok else EXIT_CHECK


def ends(cfg: NodeConfig, to: str, *, dsn: str | None, path: Path | None) -> tuple[Store, Store]:
    """The configured store (the source) and the one ``to`` names (the target)."""
    backend = cfg.storage.backend
    if to == backend:
        raise StorageError(StorageCode.BAD_SETTING, f"the store is already on {backend} (storage.backend): --to names "
                                                    "the engine to move it to")
    source = Store("sqlite", cfg.db_path) if backend == "sqlite" else Store("postgres", dsn=cfg.storage.dsn)
    if to == "sqlite":
        return source, Store("sqlite", _in_home(cfg, path) if path is not None else cfg.db_path)
    target_dsn = dsn or cfg.storage.dsn
    if not target_dsn:
        raise StorageError(StorageCode.BAD_SETTING, "give the Postgres database to move into: --dsn "
                                                    "'host=... dbname=...' (or storage.dsn in the config)")
    return source, Store("postgres", dsn=target_dsn)


def _in_home(cfg: NodeConfig, path: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def next_step(target: Store, ok: bool, source: Store) -> str:
    """What the operator does after the run: the config lines that point the node at the target."""
    if not ok:
        return ("the two sides do not compare equal: the node's config was left pointing at the source; empty the "
                "target and run `ai-memory migrate` again")
    if target.engine == "postgres":
        lines = f'[storage] backend = "postgres" and dsn = "{target.where().removeprefix("postgres at ")}"'
    else:
        lines = f'[storage] backend = "sqlite" and path = "{target.path}"'
    return (f"set {lines} in the node's config, then start the node; {source.where()} was left as it was (keep "
            "it until the node runs well on the new store)")


def _lines(r: dict[str, Any]) -> str:
    head = r["audit_head"]
    width = max(len(t["table"]) for t in r["tables"])
    out = [f"{'moved' if r['ok'] else 'copied'} {r['source']} -> {r['target']} in {r['seconds']:.1f} s"
           f"{' (resumed)' if r['resumed'] else ''}: {sum(r['copied'].values()):,} rows copied by this run",
           f"compared, rows in the source | in the target (schema {r['schema']} on both):"]
    out += [f"  {t['table']:<{width}} {t['source']:>12,} | {t['target']:<12,} {'ok' if t['ok'] else 'DIFFERENT'}"
            for t in r["tables"]]
    out.append(f"  {'audit chain head':<{width}} {_head(head['source']):>12} | {_head(head['target']):<12} "
               f"{'ok' if head['ok'] else 'DIFFERENT'}")
    chain = r["audit_chain"]
    out.append(f"  the target's audit chain: {chain['checked']:,} events walked, " +
               ("intact (ai-memory audit verify)" if chain["ok"] else f"BROKEN at seq {chain['first_bad_seq']}: "
                                                                     f"{chain['reason']}"))
    out.append(f"next: {r['next']}")
    return "\n".join(out)


def _head(h: dict[str, Any] | None) -> str:
    return "empty" if h is None else f"{h['seq']} {h['event_hash'][:12]}"


def progress_line(p: Progress) -> str:
    """One table's progress: rows done of its total, the rate of this run, and the time left at that rate."""
    rate = p.copied / p.seconds if p.seconds > 0 else 0.0
    share = 100.0 if p.total == 0 else min(100.0, 100.0 * p.done / p.total)
    line = f"{p.table:<26} {p.done:>11,} / {p.total:<11,} {share:5.1f}%"
    if p.finished:
        return f"{line}  done" + (f" ({rate:,.0f} rows/s, {p.seconds:.1f} s)" if p.copied else "")
    left = f"ETA {max(0.0, p.total - p.done) / rate:.0f} s" if rate > 0 else "ETA -"
    return f"{line}  {rate:>9,.0f} rows/s  {left}"


class ProgressLines:
    """Progress on ``stream``: on a terminal one line per table rewritten in place; elsewhere a line at most every
    ``every_s`` seconds per table and one when it is done."""

    def __init__(self, stream: TextIO, *, tty: bool | None = None, clock: Callable[[], float] = time.monotonic,
                 every_s: float = PROGRESS_EVERY_S) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.clock = clock
        self.every_s = every_s
        self._last: dict[str, float] = {}

    def __call__(self, p: Progress) -> None:
        if p.finished and p.total == 0 and p.copied == 0 and p.done == 0:
            return  # an empty table says nothing
        if self.tty:
            self.stream.write(f"\r{progress_line(p)}\033[K" + ("\n" if p.finished else ""))
            self.stream.flush()
            return
        now = self.clock()
        if p.finished or now - self._last.get(p.table, -self.every_s) >= self.every_s:
            self._last[p.table] = now
            print(progress_line(p), file=self.stream, flush=True)
