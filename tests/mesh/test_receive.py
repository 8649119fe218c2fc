"""The shared receive function: concurrent copies of one message, and what an apply failure means."""

import asyncio

import pytest

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


def _stuck_for(stuck_cids: set[str], never: asyncio.Event, applied: list[str]):
    """The node's apply seam: waits on an event nobody sets for the given messages (a stuck storage
    writer), commits at once for the others."""
    async def apply(env, sender):
        if env.correlation_id in stuck_cids:
            await never.wait()
        applied.append(env.correlation_id)
        return Ack.ok(env.correlation_id, ME)
    return apply


async def test_a_stuck_apply_times_out_without_an_ack_and_other_messages_keep_flowing() -> None:
    never = asyncio.Event()
    stuck_env = new_envelope(PEER, [ME], {"kind": "ping"}, NOW, 60_000)
    stuck = {stuck_env.correlation_id}
    applied: list[str] = []
    r = Receiver(ME, SeenCache(100, clock=lambda: NOW), _stuck_for(stuck, never, applied), max_bytes=1 << 20,
                 clock_ms=lambda: NOW, apply_timeout_s=0.2)

    waiting = asyncio.create_task(r.receive(stuck_env.to_wire(), PEER))
    other = await r.receive(_frame(), PEER)  # completes while the first is stuck
    assert other.ack is not None and other.ack.accepted
    assert not waiting.done()

    result = await waiting
    assert result.ack is None  # no ACK: the sender retries
    assert r.counters["apply_timeout"] == 1
    assert stuck_env.correlation_id not in r.seen  # a retry is applied again, not taken for a duplicate

    stuck.clear()  # the writer is unstuck: the sender's retry (same correlation_id) is stored and ACKed
    retry = await r.receive(stuck_env.to_wire(), PEER)
    assert retry.ack is not None and retry.ack.accepted and not retry.ack.is_duplicate
    assert applied[-1] == stuck_env.correlation_id


async def test_a_copy_waiting_on_a_stuck_apply_is_released_by_its_timeout() -> None:
    never = asyncio.Event()
    env = new_envelope(PEER, [ME], {"kind": "ping"}, NOW, 60_000)
    stuck = {env.correlation_id}
    r = Receiver(ME, SeenCache(100, clock=lambda: NOW), _stuck_for(stuck, never, []), max_bytes=1 << 20,
                 clock_ms=lambda: NOW, apply_timeout_s=0.2)
    a, b = await asyncio.gather(r.receive(env.to_wire(), PEER), r.receive(env.to_wire(), PEER))
    assert a.ack is None and b.ack is None and r.counters["apply_timeout"] == 2


def test_apply_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Receiver(ME, SeenCache(100, clock=lambda: NOW), _stuck_for(set(), asyncio.Event(), []),
                 max_bytes=1 << 20, clock_ms=lambda: NOW, apply_timeout_s=0)


async def test_apply_now_settles_what_it_answers_and_leaves_the_rest_to_apply() -> None:
    from a2a import ProtocolError

    applied: list[str] = []
    now_answers: dict[str, object] = {}

    async def apply(env, sender):
        applied.append(env.correlation_id)
        await asyncio.sleep(0)
        return Ack.ok(env.correlation_id, ME)

    def apply_now(env, sender):
        answer = now_answers[env.correlation_id]
        if isinstance(answer, Exception):
            raise answer
        return answer

    r = Receiver(ME, SeenCache(100, clock=lambda: NOW), apply, max_bytes=1 << 20, clock_ms=lambda: NOW,
                 apply_now=apply_now)
    ok, bad, broken, later = (new_envelope(PEER, [ME], {"kind": "ping"}, NOW, 60_000) for _ in range(4))
    now_answers.update({ok.correlation_id: Ack.ok(ok.correlation_id, ME),
                        bad.correlation_id: ProtocolError("bad_payload", "no", correlation_id=bad.correlation_id),
                        broken.correlation_id: OSError("disk"), later.correlation_id: None})

    settled = r.receive_now(ok, PEER)  # no coroutine: settled in the call, remembered as applied
    assert not asyncio.iscoroutine(settled) and settled.ack.accepted and ok.correlation_id in r.seen
    rejected = r.receive_now(bad, PEER)
    assert rejected.ack.reason == "rejected:bad_payload" and bad.correlation_id not in r.seen
    failed = r.receive_now(broken, PEER)
    assert failed.ack is None and r.counters["apply_failed"] == 1 and broken.correlation_id not in r.seen
    assert applied == []
    waited = await r.receive_envelope(later, PEER)  # None: the coroutine apply runs
    assert waited.ack.accepted and applied == [later.correlation_id]
    duplicate = r.receive_now(ok, PEER)
    assert duplicate.ack.is_duplicate and not r._inflight
