"""``ai-memory repair``: check the SQLite store and rebuild what can be rebuilt (``storage.repair``), with the node
stopped. Exit 0 when the store is sound (as found, or after the repair), 3 when damage remains that only a
backup or the mesh can restore, 1 when the repair could not run (the node runs, the file is in use, no room)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_CHECK, EXIT_OK, check_home, emit, refuse_while_the_node_runs
from node.config import NodeConfig
from storage.errors import StorageCode, StorageError

if TYPE_CHECKING:
    from node.cli.common import Commands


def add_parsers(sub: Commands) -> None:
    """repair."""
    rp = sub.add_parser("repair", help="check the SQLite store and rebuild what can be rebuilt (the full-text "
                                       "index, the indexes); the node must be stopped; exit 3 when damage remains "
                                       "that only a backup or the mesh can restore")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(handler=_repair)


def _repair(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from storage.repair import repair

    if cfg.storage.backend != "sqlite":
        raise StorageError(StorageCode.BAD_SETTING,
                           f"`ai-memory repair` rebuilds a SQLite store; this node's storage.backend is "
                           f"{cfg.storage.backend!r} (Postgres checks and repairs its own pages: amcheck, REINDEX)")
    check_home(cfg)
    refuse_while_the_node_runs(cfg, "repair")
    result = repair(cfg.db_path)
    emit(args, result.as_dict(), _lines)
    return EXIT_CHECK if result.outcome == "not_repaired" else EXIT_OK


def _lines(r: dict[str, Any]) -> str:
    before = r["before"]
    if r["outcome"] == "sound":
        return f"{r['path']}: nothing damaged ({before['check']} and the full-text index's check: ok, " \
               f"{before['seconds']:.2f} s); nothing done"
    lines = [f"{r['path']}: damaged: " + ", ".join(d["what"] for d in before["damaged"])]
    lines += [f"  sqlite: {m}" for m in before["messages"][:3]]
    lines += [f"  done: {d}" for d in r["done"]]
    lines += [f"  NOT DONE: {d}" for d in r["not_done"]]
    after = r["after"]
    if after is not None:
        state = "sound" if after["ok"] else "STILL DAMAGED: " + ", ".join(d["what"] for d in after["damaged"])
        lines.append(f"  after: {after['check']}: {state}")
    return "\n".join(lines)
