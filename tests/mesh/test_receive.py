"""The shared receive function: concurrent copies of one message, and what an apply failure means."""

import asyncio

from a2a import Ack, SeenCache, new_envelope
from mesh.receive import Receiver

ME, PEER = "ai:b", "ai:a"
NOW = 1_000_000


def _receiver(apply) -> Receiver:
    return Receiver(ME, SeenCache(100, clock=lambda: NOW), apply, max_bytes=1 << 20, clock_ms=lambda: NOW)


def _frame() -> bytes:
    return new_envelope(PEER, [ME], {"kind": "ping"}, NOW, 60_000).to_wire()


async def test_second_copy_in_flight_waits_and_is_acked_duplicate_after_a_stored_first() -> None:
    gate = asyncio.Event()
    applied = []

    async def apply(env, sender):
        applied.append(env.correlation_id)
        await gate.wait()
        return Ack.ok(env.correlation_id, ME)

    r = _receiver(apply)
    frame = _frame()
    first = asyncio.create_task(r.receive(frame, PEER))
    second = asyncio.create_task(r.receive(frame, PEER))
    await asyncio.sleep(0)
    gate.set()
    a, b = await asyncio.gather(first, second)
    assert a.ack.accepted and b.ack.is_duplicate and len(applied) == 1


async def test_second_copy_is_applied_when_the_first_apply_failed() -> None:
    calls = 0

    async def apply(env, sender):
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        if calls == 1:
            raise OSError("disk trouble")
        return Ack.ok(env.correlation_id, ME)

    r = _receiver(apply)
    frame = _frame()
    a, b = await asyncio.gather(r.receive(frame, PEER), r.receive(frame, PEER))
    assert a.ack is None  # not stored: no ACK, the sender retries
    assert b.ack.accepted and calls == 2
