"""Batch frames (docs/protocol.md, "Batch frames"): the codec's bounds, each item decided on its own, and
PeerLink.send_many over real mutual-TLS sockets, with and without the negotiated subprotocol."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import cbor2
import pytest

from a2a import (
    BATCH_MAX_BYTES,
    BATCH_SUBPROTOCOL,
    MAX_BATCH_ITEMS,
    Ack,
    Batch,
    Envelope,
    ProtocolError,
    SeenCache,
    batch_size,
    decode_frame,
    decode_wire,
    encode_batch,
    new_envelope,
    plan_batches,
)
from mesh.errors import MeshError
from mesh.receive import Received, Receiver
from tests.mesh.wire_fixture import CLIENT_ID, SERVER_ID, pair, until

NOW = 1_000_000


def _env(sender: str = CLIENT_ID, recipient: str = SERVER_ID, now: int = NOW, **payload) -> Envelope:
    return new_envelope(sender, [recipient], {"kind": "ping", **payload}, now, 60_000)


def _live(sender: str = CLIENT_ID) -> Envelope:
    return _env(sender, now=int(time.time() * 1000))


# ---------------------------------------------------------------- codec


def test_batch_round_trips_its_items_in_order() -> None:
    items = [_env().to_wire() for _ in range(3)]
    frame = encode_batch(items)
    assert decode_wire(frame, 1 << 20) == Batch(tuple(items))
    assert len(frame) == batch_size(len(i) for i in items)


def test_batch_wire_shape_is_the_documented_vector() -> None:
    # docs/protocol.md: {v: 1, type: "batch", items: [h'a1', h'a2']} in canonical CBOR
    assert encode_batch([b"\xa1", b"\xa2"]).hex() == "a36176016474797065656261746368656974656d738241a141a2"


def test_a_plain_frame_still_decodes_through_decode_wire() -> None:
    env = _env()
    assert decode_wire(env.to_wire(), 1 << 20) == env
    ack = Ack.ok(env.correlation_id, SERVER_ID)
    assert decode_wire(ack.to_wire(), 1 << 20) == ack


def test_decode_frame_refuses_a_batch_as_bad_type() -> None:
    """The HTTP route takes one envelope: a batch there is refused, not half-applied."""
    with pytest.raises(ProtocolError) as e:
        decode_frame(encode_batch([_env().to_wire()]), 1 << 20)
    assert e.value.code == "bad_type"


@pytest.mark.parametrize("obj, code", [
    ({"v": 1, "type": "batch", "items": []}, "bad_field"),
    ({"v": 1, "type": "batch", "items": "x"}, "bad_field"),
    ({"v": 1, "type": "batch", "items": [b""]}, "bad_field"),
    ({"v": 1, "type": "batch", "items": [{"v": 1}]}, "bad_field"),
    ({"v": 1, "type": "batch"}, "bad_field"),
    ({"v": 1, "type": "batch", "items": [b"\xa0"], "extra": 1}, "bad_field"),
    ({"v": 2, "type": "batch", "items": [b"\xa0"]}, "bad_version"),
    ({"v": 1, "type": "batch", "items": [b"\xa0"] * (MAX_BATCH_ITEMS + 1)}, "too_large"),
])
def test_a_bad_batch_frame_is_a_protocol_error(obj, code) -> None:
    with pytest.raises(ProtocolError) as e:
        decode_wire(cbor2.dumps(obj, canonical=True), 1 << 20)
    assert e.value.code == code


def test_batch_bytes_are_bounded_by_the_larger_of_the_limit_and_batch_max_bytes() -> None:
    small_limit = 1024
    item = _env(pad="x" * 300).to_wire()
    fits = encode_batch([item] * ((BATCH_MAX_BYTES - 64) // (len(item) + 3)))
    assert len(fits) > small_limit and isinstance(decode_wire(fits, small_limit), Batch)
    too_big = encode_batch([b"\xa0" * 1000] * (BATCH_MAX_BYTES // 1000 + 1))
    with pytest.raises(ProtocolError) as e:
        decode_wire(too_big, small_limit)
    assert e.value.code == "too_large"
    # A plain frame stays held to the message limit itself.
    with pytest.raises(ProtocolError) as e:
        decode_wire(_env(pad="x" * 2000).to_wire(), small_limit)
    assert e.value.code == "too_large"


def test_plan_batches_keeps_order_and_bounds_and_sends_an_oversized_item_alone() -> None:
    lengths = [200] * 600 + [BATCH_MAX_BYTES] + [200] * 3
    runs = plan_batches(lengths)
    assert [i for run in runs for i in run] == list(range(len(lengths)))
    assert all(len(run) <= MAX_BATCH_ITEMS for run in runs)
    assert all(len(run) == 1 or batch_size(lengths[i] for i in run) <= BATCH_MAX_BYTES for run in runs)
    assert range(600, 601) in runs
    assert plan_batches([]) == []


# ---------------------------------------------------------------- each item decided on its own


async def _ok(env, sender):
    return Ack.ok(env.correlation_id, SERVER_ID)


def _receiver(apply=_ok) -> Receiver:
    return Receiver(SERVER_ID, SeenCache(100, clock=lambda: NOW), apply, max_bytes=1 << 20, clock_ms=lambda: NOW)


async def test_a_bad_item_gets_its_own_answer_and_does_not_poison_the_batch() -> None:
    good, forged = _env(), _env(sender="ai:someone-else")
    bad = _env().to_map() | {"expires_at": "soon"}
    broken = cbor2.dumps(bad, canonical=True)  # its correlation_id reads, its expires_at does not
    unreadable = b"\xff\x00"
    ack_item = Ack.ok(good.correlation_id, CLIENT_ID).to_wire()
    r = _receiver()
    units = r.units(encode_batch([good.to_wire(), forged.to_wire(), bytes(broken), unreadable, ack_item]), CLIENT_ID)
    assert len(units) == 5
    assert units[0] == good
    results = [u if isinstance(u, Received) else await r.receive_envelope(u, CLIENT_ID) for u in units]
    assert results[0].ack.accepted
    assert results[1].ack.reason == "rejected:sender_mismatch"
    assert results[2].ack.reason == "rejected:bad_field" and results[2].ack.correlation_id == bad["correlation_id"]
    assert results[3].ack is None and results[3].error.code == "malformed"
    assert results[4].ack is None and results[4].error.code == "bad_type"
    assert r.counters["batch_frames"] == 1


async def test_without_apply_now_even_a_ping_is_applied_by_the_returned_coroutine() -> None:
    r = _receiver()
    pending = r.receive_now(_env(), CLIENT_ID)
    assert not isinstance(pending, Received)
    assert (await pending).ack.accepted


async def test_a_storage_kind_is_applied_from_its_start_inside_the_awaiting_task() -> None:
    seen_tasks = []

    async def apply(env, sender):
        seen_tasks.append(asyncio.current_task())
        async with asyncio.timeout(5):  # hooks and storage may bind a timeout before their first wait
            await asyncio.sleep(0)
        return Ack.ok(env.correlation_id, SERVER_ID)

    r = _receiver(apply)
    env = new_envelope(CLIENT_ID, [SERVER_ID], {"kind": "memory.put"}, NOW, 60_000)
    pending = r.receive_now(env, CLIENT_ID)
    assert not isinstance(pending, Received) and seen_tasks == []
    task = asyncio.create_task(pending)
    assert (await task).ack.accepted and seen_tasks == [task]


async def test_an_apply_that_waits_is_finished_by_the_returned_coroutine() -> None:
    gate = asyncio.Event()

    async def apply(env, sender):
        await gate.wait()
        return Ack.ok(env.correlation_id, SERVER_ID)

    r = _receiver(apply)
    env = _env()
    pending = r.receive_now(env, CLIENT_ID)
    assert not isinstance(pending, Received)
    task = asyncio.create_task(pending)
    await asyncio.sleep(0)
    gate.set()
    assert (await task).ack.accepted and env.correlation_id in r.seen


async def test_a_pings_apply_runs_inside_the_awaiting_task_too() -> None:
    async def apply(env, sender):
        async with asyncio.timeout(5):  # task-bound: needs the awaiting task to be current
            await asyncio.sleep(0)
        return Ack.ok(env.correlation_id, SERVER_ID)

    r = _receiver(apply)
    result = await r.receive_envelope(_env(), CLIENT_ID)
    assert result.ack.accepted and r.counters["apply_failed"] == 0


# ---------------------------------------------------------------- real sockets


async def test_send_many_coalesces_into_batch_frames_and_acks_each(pki) -> None:
    async with pair(pki, _ok) as p:
        assert p.link.batch_frames
        envs = [_live() for _ in range(300)]
        results = await p.link.send_many([(e.correlation_id, e.to_wire()) for e in envs])
        assert all(isinstance(a, Ack) and a.accepted and a.correlation_id == e.correlation_id
                   for a, e in zip(results, envs, strict=True))
        assert p.receiver.counters["batch_frames"] >= 2  # 300 items > MAX_BATCH_ITEMS
        assert p.receiver.counters["accept"] == 300
        # the same correlation_ids again: each answered duplicate, in order
        again = await p.link.send_many([(e.correlation_id, e.to_wire()) for e in envs[:5]])
        assert [a.is_duplicate for a in again] == [True] * 5


async def test_send_many_falls_back_to_one_frame_each_with_a_peer_without_batch_frames(pki) -> None:
    async with pair(pki, _ok, batch_frames=False) as p:
        assert not p.link.batch_frames
        envs = [_live() for _ in range(50)]
        results = await p.link.send_many([(e.correlation_id, e.to_wire()) for e in envs])
        assert all(isinstance(a, Ack) and a.accepted for a in results)
        assert p.receiver.counters["batch_frames"] == 0 and p.receiver.counters["accept"] == 50


async def test_a_rejected_item_inside_a_batch_gets_its_own_rejection_over_the_wire(pki) -> None:
    async with pair(pki, _ok) as p:
        envs = [_live(), _live(sender="ai:forged@test"), _live()]
        results = await p.link.send_many([(e.correlation_id, e.to_wire()) for e in envs])
        assert results[0].accepted and results[2].accepted
        assert results[1].reason == "rejected:sender_mismatch"
        assert p.receiver.counters["batch_frames"] == 1


async def test_a_stuck_apply_inside_a_batch_times_out_without_an_ack_and_the_rest_are_acked(pki) -> None:
    never = asyncio.Event()
    envs = [_live() for _ in range(4)]
    stuck = envs[1].correlation_id

    async def apply(env, sender):
        if env.correlation_id == stuck:
            await never.wait()
        return Ack.ok(env.correlation_id, SERVER_ID)

    async with pair(pki, apply, apply_timeout_s=0.3) as p:
        results = await p.link.send_many([(e.correlation_id, e.to_wire()) for e in envs], timeout_s=2.0)
        assert isinstance(results[1], MeshError) and results[1].code == "ack_timeout"
        assert all(isinstance(results[i], Ack) and results[i].accepted for i in (0, 2, 3))
        await until(lambda: p.receiver.counters["apply_timeout"] == 1, "the stuck apply to time out")
        assert stuck not in p.receiver.seen
        # the link and the socket are still fine
        assert (await p.link.send(_live())).accepted


async def test_send_many_reports_link_down_for_each_item_when_no_connection_comes(pki) -> None:
    async with pair(pki, _ok) as p:
        await p.link.close()
        envs = [_live() for _ in range(3)]
        results = await p.link.send_many([(e.correlation_id, e.to_wire()) for e in envs], timeout_s=0.2)
        assert [r.code for r in results] == ["link_down"] * 3


async def test_an_old_client_without_the_subprotocol_gets_one_ack_frame_per_envelope(pki) -> None:
    async with pair(pki, _ok) as p:
        url = p.link.url
        envs = [_live() for _ in range(20)]
        async with aiohttp.ClientSession() as s, s.ws_connect(url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID)) as ws:
            assert ws.protocol is None
            for e in envs:
                await ws.send_bytes(e.to_wire())
            acks = []
            for _ in envs:
                msg = await asyncio.wait_for(ws.receive(), 10)
                acks.append(decode_frame(msg.data, 1 << 20))  # a plain ACK, never a batch
        assert sorted(a.correlation_id for a in acks) == sorted(e.correlation_id for e in envs)


async def test_a_client_offering_batch_frames_gets_acks_batched(pki) -> None:
    async with pair(pki, _ok) as p:
        envs = [_live() for _ in range(40)]
        async with aiohttp.ClientSession() as s, s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID),
                                                              protocols=(BATCH_SUBPROTOCOL,)) as ws:
            assert ws.protocol == BATCH_SUBPROTOCOL
            await ws.send_bytes(encode_batch([e.to_wire() for e in envs]))
            got: list[Ack] = []
            frames = 0
            while len(got) < len(envs):
                msg = await asyncio.wait_for(ws.receive(), 10)
                frames += 1
                decoded = decode_wire(msg.data, 1 << 20)
                got.extend(decode_frame(i, 1 << 20) for i in decoded.items) if isinstance(decoded, Batch) \
                    else got.append(decoded)
        assert sorted(a.correlation_id for a in got) == sorted(e.correlation_id for e in envs)
        assert frames < len(envs)  # answered inline in one loop turn: coalesced


async def test_removing_a_member_closes_its_open_socket_before_its_next_envelope_is_applied(pki) -> None:
    members = {CLIENT_ID}
    generation = [0]
    applied: list[str] = []

    async def apply(env, sender):
        applied.append(env.correlation_id)
        return Ack.ok(env.correlation_id, SERVER_ID)

    async with pair(pki, apply, member=lambda a: a in members, member_generation=lambda: generation[0]) as p:
        assert (await p.link.send(_live())).accepted
        members.clear()
        generation[0] += 1  # the keyring reloaded
        late = _live()
        result = (await p.link.send_many([(late.correlation_id, late.to_wire())], timeout_s=2.0))[0]
        assert isinstance(result, MeshError)
        assert late.correlation_id not in applied


async def test_connections_refused_at_the_handshake_are_counted_as_rejections(pki) -> None:
    """not_a_member and peer_key_mismatch are answered before any message is read: aimem_rejections_total counts
    them (the receiver's counters) as it counts the messages it refuses."""
    from mesh import tls
    from mesh.link import post_envelope

    members = {CLIENT_ID}

    async def apply(env, sender):
        return Ack.ok(env.correlation_id, SERVER_ID)

    async with pair(pki, apply, member=lambda a: a in members) as p:
        url, ctx = p.link.url, tls.client_context(pki.client_cert, pki.client.priv_path, pki.ca_dir / "ca.crt")
        pinned = {SERVER_ID: pki.server.public_key}

        async def post() -> int:
            status, _, _ = await post_envelope(url, _live(), ctx, expected_agent_id=SERVER_ID, pinned=pinned,
                                               timeout_s=5.0, max_bytes=1 << 20)
            return status

        members.clear()
        assert await post() == 403
        members.add(CLIENT_ID)
        p.hooks.pinned()[CLIENT_ID] = pki.server.public_key  # the server now pins another key for the client
        assert await post() == 403
        assert p.receiver.counters["rejected:not_a_member"] == 1
        assert p.receiver.counters["rejected:peer_key_mismatch"] == 1
