"""The outbox sender against fake peer links (real SQLite): what leaves the outbox, how rows handed over in
memory are sent, and how many writer jobs it takes."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from a2a import Ack, RetrySchedule
from mesh.errors import MeshError
from node.config import SEND_WINDOW_BYTES
from node.federation.sender import OutboxSender
from storage import Database, StorageError, outbox
from storage.outbox import OutboxRow
from tests.node.conftest import Acks

PEER = "ai:b@test"
ROWS = 40


class AckingLink:
    """Answers every frame accepted, all ACKs of a burst in the same loop turn (as one socket read does)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._burst: list[tuple[str, asyncio.Future[Ack]]] = []

    async def send_wire(self, correlation_id: str, frame: bytes, **_: Any) -> Ack:
        fut: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self.sent.append(correlation_id)
        self._burst.append((correlation_id, fut))
        if len(self._burst) == 1:
            asyncio.get_running_loop().call_later(0.01, self._answer)
        return await fut

    async def send_many(self, frames: Sequence[tuple[str, bytes]], **_: Any) -> list[Ack | MeshError]:
        return list(await asyncio.gather(*(self.send_wire(cid, w) for cid, w in frames)))

    def _answer(self) -> None:
        burst, self._burst = self._burst, []
        for cid, fut in burst:
            fut.set_result(Ack.ok(cid, PEER))


async def _sent_and_settled(tmp_path: Path) -> tuple[AckingLink, OutboxSender, Database, tuple[int, int]]:
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    for i in range(ROWS):
        await db.write(outbox.enqueue, str(uuid.uuid4()), PEER, "ping", b"\xa0", 10**13, 0, i)
    link = AckingLink()
    acked: list[str] = []
    sender = OutboxSender(db, {PEER: link}, RetrySchedule(), lambda: 1_000, Acks(acked))  # type: ignore[dict-item]
    before = db.commit_stats
    task = asyncio.create_task(sender.run())
    try:
        for _ in range(500):  # bounded: 5 s at most
            if len(acked) == ROWS and await db.read(outbox.depth) == 0:
                break
            await asyncio.sleep(0.01)
    finally:
        sender.stop()
        await asyncio.wait_for(task, 5)
    after = db.commit_stats
    return link, sender, db, (after[1] - before[1], len(acked))


async def test_every_acked_row_leaves_the_outbox_once(tmp_path: Path) -> None:
    link, sender, db, (_, acked) = await _sent_and_settled(tmp_path)
    try:
        assert sorted(link.sent) == sorted(set(link.sent)) and len(link.sent) == ROWS
        assert acked == ROWS and sender.delivered == ROWS
        assert await db.read(outbox.depth) == 0
    finally:
        await db.close()


async def test_acks_read_together_are_deleted_in_one_writer_job(tmp_path: Path) -> None:
    _, _, db, (jobs, acked) = await _sent_and_settled(tmp_path)
    try:
        assert acked == ROWS
        assert jobs < ROWS // 4, f"{jobs} writer jobs for {ROWS} ACKs that arrived in one burst"
    finally:
        await db.close()


class GroupLink(AckingLink):
    """A link with send_many: records each group; ``answer`` False leaves every frame unanswered (a peer gone
    silent), so the rows stay in flight until the sender is stopped."""

    def __init__(self, answer: bool = True) -> None:
        super().__init__()
        self.groups: list[int] = []
        self.answer = answer

    async def send_many(self, frames: Sequence[tuple[str, bytes]], **_: Any) -> list[Ack | MeshError]:
        self.groups.append(len(frames))
        if not self.answer:
            self.sent.extend(cid for cid, _ in frames)
            await asyncio.Event().wait()
        return await super().send_many(frames)


async def _enqueued(db: Database, n: int) -> list[OutboxRow]:
    def write(conn: Any) -> list[OutboxRow]:
        rows = [outbox.enqueue_row(conn, str(uuid.uuid4()), PEER, "ping", b"\xa0", 10**13, 0, i) for i in range(n)]
        return [r for r in rows if r is not None]
    return await db.write(write)


def _refuse(db: Database, job: str, error: StorageError) -> list[str]:
    """Make ``db`` refuse every writer job ``job`` (by the function's name) with ``error``; returns the list the
    refusals are recorded in."""
    real_write, refused = db.write, []

    async def refusing(fn: Any, *args: Any) -> Any:
        if fn.__name__ == job:
            refused.append(job)
            raise error
        return await real_write(fn, *args)

    db.write = refusing  # type: ignore[method-assign]
    return refused


async def _enqueued_expiring(db: Database, expiries: list[int]) -> list[OutboxRow]:
    def write(conn: Any) -> list[OutboxRow]:
        rows = [outbox.enqueue_row(conn, str(uuid.uuid4()), PEER, "ping", b"\xa0", expires, 0, i)
                for i, expires in enumerate(expiries)]
        return [r for r in rows if r is not None]
    return await db.write(write)


async def _run_until(sender: OutboxSender, done: Any, *, crash: bool = False) -> None:
    task = asyncio.create_task(sender.run())
    try:
        for _ in range(500):  # bounded: 5 s at most
            if await done():
                break
            await asyncio.sleep(0.01)
    finally:
        if crash:
            task.cancel()  # as the process dying: the rows in flight are abandoned mid-send
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
        else:
            sender.stop()
            await asyncio.wait_for(task, 5)


def _sender(db: Database, link: Any, acked: list[str], window_bytes: int = SEND_WINDOW_BYTES) -> OutboxSender:
    return OutboxSender(db, {PEER: link}, RetrySchedule(), lambda: 1_000, Acks(acked), window_bytes=window_bytes)


async def test_rows_handed_over_and_polled_too_are_sent_once_in_groups(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    try:
        rows = await _enqueued(db, ROWS)
        link, acked = GroupLink(), []
        sender = _sender(db, link, acked)
        sender.hand_off(rows)  # and the first poll sees the same rows in the database
        sender.hand_off(rows[:5])  # a second hand-off of the same rows changes nothing

        async def done() -> bool:
            return len(acked) == ROWS and await db.read(outbox.depth) == 0
        await _run_until(sender, done)
        assert sorted(link.sent) == sorted({r.correlation_id for r in rows}), "each row sent exactly once"
        assert sorted(acked) == sorted(link.sent)
        assert len(link.groups) <= 2 and sum(link.groups) == ROWS, link.groups
    finally:
        await db.close()


async def test_rows_handed_over_to_a_sender_that_dies_are_delivered_after_a_restart(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    try:
        rows = await _enqueued(db, ROWS)
        silent = GroupLink(answer=False)
        first = _sender(db, silent, [])
        first.hand_off(rows)

        async def all_in_flight() -> bool:
            return len(silent.sent) == ROWS
        await _run_until(first, all_in_flight, crash=True)  # every row sent, none ACKed
        assert await db.read(outbox.depth) == ROWS, "no row leaves the outbox without its ACK"

        link, acked = GroupLink(), []
        second = _sender(db, link, acked)  # a new process: nothing handed over, the database is the truth

        async def done() -> bool:
            return await db.read(outbox.depth) == 0
        await _run_until(second, done)
        assert sorted(link.sent) == sorted(r.correlation_id for r in rows)
        assert sorted(acked) == sorted(link.sent)
    finally:
        await db.close()


class WindowLink(AckingLink):
    """Records the envelope bytes in flight at once (ACKs come 10 ms after a burst, as in AckingLink)."""

    def __init__(self) -> None:
        super().__init__()
        self.inflight = self.most = 0

    async def send_many(self, frames: Sequence[tuple[str, bytes]], **_: Any) -> list[Ack | MeshError]:
        size = sum(len(w) for _, w in frames)
        self.inflight += size
        self.most = max(self.most, self.inflight)
        try:
            return await super().send_many(frames)
        finally:
            self.inflight -= size


@pytest.mark.parametrize("window, row_bytes", [(SEND_WINDOW_BYTES, 30_000), (16 * 1024, 7_000)])
async def test_envelope_bytes_in_flight_stay_within_the_window_handed_over_or_polled(tmp_path: Path, window: int,
                                                                                      row_bytes: int) -> None:
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    try:
        big = b"\xa0" + b"\x00" * row_bytes  # about a full links.put, or a quarter of one

        def write(conn: Any) -> list[OutboxRow]:
            rows = [outbox.enqueue_row(conn, str(uuid.uuid4()), PEER, "links.put", big, 10**13, 0, i)
                    for i in range(20)]
            return [r for r in rows if r is not None]
        rows = await db.write(write)
        link, acked = WindowLink(), []
        sender = _sender(db, link, acked, window)
        sender.hand_off(rows[:10])  # the other ten only in the database

        async def done() -> bool:
            return len(acked) == 20 and await db.read(outbox.depth) == 0
        await _run_until(sender, done)
        assert sorted(link.sent) == sorted(r.correlation_id for r in rows)
        assert window - row_bytes < link.most <= window  # the window filled, never passed
        # A row larger than the whole window still goes (alone).
        huge = await db.write(outbox.enqueue_row, str(uuid.uuid4()), PEER, "links.put",
                              b"\x00" * (window + 1), 10**13, 0, 99)
        link2, acked2 = WindowLink(), []
        sender2 = _sender(db, link2, acked2, window)
        sender2.hand_off([huge])

        async def done2() -> bool:
            return acked2 == [huge.correlation_id]
        await _run_until(sender2, done2)
        assert link2.sent == [huge.correlation_id]
    finally:
        await db.close()


async def test_acked_bytes_leave_the_window_before_their_rows_are_deleted(tmp_path: Path) -> None:
    """A writer busy elsewhere (the deletes of ACKed rows held back) does not stall the sends: what bounds them is
    the bytes the peer has not answered for. No row is sent twice while its delete waits, and every row leaves
    the outbox once the writer gets to it."""
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    try:
        big = b"\xa0" + b"\x00" * 30_000  # about a full links.put: two fill the window

        def write(conn: Any) -> list[OutboxRow]:
            rows = [outbox.enqueue_row(conn, str(uuid.uuid4()), PEER, "links.put", big, 10**13, 0, i)
                    for i in range(12)]
            return [r for r in rows if r is not None]
        rows = await db.write(write)
        release = asyncio.Event()
        held: list[str] = []
        real_write = db.write

        async def slow_deletes(fn: Any, *args: Any) -> Any:
            if fn.__name__ == "_acked":
                held.append(fn.__name__)
                await release.wait()
            return await real_write(fn, *args)

        db.write = slow_deletes  # type: ignore[method-assign]
        link, acked = WindowLink(), []
        sender = _sender(db, link, acked)
        sender.hand_off(rows)

        async def all_sent() -> bool:
            return len(link.sent) == len(rows)
        task = asyncio.create_task(_run_until(sender, all_sent))
        for _ in range(500):  # bounded: 5 s at most
            if len(link.sent) == len(rows) or task.done():
                break
            await asyncio.sleep(0.01)
        assert len(link.sent) == len(rows), f"{len(link.sent)} of {len(rows)} sent while the deletes wait"
        assert held and not acked
        assert await db.read(outbox.depth) == len(rows), "no row leaves the outbox before its delete"
        assert 0 < link.most <= SEND_WINDOW_BYTES
        release.set()
        await task

        async def done() -> bool:
            return len(acked) == len(rows) and await db.read(outbox.depth) == 0
        await _run_until(_sender(db, link, acked), done)  # a fresh sender: the first was stopped
        assert sorted(link.sent) == sorted(r.correlation_id for r in rows), "each row sent exactly once"
    finally:
        await db.close()


async def test_idle_workers_share_one_read_a_tick_and_a_row_written_behind_their_back_still_goes_out(
        tmp_path: Path) -> None:
    """Five idle peers: their periodic polls make one shared read of which peers hold due rows per POLL_S tick,
    not one read each; a row another process writes for one of them (the CLI) is found by the next tick and
    sent, and the shared read never hides a due row (past DUE_PEERS_SCAN rows every peer reads its own)."""
    from node.federation import sender as node_outbox

    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    peers = [f"ai:p{i}@test" for i in range(5)]
    links = {p: AckingLink() for p in peers}
    reads: list[str] = []
    real_read = db.read

    async def counted(fn: Any, *args: Any) -> Any:
        reads.append(fn.__name__)
        return await real_read(fn, *args)

    db.read = counted  # type: ignore[method-assign]

    sender = OutboxSender(db, links, RetrySchedule(), lambda: 1_000, Acks())  # type: ignore[arg-type]
    task = asyncio.create_task(sender.run())
    try:
        await asyncio.sleep(0.2)  # the start polls (one per peer, asked for) are done
        reads.clear()
        await asyncio.sleep(4 * node_outbox.POLL_S)
        ticks = reads.count("peers_due")
        assert 3 <= ticks <= 5 and reads.count("due_for_peer") == 0, reads
        cid = str(uuid.uuid4())
        await db.write(outbox.enqueue, cid, peers[3], "ping", b"\xa0", 10**13, 0, 1)  # behind the sender's back
        for _ in range(40):  # bounded: two ticks and some
            if links[peers[3]].sent:
                break
            await asyncio.sleep(0.05)
        assert links[peers[3]].sent == [cid] and not any(links[p].sent for p in peers if p != peers[3])
    finally:
        sender.stop()
        await asyncio.wait_for(task, 5)
    try:
        for i in range(3):
            await db.write(outbox.enqueue, str(uuid.uuid4()), peers[i], "ping", b"\xa0", 10**13, 500, 1)
        assert await real_read(outbox.peers_due, 1_000, 3) == frozenset(peers[:3])
        assert await real_read(outbox.peers_due, 1_000, 2) is None  # more due rows than scanned: any peer may
        assert await real_read(outbox.peers_due, 499, 10) == frozenset()  # none due yet
    finally:
        await db.close()


class FailingLink(AckingLink):
    """Frames fail as a dropped connection would: every one, or (``ack_first``) all but each group's first."""

    def __init__(self, *, ack_first: bool = False) -> None:
        super().__init__()
        self.ack_first = ack_first

    async def send_many(self, frames: Sequence[tuple[str, bytes]], **_: Any) -> list[Ack | MeshError]:
        self.sent.extend(cid for cid, _ in frames)
        await asyncio.sleep(0)
        dropped = MeshError("peer_unreachable", "the connection dropped")
        return [Ack.ok(cid, PEER) if i == 0 and self.ack_first else dropped for i, (cid, _) in enumerate(frames)]


async def test_a_failed_ack_delete_still_schedules_the_groups_failed_rows_retry(tmp_path: Path) -> None:
    """The ACKed row's delete fails (the database busy): the group's failed rows still get their attempt counted
    and their back-off, rather than going out again at the next poll; the ACKed row stays due, and goes again."""
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    try:
        rows = await _enqueued(db, 3)
        refused = _refuse(db, "_acked", StorageError("busy", "database is locked"))
        link, acked = FailingLink(ack_first=True), []
        sender = _sender(db, link, acked)
        sender.hand_off(rows)

        async def stored() -> dict[int, OutboxRow | None]:
            return {r.id: await db.read(outbox.get, r.id) for r in rows}

        async def attempted() -> bool:
            now = await stored()
            return bool(refused) and all(now[r.id] is not None and now[r.id].attempts == 1  # type: ignore[union-attr]
                                         for r in rows[1:])
        await _run_until(sender, attempted)
        now = await stored()
        assert refused and not acked
        assert all(now[r.id] is not None for r in rows), "nothing leaves the outbox"
        assert now[rows[0].id].attempts == 0, "the ACKed row stays due as it was"  # type: ignore[union-attr]
        for r in rows[1:]:
            row = now[r.id]
            assert row is not None and row.attempts == 1 and row.next_attempt_at > 1_000
            assert row.last_error == "peer_unreachable: the connection dropped"
    finally:
        await db.close()



class SerialLink(AckingLink):
    """Answers the groups one at a time, in the order they were sent, each 5 ms after the one before: the window
    frees a group's bytes at a time, as a busy peer's ACKs come back."""

    def __init__(self) -> None:
        super().__init__()
        self._turn = asyncio.Lock()

    async def send_many(self, frames: Sequence[tuple[str, bytes]], **_: Any) -> list[Ack | MeshError]:
        self.sent.extend(cid for cid, _ in frames)
        async with self._turn:
            await asyncio.sleep(0.005)
        return [Ack.ok(cid, PEER) for cid, _ in frames]


async def test_a_row_that_waits_for_room_is_not_overtaken_by_smaller_ones(tmp_path: Path) -> None:
    """A row too large for what is left of the window waits for room, and the smaller rows behind it (polled from
    the database) wait too: otherwise each ACK's room goes to them, and the large row waits for the whole
    backlog (or its TTL)."""
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    try:
        def write(conn: Any) -> list[OutboxRow]:
            rows = [outbox.enqueue_row(conn, str(uuid.uuid4()), PEER, "links.put", b"\xa0" + b"\x00" * size,
                                       10**13, 0, i) for i, size in enumerate([30_000, 40_000] + [2_000] * 60)]
            return [r for r in rows if r is not None]
        rows = await db.write(write)
        first, large, small = rows[0], rows[1], rows[2:]
        link, acked = SerialLink(), []
        sender = _sender(db, link, acked)
        sender.hand_off([first, large])  # the small rows only in the database: the poll finds them

        async def done() -> bool:
            return len(acked) == len(rows) and await db.read(outbox.depth) == 0
        await _run_until(sender, done)
        assert sorted(link.sent) == sorted(r.correlation_id for r in rows)
        overtaken = link.sent.index(large.correlation_id) - 1  # at most the window's worth taken with the first row
        assert overtaken <= SEND_WINDOW_BYTES // 2_000, f"{overtaken} of {len(small)} small rows went first"
    finally:
        await db.close()


async def test_a_failed_dead_letter_write_does_not_skip_the_other_rows_retry(tmp_path: Path, caplog: Any) -> None:
    """In one group, a row out of time goes to dead letters and the others get their back-off: the dead letter's
    write failing leaves that row due and logged, and the others' retries are still booked."""
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    try:
        # The first expires before its first retry would be due (clock 1,000 ms, first delay 1 s).
        rows = await _enqueued_expiring(db, [1_500, 10**13, 10**13])
        _refuse(db, "to_dead_letter", StorageError("storage_full", "database or disk is full"))
        sender = _sender(db, FailingLink(), [])
        sender.hand_off(rows)

        async def booked() -> bool:
            now = [await db.read(outbox.get, row.id) for row in rows[1:]]
            return all(r is not None and r.attempts >= 1 for r in now)
        with caplog.at_level("WARNING", logger="node.outbox"):
            await _run_until(sender, booked)
        for row in rows[1:]:
            got = await db.read(outbox.get, row.id)
            assert got is not None and got.attempts == 1 and got.next_attempt_at == 2_000
        assert await db.read(outbox.get, rows[0].id) is not None, "the dead letter's write failed: still due"
        assert sender.dead_lettered == 0
        assert any(getattr(r, "ev", {}).get("what") == "dead letter" for r in caplog.records)
    finally:
        await db.close()


async def test_an_expired_rows_failed_dead_letter_does_not_hold_back_the_live_rows(tmp_path: Path, caplog: Any) -> None:
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    try:
        expired, live = await _enqueued_expiring(db, [500, 10**13])  # the first expired (clock 1,000 ms)
        _refuse(db, "to_dead_letter", StorageError("storage_full", "database or disk is full"))
        link, acked = AckingLink(), []
        sender = _sender(db, link, acked)
        sender.hand_off([expired, live])

        async def delivered() -> bool:
            return live.correlation_id in acked
        with caplog.at_level("WARNING", logger="node.outbox"):
            await _run_until(sender, delivered)
        assert link.sent == [live.correlation_id] and acked == [live.correlation_id]
        assert await db.read(outbox.get, expired.id) is not None, "its dead letter failed: still due"
        assert any(getattr(r, "ev", {}).get("what") == "dead letter" for r in caplog.records)
    finally:
        await db.close()
