"""The outbox sender: delivers a2a_outbox rows over the peer links, retries on the schedule, dead-letters.

One worker per peer. A row leaves the outbox only on an ACK (accepted or duplicate: both mean the
peer holds it), or to the dead letters after a permanent rejection, an exhausted retry schedule,
or expiry. Rows survive crashes, so a restarted node resumes where it stopped.

Where rows come from: a write made by this process hands its rows to the worker in memory once
committed (``hand_off``), so the hot path reads nothing back; the worker also polls the database
(every ``POLL_S``, at start, on a link coming up, and while a backlog remains) for what the hand-off
does not carry: retries coming due, rows from before a restart, rows written by the CLI. The periodic
polls of all workers fall on one grid of ``POLL_S`` ticks and share one read per tick of which peers hold
due rows (``storage.outbox.peers_due``): only those read their rows, so an idle node makes one read a tick,
not one per peer. The
database stays the truth: a row is deleted only on its ACK, and a hand-off lost with the process is
found by the next start's poll. A group of rows goes out through one ``send_many`` call (the link
coalesces it into batch frames where the peer supports them) and its ACKs are deleted in one writer job.
The window (``window_bytes``: ``federation.send_window_bytes``) bounds the bytes on the wire: a group's bytes
leave it when the peer has answered, not when the deletes commit, so a writer busy with the node's own writes
does not hold the sends back.

A row may carry several links (``links.put``, sent only to a peer that accepts it). When the peer refuses
one for good, the row is replaced, in one transaction, by one ``link.put`` row per link, which go out at
once: each link then gets its own answer, and only a link refused on its own is dead-lettered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from a2a import Ack, ProtocolError, RetrySchedule
from mesh.errors import MeshCode, MeshError
from mesh.link import PeerLink
from node.config import SEND_WINDOW_BYTES
from node.pause import StoragePause
from node.wire import split_links_put
from storage import changelog, outbox
from storage.db import Database
from storage.errors import StorageError
from storage.outbox import OutboxRow

log = logging.getLogger("node.outbox")

# Rows in flight to one peer at once (pipelined on its WebSocket, ACKs matched by correlation_id). The bytes in
# flight are bounded too: ``window_bytes`` (federation.send_window_bytes, SEND_WINDOW_BYTES by default).
SEND_WINDOW = 256
# Most rows, and most envelope bytes, in one send_many call (a full links.put travels in a group of its own).
GROUP_MAX = 32
GROUP_MAX_BYTES = 32 * 1024
# Rows handed over in memory and waiting for room in the window, per peer; past it they are left to the poll.
HANDOFF_MAX = 4 * SEND_WINDOW
# Correlation ids whose attempt began lately, per peer: a hand-off arriving after the poll already sent the
# row is not sent twice. A poll never consults it (a retry coming due must go out).
ATTEMPTED_MEMORY = 4 * SEND_WINDOW
# Poll interval: picks up rows written by other processes (the CLI) and retries coming due.
POLL_S = 0.5
# The shared periodic read looks at no more due rows than this; past it every worker reads its own.
DUE_PEERS_SCAN = 1024



class SendListener(Protocol):
    """What the sender tells the rest of the node (federation's ``DeliveryFeedback``)."""

    async def on_ack(self, peer: str, correlation_ids: Sequence[str]) -> None:
        """``peer`` ACKed these rows (their deletes are committed)."""

    def on_ack_latency(self, peer: str, seconds: float) -> None:
        """Seconds from send to ACK, once per ACKed row (a row sent in a group is told the group's time:
        send_many answers when the group's last ACK is in)."""

    def link_batches_refused(self, peer: str) -> None:
        """``peer`` answered a links.put ``unknown_kind``: it reads one link per envelope only."""


@dataclass
class _AckBatch:
    """ACKed rows of one peer whose outbox deletes share one writer job; ``done`` resolves after the commit."""

    rows: list[OutboxRow]
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class _Peer:
    """One peer's worker state."""

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Outbox ids being sent now, and their envelopes' bytes.
    inflight: set[int] = field(default_factory=set)
    inflight_bytes: int = 0
    # Rows handed over after their commit, not yet sent, by correlation id (insertion order).
    fresh: OrderedDict[str, OutboxRow] = field(default_factory=OrderedDict)
    attempted: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # Correlation ids whose attempt ended since the current poll began: that read may predate the attempt's
    # commit, so these are skipped once rather than sent again.
    settled: set[str] = field(default_factory=set)
    # Poll at the next turn: asked for (start, link up, CLI), or the last poll or hand-off left rows behind.
    poll_wanted: bool = True
    # The link came up: rows that failed for want of it are due now, not at their retry time.
    link_came_up: bool = False
    backlog: bool = False
    # The envelope bytes of a row that did not fit what was left of the window (0: none), and whether the poll
    # (rather than the hand-off) offered it: nothing more is taken until that much room is free.
    waiting_bytes: int = 0
    waiting_polled: bool = False


class OutboxSender:
    """Delivers the outbox to ``links`` (one worker per peer), resending on ``schedule`` (a2a.retry_delays_s);
    ``clock_ms``: unix ms; ``listener`` is told of ACKs, their latency and a peer refusing links.put;
    ``window_bytes``: envelope bytes in flight to one peer at once (federation.send_window_bytes)."""

    def __init__(self, db: Database, links: dict[str, PeerLink], schedule: RetrySchedule,
                 clock_ms: Callable[[], int], listener: SendListener, *, window_bytes: int = SEND_WINDOW_BYTES) -> None:
        if window_bytes <= 0:
            raise ValueError(f"window_bytes must be > 0, got {window_bytes!r}")
        self.db = db
        self.window_bytes = window_bytes
        self.links = links
        self.schedule = schedule
        self.clock_ms = clock_ms
        self.listener = listener
        self._peers = {peer: _Peer() for peer in links}
        # The open ACK batch per peer: the ACKs settled in one loop turn join it (see _record_acks).
        self._ack_batches: dict[str, _AckBatch] = {}
        self._stopping = False
        self._links_changed = asyncio.Event()
        # The shared periodic read: the POLL_S tick it was made in, and its answer (or the read in flight).
        self._due_tick = -1
        self._due_read: asyncio.Future[frozenset[str] | None] | None = None
        self.delivered = 0
        self.dead_lettered = 0
        self.unpacked = 0
        # The database refusing the workers' polls (which then pause), or their bookkeeping (the rows stay due):
        # each logged once while it lasts (node/pause.py). Apart: a full disk refuses the writes only.
        self.pause = StoragePause("outbox", log)
        self.book_pause = StoragePause("outbox:bookkeeping", log)

    def wake(self, peer: str | None = None) -> None:
        """Look in the database now (a link came up, another process queued rows, stopping)."""
        for p, state in self._peers.items():
            if peer is None or p == peer:
                state.poll_wanted = True
                state.wake.set()

    def link_up(self, peer: str) -> None:
        """``peer``'s link came up: the rows waiting for a retry because it was down go out now (a dead letter
        replayed while the link was down among them), then the database is looked in as ``wake`` does."""
        state = self._peers.get(peer)
        if state is not None:
            state.link_came_up = True
        self.wake(peer)

    def hand_off(self, rows: Sequence[OutboxRow]) -> None:
        """Rows a write of this process just committed: sent without reading them back."""
        for row in rows:
            state = self._peers.get(row.peer)
            if state is None:
                continue  # no link to that peer: the orphan sweep's business
            if len(state.fresh) >= HANDOFF_MAX:
                state.backlog = True  # in the database all the same: the poll finds it
                continue
            state.fresh[row.correlation_id] = row
            state.wake.set()

    def inflight(self, peer: str) -> int:
        state = self._peers.get(peer)
        return len(state.inflight) if state is not None else 0

    async def run(self) -> None:
        """One worker per peer in ``links``, following it as the node adds and removes peers (``peers_changed``)."""
        await self._orphans_to_dead_letters()
        workers: dict[str, asyncio.Task[None]] = {}
        async with asyncio.TaskGroup() as tg:
            while not self._stopping:
                self._links_changed.clear()
                gone = [p for p in workers if p not in self.links]
                for peer in gone:
                    workers.pop(peer)
                    state = self._peers.pop(peer, None)  # its worker ends at its next turn (its state is gone)
                    if state is not None:
                        state.wake.set()
                if gone:
                    await self._orphans_to_dead_letters()
                for peer in self.links:
                    if peer not in workers:
                        self._peers.setdefault(peer, _Peer())
                        workers[peer] = tg.create_task(self._worker(peer), name=f"outbox:{peer}")
                await self._links_changed.wait()

    def peers_changed(self) -> None:
        """The node added or removed peers in ``links``: start their workers, end the removed ones' (their rows go
        to the dead letters, as at a start without them)."""
        self._links_changed.set()
        self.wake()

    async def _orphans_to_dead_letters(self) -> None:
        """Rows for a peer this node has no link to (removed from the config) would wait forever."""
        now = self.clock_ms()
        try:
            moved = await self.db.write(outbox.dead_letter_peers_except, sorted(self.links),
                                        "no [[mesh.peers]] entry for this peer", now)
        except StorageError as e:  # the store away, damaged or full: the workers wait on it; the next start sweeps
            self.pause.failed(e, "orphans to dead letters")
            return
        if moved:
            log.warning("dead_letter", extra={"ev": {"count": moved, "error": "peer not configured"}})

    def stop(self) -> None:
        self._stopping = True
        self._links_changed.set()
        self.wake()

    async def _worker(self, peer: str) -> None:
        state = self._peers[peer]
        loop = asyncio.get_running_loop()
        next_poll = loop.time()
        async with asyncio.TaskGroup() as tg:
            while not self._stopping and self._peers.get(peer) is state:
                state.wake.clear()
                if state.link_came_up:
                    state.link_came_up = False
                    await self._due_after_link_down(peer)
                room = SEND_WINDOW - len(state.inflight)
                budget = _Budget(self.window_bytes - state.inflight_bytes, first=not state.inflight)
                rows: list[OutboxRow] = []
                # A row that did not fit what was left of the window waits for that much room, and nothing is taken
                # meanwhile: each ACK's room would go to the smaller rows behind it, and it would wait for the whole
                # backlog (or its TTL). It went to the hand-off's head or was the poll's first row left, so that
                # source is asked first once the room is there.
                waiting = state.waiting_bytes
                if budget.fits(waiting):
                    state.waiting_bytes = 0
                    if not (waiting and state.waiting_polled):
                        rows = self._take_fresh(state, room, budget)
                    if (room > len(rows) and budget.left > 0 and not state.waiting_bytes
                            and (state.poll_wanted or state.backlog or loop.time() >= next_poll)):
                        periodic = not (state.poll_wanted or state.backlog)
                        state.poll_wanted = False
                        next_poll = (math.floor(loop.time() / POLL_S) + 1) * POLL_S  # the next tick of the grid
                        polled, pause_s = await self._poll_due(peer, state, loop, periodic, room - len(rows), rows,
                                                               budget)
                        rows += polled
                        next_poll = max(next_poll, loop.time() + pause_s)
                    if waiting and state.waiting_polled and not state.waiting_bytes:
                        rows += self._take_fresh(state, room - len(rows), budget)
                for group in _groups(rows):
                    state.inflight.update(r.id for r in group)
                    state.inflight_bytes += sum(len(r.envelope) for r in group)
                    tg.create_task(self._attempt(peer, group))
                # While a row waits for room only an ACK (or stopping) can change anything: no periodic poll.
                timeout = None if state.waiting_bytes and state.inflight else max(0.0, next_poll - loop.time())
                try:
                    await asyncio.wait_for(state.wake.wait(), timeout)
                except TimeoutError:
                    pass

    async def _due_after_link_down(self, peer: str) -> None:
        try:
            n = await self.db.write(outbox.due_now, peer, self.clock_ms(), f"{MeshCode.LINK_DOWN}:")
        except StorageError as e:  # they go at their retry time then
            self.book_pause.failed(e, "link up")
            return
        if n:
            log.info("sent_on_link_up", extra={"ev": {"peer": peer, "rows": n}})

    async def _poll_due(self, peer: str, state: _Peer, loop: asyncio.AbstractEventLoop, periodic: bool, room: int,
                        taking: list[OutboxRow], budget: _Budget) -> tuple[list[OutboxRow], float]:
        """(The peer's due rows, 0); a periodic poll reads them only if the shared read says it holds some. When the
        database refuses (away, full, damaged): (none, the seconds to pause before the next poll)."""
        try:
            due = await self._peers_due(loop) if periodic else None  # None: any peer may hold some
            rows = await self._poll(peer, state, room, taking, budget) if due is None or peer in due else []
        except StorageError as e:
            return [], self.pause.failed(e, "poll")
        self.pause.ok()
        return rows, 0.0

    async def _peers_due(self, loop: asyncio.AbstractEventLoop) -> frozenset[str] | None:
        """The peers holding due rows, read once for all the workers whose periodic poll falls in this tick."""
        tick = math.floor(loop.time() / POLL_S)
        if self._due_read is None or self._due_tick != tick:
            self._due_tick = tick
            self._due_read = asyncio.ensure_future(self.db.read(outbox.peers_due, self.clock_ms(), DUE_PEERS_SCAN))
        return await asyncio.shield(self._due_read)  # one worker stopping does not cancel the others' read

    def _take_fresh(self, state: _Peer, room: int, budget: _Budget) -> list[OutboxRow]:
        rows: list[OutboxRow] = []
        while state.fresh and len(rows) < room:
            cid, row = next(iter(state.fresh.items()))
            if cid in state.attempted or row.id in state.inflight:
                del state.fresh[cid]
                continue  # the poll got there first
            if not budget.take(len(row.envelope)):
                state.waiting_bytes, state.waiting_polled = len(row.envelope), False
                break  # stays handed over: sent when ACKs make room
            del state.fresh[cid]
            self._attempting(state, cid)
            rows.append(row)
        return rows

    async def _poll(self, peer: str, state: _Peer, room: int, taking: list[OutboxRow],
                    budget: _Budget) -> list[OutboxRow]:
        """Due rows not in flight, not waiting in the hand-off and not just taken from it, within the window."""
        state.settled.clear()
        held = sorted(state.inflight | {r.id for r in state.fresh.values()} | {r.id for r in taking})
        limit = min(room, GROUP_MAX)  # each read carries the rows' envelopes: no more than a group's worth
        polled = await self.db.read(outbox.due_for_peer, peer, self.clock_ms(), limit, held)
        state.backlog = len(polled) == limit
        rows = []
        for row in polled:
            cid = row.correlation_id
            if row.id in state.inflight or cid in state.settled or cid in state.fresh:
                continue  # sent (or handed over) while the read ran
            if not budget.take(len(row.envelope)):
                state.backlog = True  # still due in the database: the next poll reads it again
                state.waiting_bytes, state.waiting_polled = len(row.envelope), True
                break
            self._attempting(state, cid)
            rows.append(row)
        return rows

    @staticmethod
    def _attempting(state: _Peer, cid: str) -> None:
        state.attempted[cid] = None
        while len(state.attempted) > ATTEMPTED_MEMORY:
            state.attempted.popitem(last=False)

    async def _attempt(self, peer: str, rows: list[OutboxRow]) -> None:
        state = self._peers[peer]
        try:
            await self._deliver(peer, rows)
        except StorageError as e:  # the database refused the bookkeeping (away, full): the rows stay due
            self.book_pause.failed(e, "delivery")
        except Exception as e:
            log.error("outbox_attempt_failed", extra={"ev": {"peer": peer, "rows": len(rows),
                                                             "error": f"{type(e).__name__}: {e}"}})
        finally:
            for row in rows:
                state.inflight.discard(row.id)
                state.settled.add(row.correlation_id)
            state.wake.set()

    async def _deliver(self, peer: str, rows: list[OutboxRow]) -> None:
        state = self._peers[peer]
        try:
            now = self.clock_ms()
            for row in rows:
                if row.expires_at <= now:
                    await self._booking(peer, "dead letter", functools.partial(
                        self._dead_letter, row, row.last_error or "expired before it could be delivered"))
            live = [r for r in rows if r.expires_at > now]
            if not live:
                return
            for r in live:
                if r.replayed_from is not None and r.attempts == 0:
                    log.info("dead_letter_replayed", extra={"ev": {"peer": peer, "dead_letter": r.replayed_from,
                                                                   "correlation_id": r.correlation_id, "kind": r.kind}})
            sent = time.perf_counter()
            answers = await self.links[peer].send_many([(r.correlation_id, r.envelope) for r in live])
            took = time.perf_counter() - sent
        finally:
            # The group's bytes leave the window once the peer has answered for them, before the bookkeeping
            # below (deleting the ACKed rows) commits: a writer busy with other work must not hold back the
            # sends. The rows stay in flight until then (``_attempt``), so no poll sends them again, and no more
            # than SEND_WINDOW rows of a peer wait for their bookkeeping.
            state.inflight_bytes -= sum(len(r.envelope) for r in rows)
            state.wake.set()
        acked, rejected, failed = sort_answers(live, answers)
        # Each piece of the bookkeeping stands alone: a write that fails for one (the database busy or full) is
        # logged and leaves those rows due, and must not skip the others' (a failed row would go out again at the
        # next poll, with no back-off).
        if acked:
            await self._booking(peer, "acks", functools.partial(self._book_acks, peer, acked, took))
        for row, reason in rejected:
            await self._booking(peer, "rejection", functools.partial(self._book_rejection, peer, row, reason))
        if failed:
            await self._booking(peer, "failures", functools.partial(self._failed, failed))

    async def _booking(self, peer: str, what: str, book: Callable[[], Awaitable[None]]) -> None:
        """Run one piece of bookkeeping (each writes): a refusal is logged (a storage one once while it lasts)."""
        try:
            await book()
        except StorageError as e:  # the database refused the bookkeeping (away, full): those rows stay due
            self.book_pause.failed(e, what)  # logged once while it lasts
        except Exception as e:
            log.error("outbox_booking_failed", extra={"ev": {"peer": peer, "what": what,
                                                             "error": f"{type(e).__name__}: {e}"}})
        else:
            self.book_pause.ok()

    async def _book_acks(self, peer: str, acked: list[OutboxRow], took: float) -> None:
        if not acked:
            return
        for _ in acked:
            self.listener.on_ack_latency(peer, took)
        await self._record_acks(peer, acked)
        self.delivered += len(acked)
        await self.listener.on_ack(peer, [r.correlation_id for r in acked])

    async def _book_rejection(self, peer: str, row: OutboxRow, reason: str | None) -> None:
        if row.kind == "links.put":
            await self._unpack(peer, row, reason)
        else:
            await self._dead_letter(row, reason)

    async def _record_acks(self, peer: str, rows: list[OutboxRow]) -> None:
        """Delete ACKed rows; returns once that is committed.

        The groups whose ACKs settle in the same loop turn share one writer job: the first opens a batch,
        yields once so the others join it, and writes them all (one thread hop and one peer_state update).
        A failed write fails every row of the batch: each stays due and is resent, which the peer answers
        ``duplicate``.
        """
        batch = self._ack_batches.get(peer)
        if batch is not None:
            batch.rows.extend(rows)
            await asyncio.shield(batch.done)
            return
        batch = self._ack_batches[peer] = _AckBatch(list(rows))
        try:
            await asyncio.sleep(0)
            self._close_ack_batch(batch, peer)
            await self.db.write(_acked, peer, [r.correlation_id for r in batch.rows], self.clock_ms())
        except BaseException as e:
            self._close_ack_batch(batch, peer)
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

    async def _unpack(self, peer: str, row: OutboxRow, reason: str | None) -> None:
        """A links.put the peer refused for good: its links queued again one per link.put row (in place of the
        row, one transaction) and sent at once; a peer that does not know the kind gets single links from now on."""
        if reason == "rejected:unknown_kind":
            self.listener.link_batches_refused(peer)
        try:
            wires = split_links_put(row.envelope)
        except ProtocolError as e:
            await self._dead_letter(row, f"{reason}; cannot be split: {e.message}")
            return
        rows = await self.db.write(_unpacked, row, wires, self.clock_ms())
        self.unpacked += 1
        log.info("links_put_unpacked", extra={"ev": {"peer": peer, "correlation_id": row.correlation_id,
                                                     "links": len(wires), "reason": reason}})
        self.hand_off(rows)

    async def _failed(self, failed: list[tuple[OutboxRow, str]]) -> None:
        """Schedule the next attempt of each row (one writer job), or dead-letter those out of attempts."""
        if not failed:
            return
        now = self.clock_ms()
        retries: list[tuple[int, int, int, str]] = []
        for row, error in failed:
            attempts = row.attempts + 1
            nxt = self.schedule.next_attempt_at(attempts, now, row.expires_at)
            if nxt is None:
                await self._booking(row.peer, "dead letter", functools.partial(self._dead_letter, row, error, attempts))
                continue
            retries.append((row.id, attempts, nxt, error))
            log.info("retry_scheduled", extra={"ev": {"peer": row.peer, "correlation_id": row.correlation_id,
                                                      "attempt": attempts, "next_attempt_at": nxt, "error": error}})
        if retries:
            await self.db.write(_mark_attempts, retries)

    async def _dead_letter(self, row: OutboxRow, error: str | None, attempts: int | None = None) -> None:
        if attempts is not None:
            await self.db.write(outbox.mark_attempt, row.id, attempts, row.next_attempt_at, error)
        await self.db.write(outbox.to_dead_letter, row.id, error, self.clock_ms())
        self.dead_lettered += 1
        log.warning("dead_letter", extra={"ev": {"peer": row.peer, "correlation_id": row.correlation_id,
                                                 "kind": row.kind, "attempts": attempts or row.attempts,
                                                 "error": error}})


@dataclass
class _Budget:
    """Envelope bytes that may still go out in this turn; with nothing in flight the first row always may."""

    left: int
    first: bool

    def fits(self, n: int) -> bool:
        return n <= self.left or self.first

    def take(self, n: int) -> bool:
        if not self.fits(n):
            return False
        self.first = False
        self.left -= n
        return True


def _groups(rows: list[OutboxRow]) -> list[list[OutboxRow]]:
    """``rows`` in order, in groups of at most GROUP_MAX rows and GROUP_MAX_BYTES (a larger row alone)."""
    groups: list[list[OutboxRow]] = []
    size = 0
    for row in rows:
        n = len(row.envelope)
        if not groups or len(groups[-1]) == GROUP_MAX or size + n > GROUP_MAX_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(row)
        size += n
    return groups


def sort_answers(rows: list[OutboxRow], answers: list[Ack | MeshError],
                 ) -> tuple[list[OutboxRow], list[tuple[OutboxRow, str | None]], list[tuple[OutboxRow, str]]]:
    """(ACKed: the peer holds it, accepted or duplicate; rejected for good; failed, to retry with the reason)."""
    acked: list[OutboxRow] = []
    rejected: list[tuple[OutboxRow, str | None]] = []
    failed: list[tuple[OutboxRow, str]] = []
    for row, answer in zip(rows, answers, strict=True):
        if isinstance(answer, MeshError):
            failed.append((row, f"{answer.code}: {answer.message}"))
        elif answer.accepted or answer.is_duplicate:
            acked.append(row)
        elif answer.permanent:
            rejected.append((row, answer.reason))
        else:
            failed.append((row, answer.reason or "not accepted"))
    return acked, rejected, failed


def _acked(conn: Any, peer: str, correlation_ids: list[str], now_ms: int) -> None:
    outbox.remove_many(conn, peer, correlation_ids)
    changelog.set_peer_state(conn, peer, last_ack_at=now_ms)


def _unpacked(conn: Any, row: OutboxRow, wires: list[tuple[str, bytes]], now_ms: int) -> list[OutboxRow]:
    """Replace ``row`` by one link.put row per link (none when the row is gone meanwhile)."""
    if not outbox.remove(conn, row.correlation_id, row.peer):
        return []
    rows = [outbox.enqueue_row(conn, cid, row.peer, "link.put", wire, row.expires_at, now_ms, now_ms)
            for cid, wire in wires]
    return [r for r in rows if r is not None]


def _mark_attempts(conn: Any, retries: list[tuple[int, int, int, str]]) -> None:
    for id, attempts, nxt, error in retries:
        outbox.mark_attempt(conn, id, attempts, nxt, error)
