"""The outbox sender follows the peers a configuration reload adds and removes (the node's shared links dict):
an added peer gets its worker and its rows, a removed one's worker ends and its queued rows go to the dead
letters, as at a start without it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from a2a import RetrySchedule
from node.federation.sender import OutboxSender
from storage import Database, outbox
from tests.node.conftest import Acks
from tests.node.test_outbox_sender import AckingLink

B, C = "ai:b@test", "ai:c@test"


async def until(predicate, what: str) -> None:
    for _ in range(500):  # bounded: 5 s at most
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_peer_added_gets_its_rows_and_a_peer_removed_has_its_rows_dead_lettered(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    links = {B: AckingLink()}
    acked: list[str] = []
    sender = OutboxSender(db, links, RetrySchedule(), lambda: 1_000, Acks(acked))  # type: ignore[arg-type]
    task = asyncio.create_task(sender.run())
    try:
        c = links[C] = AckingLink()  # the reload adds C (then the federation's policy queues rows for it)
        sender.peers_changed()
        for_c = str(uuid.uuid4())
        await db.write(outbox.enqueue, for_c, C, "ping", b"\xa0", 10**13, 0, 1)
        sender.wake(C)  # as a write's hand-off or the poll would
        await until(lambda: asyncio.sleep(0, for_c in acked), "C's row ACKed")
        assert c.sent == [for_c]

        del links[B]  # the reload removes B
        sender.peers_changed()
        for_b = str(uuid.uuid4())
        await db.write(outbox.enqueue, for_b, B, "ping", b"\xa0", 10**13, 0, 2)
        sender.peers_changed()  # a second reload: B's row, queued meanwhile, waits for nobody
        await until(lambda: db.read(outbox.dead_letter_count, B), "B's row dead-lettered")
        assert await db.read(outbox.depth, B) == 0 and for_b not in acked
    finally:
        sender.stop()
        await asyncio.wait_for(task, 5)
        await db.close()
