"""Restore from the mesh: a node whose store was lost or damaged starts from an empty one (``ai-memory serve
--restore``) and pulls what each peer holds, its own writes included, every item verified and applied as any
pulled item is (each appends its signed event, so the audit chain is rebuilt from the signed items).

``prepare`` refuses a store that holds anything, writes a marker (``<home>/data/restore.json``: when the restore
began, which peers were read to their end) so that a node stopped mid-restore resumes it at its next start, and
moves the change log's next seq past every cursor the peers kept on the log that was lost (unix ms x 1000: a
log grows far slower than a thousand changes a millisecond). ``RestoreProgress`` is what each peer's pull asks
("read my own writes too?") and tells (how far it read, of how much), what the log, ``status`` and ``/readyz``
show, and it ends the restore once every configured peer's log was read to its end once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from node.errors import ServiceCode, ServiceError
from storage import changelog
from storage.db import Database

log = logging.getLogger("node")

MARKER_NAME = "restore.json"
# A restored node's change log starts at this many seqs per unix ms of the restore's start.
SEQ_PER_MS = 1000
# restore_progress is logged at most this often (seconds), and whenever a peer's log was read to its end.
PROGRESS_LOG_S = 5.0


def marker_path(cfg: NodeConfig) -> Path:
    return cfg.home / "data" / MARKER_NAME


class RestoreProgress:
    """A restore in progress from ``peers`` (the configured peers): each peer's log is pulled with this node's
    own writes until it was read to its end once (``done``, kept in the marker file). ``clock``: seconds, for
    pacing the progress lines."""

    def __init__(self, marker: Path, peers: Sequence[str], started_at: int, done: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.marker = marker
        self.peers = tuple(peers)
        self.started_at = started_at
        self.done = set(done) & set(self.peers)
        self.clock = clock
        self.began = clock()
        self.items = 0
        self.read_to: dict[str, int] = {}
        self.head: dict[str, int] = {}
        # Peers whose pages did not carry this node's own writes (older nodes): they were restored from the others.
        self.without_own: set[str] = set()
        self._logged_at = float("-inf")

    @classmethod
    def read(cls, marker: Path, peers: Sequence[str]) -> RestoreProgress | None:
        """The restore the marker says is in progress, or None."""
        try:
            doc = json.loads(marker.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ServiceError(ServiceCode.RESTORE_MARKER_INVALID,
                               f"{marker} (a restore in progress) cannot be read: {e}; remove it to start without "
                               "finishing the restore, or with --restore on an empty store") from None
        done = doc.get("done") if isinstance(doc, dict) else None
        started = doc.get("started_at") if isinstance(doc, dict) else None
        if not isinstance(started, int) or not isinstance(done, list):
            raise ServiceError(ServiceCode.RESTORE_MARKER_INVALID, f"{marker} is not a restore marker this node wrote")
        return cls(marker, peers, started, [p for p in done if isinstance(p, str)])

    @property
    def active(self) -> bool:
        return not self.done >= set(self.peers)

    def wants(self, peer: str) -> bool:
        """Pull ``peer`` with this node's own writes: its log was not read to its end yet."""
        return peer in self.peers and peer not in self.done

    def page(self, peer: str, read_to: int, head: Any, applied: int, *, done: bool, own: bool) -> None:
        """One page from ``peer``: its log read up to ``read_to`` of ``head`` (None from an older peer),
        ``applied`` items changed something here; ``done``: that was its last page; ``own``: the peer served this
        node's own writes."""
        self.items += applied
        self.read_to[peer] = read_to
        if isinstance(head, int) and not isinstance(head, bool):
            self.head[peer] = max(head, read_to)
        if not own:
            self.without_own.add(peer)
        if done and peer not in self.done:
            self._peer_done(peer)
        elif self.clock() - self._logged_at >= PROGRESS_LOG_S:
            self._log_progress()

    def percent(self) -> float | None:
        """How much of the peers' logs was read (by seq), 0..100; None until a peer said how long its log is."""
        if not self.active:
            return 100.0
        known = [p for p in self.peers if p in self.head]
        if not known:
            return None
        total = sum(self.head[p] for p in known)
        read = sum(self.head[p] if p in self.done else min(self.read_to.get(p, 0), self.head[p]) for p in known)
        return round(100.0 * read / total, 1) if total else 0.0

    def snapshot(self) -> dict[str, Any]:
        """The restore as ``status`` shows it."""
        return {"state": "restoring" if self.active else "done", "started_at": self.started_at,
                "items": self.items, "percent": self.percent(),
                "peers": {p: {"read_to": self.read_to.get(p), "head": self.head.get(p), "done": p in self.done,
                              "own_writes": p not in self.without_own} for p in self.peers}}

    def reason(self) -> dict[str, str] | None:
        """The /readyz reason while the restore runs, else None."""
        if not self.active:
            return None
        pct = self.percent()
        left = sorted(set(self.peers) - self.done)
        return {"code": "restoring", "message": f"restoring from the mesh: {self.items} items so far"
                f"{'' if pct is None else f', {pct:g}% of the peers logs read'}; waiting for {', '.join(left)}"}

    def _peer_done(self, peer: str) -> None:
        self.done.add(peer)
        if peer in self.without_own:
            log.warning("restore_peer_without_own_writes", extra={"ev": {
                "peer": peer, "effect": "it is older than the restore and served none of this node's own writes; "
                                        "they come back from the peers that do"}})
        log.info("restore_peer_done", extra={"ev": {"peer": peer, "read_to": self.read_to.get(peer),
                                                    "items": self.items}})
        self._log_progress()
        if self.active:
            self.save()
            return
        self.marker.unlink(missing_ok=True)
        log.info("restore_done", extra={"ev": {"items": self.items, "peers": list(self.peers),
                                               "seconds": round(self.clock() - self.began, 1)}})

    def _log_progress(self) -> None:
        self._logged_at = self.clock()
        log.info("restore_progress", extra={"ev": {"items": self.items, "percent": self.percent(),
                                                   "peers_done": sorted(self.done), "peers": list(self.peers)}})

    def save(self) -> None:
        """Write the marker: when the restore began and which peers were read to their end."""
        self.marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.marker.with_name(f".{self.marker.name}.tmp")
        tmp.write_text(json.dumps({"started_at": self.started_at, "done": sorted(self.done)}))
        os.replace(tmp, self.marker)


async def prepare(cfg: NodeConfig, db: Database, *, requested: bool, now_ms: int) -> RestoreProgress | None:
    """The restore this start runs: the one a marker says is in progress (resumed), a new one when ``requested``
    (only on an empty store, from at least one configured peer), else None."""
    peers = [p.agent_id for p in cfg.mesh.peers]
    marker = marker_path(cfg)
    progress = RestoreProgress.read(marker, peers)
    if progress is not None:
        log.info("restore_resumed", extra={"ev": {"started_at": progress.started_at,
                                                  "peers_done": sorted(progress.done), "peers": peers}})
    elif requested:
        held = {table: n for table, n in (await db.read(changelog.held)).items() if n}
        if held:
            raise ServiceError(ServiceCode.STORE_NOT_EMPTY,
                               f"the store is not empty ({', '.join(f'{t}: {n}' for t, n in held.items())}): a "
                               "restore from the mesh starts from an empty store. Move the database away first "
                               f"(SQLite: {cfg.db_path} and its -wal and -shm files), or start without --restore")
        if not peers:
            raise ServiceError(ServiceCode.BAD_INPUT, "no [[mesh.peers]] are configured: there is nothing to "
                                                      "restore from")
        progress = RestoreProgress(marker, peers, now_ms)
        progress.save()  # the marker first: a start that fails from here on resumes the restore next time
        log.info("restore_started", extra={"ev": {"peers": peers, "marker": str(marker)}})
    if progress is None:
        return None
    # Peers pull this node's log from the cursors they kept on the lost one: new changes must come after them.
    await db.write(changelog.start_seq_after, now_ms * SEQ_PER_MS)
    return progress
