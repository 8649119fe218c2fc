"""The inbound WebSocket (mesh/server.py ``_Socket``) over real mutual-TLS sockets: what it does with control
frames, text frames, a peer's close, and more waiting applies than ``WS_INFLIGHT``."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from a2a import BATCH_SUBPROTOCOL, Ack, Batch, Envelope, decode_frame, decode_wire, encode_batch, new_envelope
from mesh import server
from tests.mesh.wire_fixture import CLIENT_ID, SERVER_ID, pair, until


def _live(kind: str = "ping") -> Envelope:
    now = int(time.time() * 1000)
    return new_envelope(CLIENT_ID, [SERVER_ID], {"kind": kind}, now, 60_000)


async def _ok(env: Envelope, sender: str) -> Ack:
    return Ack.ok(env.correlation_id, SERVER_ID)


def _ping_now(env: Envelope, sender: str) -> Ack | None:
    return Ack.ok(env.correlation_id, SERVER_ID) if env.kind == "ping" else None


async def _never(env: Envelope, sender: str) -> Ack:
    raise AssertionError(f"{env.kind} should have been settled inline")


async def _ack(ws: aiohttp.ClientWebSocketResponse) -> Ack:
    msg = await asyncio.wait_for(ws.receive(), 10)
    assert msg.type is aiohttp.WSMsgType.BINARY, msg
    ack = decode_frame(msg.data, 1 << 20)
    assert isinstance(ack, Ack)
    return ack


async def test_a_ping_is_answered_with_its_pong_and_a_text_frame_is_ignored(pki) -> None:
    async with pair(pki, _ok) as p, aiohttp.ClientSession() as s, \
            s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID), autoping=False) as ws:
        await ws.ping(b"are you there")
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert msg.type is aiohttp.WSMsgType.PONG and msg.data == b"are you there"
        await ws.send_str("not cbor")
        env = _live()
        await ws.send_bytes(env.to_wire())
        assert (await _ack(ws)).correlation_id == env.correlation_id  # the socket stayed open


async def test_a_peer_closing_gets_the_close_answered(pki) -> None:
    async with pair(pki, _ok) as p, aiohttp.ClientSession() as s:
        ws = await s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID))
        env = _live()
        await ws.send_bytes(env.to_wire())
        assert (await _ack(ws)).accepted
        assert await asyncio.wait_for(ws.close(), 10)
        assert ws.close_code == aiohttp.WSCloseCode.OK


async def test_a_frame_over_the_size_bound_closes_that_socket_and_the_server_serves_on(pki) -> None:
    async with pair(pki, _ok) as p, aiohttp.ClientSession() as s:
        async with s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID)) as ws:
            await ws.send_bytes(b"\x00" * ((1 << 20) * server.WS_READ_SLACK + 1))
            msg = await asyncio.wait_for(ws.receive(), 10)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
        assert (await p.link.send(_live())).accepted


async def test_more_waiting_applies_than_ws_inflight_wait_for_room_and_all_are_acked(pki, monkeypatch) -> None:
    monkeypatch.setattr(server, "WS_INFLIGHT", 3)
    release = asyncio.Event()
    started: list[str] = []

    async def slow(env: Envelope, sender: str) -> Ack:
        started.append(env.correlation_id)
        await release.wait()
        return Ack.ok(env.correlation_id, SERVER_ID)

    async with pair(pki, slow) as p, aiohttp.ClientSession() as s, \
            s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID)) as ws:
        envs = [_live("memory.put") for _ in range(10)]  # not an inline kind: each apply waits in a task
        for e in envs:
            await ws.send_bytes(e.to_wire())
        await until(lambda: len(started) == 3, "three applies to start")
        await asyncio.sleep(0.2)
        assert len(started) == 3  # the rest wait for room
        release.set()
        acks = [await _ack(ws) for _ in envs]
        assert sorted(a.correlation_id for a in acks) == sorted(e.correlation_id for e in envs)
        assert started == [e.correlation_id for e in envs]  # in order


async def test_a_silent_socket_is_pinged_and_closed_when_no_pong_comes(pki, monkeypatch) -> None:
    monkeypatch.setattr(server, "HEARTBEAT_S", 0.2)
    async with pair(pki, _ok) as p, aiohttp.ClientSession() as s, \
            s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID), autoping=False) as ws:
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert msg.type is aiohttp.WSMsgType.PING  # silent for an interval: pinged
        msg = await asyncio.wait_for(ws.receive(), 10)  # never answered: the server gives up on the socket
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)


async def test_a_socket_that_answers_its_pings_stays_open(pki, monkeypatch) -> None:
    monkeypatch.setattr(server, "HEARTBEAT_S", 0.1)
    async with pair(pki, _ok) as p, aiohttp.ClientSession() as s, \
            s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID), autoping=True) as ws:
        reading = asyncio.ensure_future(ws.receive())  # answers each ping while it waits for a data frame
        await asyncio.sleep(0.5)  # several heartbeat intervals
        assert not reading.done()  # no close came
        env = _live()
        await ws.send_bytes(env.to_wire())
        msg = await asyncio.wait_for(reading, 10)
        assert msg.type is aiohttp.WSMsgType.BINARY
        assert decode_frame(msg.data, 1 << 20).correlation_id == env.correlation_id


async def test_frames_waiting_for_room_are_not_applied_once_the_sender_stops_being_a_member(pki, monkeypatch) -> None:
    monkeypatch.setattr(server, "WS_INFLIGHT", 3)
    release = asyncio.Event()
    started: list[str] = []
    member = {"ok": True, "generation": 0}

    async def slow(env: Envelope, sender: str) -> Ack:
        started.append(env.correlation_id)
        await release.wait()
        return Ack.ok(env.correlation_id, SERVER_ID)

    async with pair(pki, slow, member=lambda peer: member["ok"], member_generation=lambda: member["generation"]) as p, \
            aiohttp.ClientSession() as s, s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID)) as ws:
        envs = [_live("memory.put") for _ in range(10)]
        for e in envs:
            await ws.send_bytes(e.to_wire())
        await until(lambda: len(started) == 3, "three applies to start")
        await asyncio.sleep(0.2)  # the other seven are read and wait in the socket's backlog
        member.update(ok=False, generation=1)  # its .pub removed, the keyring reloaded
        release.set()
        closed = None
        for _ in range(20):  # the three ACKs in flight may come first
            msg = await asyncio.wait_for(ws.receive(), 10)
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                closed = msg
                break
        assert closed is not None and ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
        assert started == [e.correlation_id for e in envs[:3]]  # the waiting seven were never applied


async def test_envelopes_settled_inline_are_acked_before_the_reader_waits_in_one_batch_frame(pki) -> None:
    async with pair(pki, _never, apply_now=_ping_now) as p, aiohttp.ClientSession() as s, \
            s.ws_connect(p.link.url + "/a2a/v1/ws", ssl=pki.ctx(CLIENT_ID), protocols=(BATCH_SUBPROTOCOL,)) as ws:
        envs = [_live() for _ in range(40)]
        await ws.send_bytes(encode_batch([e.to_wire() for e in envs]))
        msg = await asyncio.wait_for(ws.receive(), 10)
        batch = decode_wire(msg.data, 1 << 20)
        assert isinstance(batch, Batch)  # every ACK the frame made, in the one write made before reading on
        acks = [decode_frame(item, 1 << 20) for item in batch.items]
        assert [a.correlation_id for a in acks if isinstance(a, Ack) and a.accepted] == \
            [e.correlation_id for e in envs]
        for _ in range(3):  # one envelope a frame: each answered on its own, the socket reading on
            env = _live()
            await ws.send_bytes(env.to_wire())
            assert (await _ack(ws)).correlation_id == env.correlation_id


async def test_a_link_fanning_pings_out_gets_every_ack_when_they_are_settled_inline(pki) -> None:
    async with pair(pki, _never, apply_now=_ping_now) as p:
        for _ in range(50):
            env = _live()
            ack = await asyncio.wait_for(p.link.send_wire(env.correlation_id, env.to_wire()), 10)
            assert ack.accepted and ack.correlation_id == env.correlation_id
