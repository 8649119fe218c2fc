"""The outbox sender against a fake peer link: what leaves the outbox, and how many writer jobs it takes."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from a2a import Ack, RetrySchedule
from node.outbox import OutboxSender
from storage import Database, outbox

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

    async def on_ack(peer: str, cid: str) -> None:
        acked.append(cid)

    sender = OutboxSender(db, {PEER: link}, RetrySchedule(), lambda: 1_000, on_ack)  # type: ignore[dict-item]
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
