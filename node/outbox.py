"""The outbox sender: delivers a2a_outbox rows over the peer links, retries on the schedule, dead-letters.

One worker per peer. A row leaves the outbox only on an ACK (accepted or duplicate: both mean the
peer holds it), or to the dead letters after a permanent rejection, an exhausted retry schedule,
or expiry. Rows survive crashes, so a restarted node resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from a2a import RetrySchedule
from mesh.errors import MeshError
from mesh.link import PeerLink
from storage import changelog, outbox
from storage.db import Database
from storage.outbox import OutboxRow

log = logging.getLogger("node.outbox")

# Rows sent to one peer at once (pipelined on its WebSocket, ACKs matched by correlation_id).
SEND_WINDOW = 256
# Poll interval: picks up rows written by other processes (the CLI) and retries coming due.
POLL_S = 0.5

OnAck = Callable[[str, str], Awaitable[None]]


@dataclass
class _AckBatch:
    """ACKed rows of one peer whose outbox deletes share one writer job; ``done`` resolves after the commit."""

    rows: list[OutboxRow]
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class OutboxSender:
    def __init__(self, db: Database, links: dict[str, PeerLink], schedule: RetrySchedule,
                 clock_ms: Callable[[], int], on_ack: OnAck) -> None:
        self.db = db
        self.links = links
        self.schedule = schedule
        self.clock_ms = clock_ms
        self.on_ack = on_ack
        self._wake = {peer: asyncio.Event() for peer in links}
        self._inflight: dict[str, set[int]] = {peer: set() for peer in links}
        # Rows whose attempt ended since the worker's current read began: that read may predate the
        # attempt's commit, so these are skipped once rather than sent again.
        self._settled: dict[str, set[int]] = {peer: set() for peer in links}
        # The open ACK batch per peer: the ACKs read from one socket read join it (see _record_ack).
        self._ack_batches: dict[str, _AckBatch] = {}
        self._stopping = False
        self.delivered = 0
        self.dead_lettered = 0
        # Told (peer, seconds from send to ACK) for each ACK; the node's metrics set it.
        self.on_ack_latency: Callable[[str, float], None] | None = None

    def wake(self, peer: str | None = None) -> None:
        for p, ev in self._wake.items():
            if peer is None or p == peer:
                ev.set()

    def inflight(self, peer: str) -> int:
        return len(self._inflight.get(peer, ()))

    async def run(self) -> None:
        await self._orphans_to_dead_letters()
        async with asyncio.TaskGroup() as tg:
            for peer in self.links:
                tg.create_task(self._worker(peer), name=f"outbox:{peer}")

    async def _orphans_to_dead_letters(self) -> None:
        """Rows for a peer this node has no link to (removed from the config) would wait forever."""
        now = self.clock_ms()
        moved = await self.db.write(outbox.dead_letter_peers_except, sorted(self.links),
                                    "no [[mesh.peers]] entry for this peer", now)
        if moved:
            log.warning("dead_letter", extra={"ev": {"count": moved, "error": "peer not configured"}})

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    async def _worker(self, peer: str) -> None:
        wake = self._wake[peer]
        inflight = self._inflight[peer]
        settled = self._settled[peer]
        async with asyncio.TaskGroup() as tg:
            while not self._stopping:
                wake.clear()
                settled.clear()
                room = SEND_WINDOW - len(inflight)
                rows = await self.db.read(outbox.due_for_peer, peer, self.clock_ms(), room,
                                          sorted(inflight)) if room else []
                for row in rows:
                    if row.id in inflight or row.id in settled:
                        continue
                    inflight.add(row.id)
                    tg.create_task(self._attempt(row, inflight))
                try:
                    await asyncio.wait_for(wake.wait(), POLL_S)
                except TimeoutError:
                    pass

    async def _attempt(self, row: OutboxRow, inflight: set[int]) -> None:
        try:
            await self._deliver(row)
        except Exception as e:  # the database refused the bookkeeping (busy, disk full): the row stays due
            log.error("outbox_attempt_failed", extra={"ev": {"peer": row.peer, "correlation_id": row.correlation_id,
                                                             "error": f"{type(e).__name__}: {e}"}})
        finally:
            inflight.discard(row.id)
            self._settled[row.peer].add(row.id)
            # Wake the worker once half the window is free, not on every ACK (each wake re-reads due rows).
            if len(inflight) <= SEND_WINDOW // 2:
                self._wake[row.peer].set()

    async def _deliver(self, row: OutboxRow) -> None:
        if row.expires_at <= self.clock_ms():
            await self._dead_letter(row, row.last_error or "expired before it could be delivered")
            return
        sent = time.perf_counter()
        try:
            ack = await self.links[row.peer].send_wire(row.correlation_id, row.envelope)
        except MeshError as e:
            await self._failed(row, f"{e.code}: {e.message}")
            return
        if self.on_ack_latency is not None:
            self.on_ack_latency(row.peer, time.perf_counter() - sent)
        if ack.accepted or ack.is_duplicate:
            await self._record_ack(row)
            self.delivered += 1
            await self.on_ack(row.peer, row.correlation_id)
        elif ack.permanent:
            await self._dead_letter(row, ack.reason)
        else:
            await self._failed(row, ack.reason or "not accepted")

    async def _record_ack(self, row: OutboxRow) -> None:
        """Delete an ACKed row; returns once that is committed.

        The ACKs of one socket read wake their attempts in the same loop turn; the first opens a batch,
        yields once so the others join it, and writes them all as one writer job (one thread hop and
        one peer_state update instead of one per ACK). A failed write fails every row of the batch:
        each stays due and is resent, which the peer answers ``duplicate``.
        """
        batch = self._ack_batches.get(row.peer)
        if batch is not None:
            batch.rows.append(row)
            await asyncio.shield(batch.done)
            return
        batch = self._ack_batches[row.peer] = _AckBatch([row])
        try:
            await asyncio.sleep(0)
            self._close_ack_batch(batch, row.peer)
            await self.db.write(_acked, batch.rows, self.clock_ms())
        except BaseException as e:
            self._close_ack_batch(batch, row.peer)
            if isinstance(e, asyncio.CancelledError):
                batch.done.cancel()
            else:
                batch.done.set_exception(e)
                batch.done.exception()  # the followers get it; no "never retrieved" warning without them
            raise
        batch.done.set_result(None)

    def _close_ack_batch(self, batch: _AckBatch, peer: str) -> None:
        if self._ack_batches.get(peer) is batch:
            del self._ack_batches[peer]  # ACKs from now on open the next batch

    async def _failed(self, row: OutboxRow, error: str) -> None:
        attempts = row.attempts + 1
        nxt = self.schedule.next_attempt_at(attempts, self.clock_ms(), row.expires_at)
        if nxt is None:
            await self._dead_letter(row, error, attempts)
            return
        await self.db.write(outbox.mark_attempt, row.id, attempts, nxt, error)
        log.info("retry_scheduled", extra={"ev": {"peer": row.peer, "correlation_id": row.correlation_id,
                                                  "attempt": attempts, "next_attempt_at": nxt, "error": error}})

    async def _dead_letter(self, row: OutboxRow, error: str | None, attempts: int | None = None) -> None:
        if attempts is not None:
            await self.db.write(outbox.mark_attempt, row.id, attempts, row.next_attempt_at, error)
        await self.db.write(outbox.to_dead_letter, row.id, error, self.clock_ms())
        self.dead_lettered += 1
        log.warning("dead_letter", extra={"ev": {"peer": row.peer, "correlation_id": row.correlation_id,
                                                 "kind": row.kind, "attempts": attempts or row.attempts,
                                                 "error": error}})


def _acked(conn, rows: list[OutboxRow], now_ms: int) -> None:
    for row in rows:
        outbox.remove(conn, row.correlation_id, row.peer)
    changelog.set_peer_state(conn, rows[0].peer, last_ack_at=now_ms)
