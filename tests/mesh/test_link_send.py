"""PeerLink.send_wire over real mutual-TLS sockets: the ACK, its deadline, a lost link, and what it leaves behind."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from a2a import Ack, Envelope, new_envelope
from mesh.errors import MeshError
from mesh.link import PeerLink
from mesh.linkstate import LinkState
from tests.mesh.wire_fixture import CLIENT_ID, SERVER_ID, pair, until


def _live() -> Envelope:
    now = int(time.time() * 1000)
    return new_envelope(CLIENT_ID, [SERVER_ID], {"kind": "ping"}, now, 60_000)


async def _ok(env: Envelope, sender: str) -> Ack:
    return Ack.ok(env.correlation_id, SERVER_ID)


def _acks_once(released: asyncio.Event) -> Callable[[Envelope, str], Awaitable[Ack]]:
    """An apply that answers only once ``released`` is set."""
    async def apply(env: Envelope, sender: str) -> Ack:
        await released.wait()
        return Ack.ok(env.correlation_id, SERVER_ID)
    return apply


async def test_a_fan_of_send_wire_calls_is_acked_and_leaves_no_pending_state(pki) -> None:
    async with pair(pki, _ok) as p:
        envs = [_live() for _ in range(50)]
        acks = await asyncio.gather(*(p.link.send_wire(e.correlation_id, e.to_wire()) for e in envs))
        assert [a.correlation_id for a in acks] == [e.correlation_id for e in envs]
        assert all(a.accepted for a in acks)
        assert p.link.in_flight == 0 and p.link.ack_deadlines_waiting == 0


async def test_send_wire_without_an_ack_ends_as_ack_timeout_and_the_link_still_works(pki) -> None:
    never = asyncio.Event()
    async with pair(pki, _acks_once(never), apply_timeout_s=5.0) as p:
        env = _live()
        with pytest.raises(MeshError) as info:
            await p.link.send_wire(env.correlation_id, env.to_wire(), timeout_s=0.2)
        assert info.value.code == "ack_timeout"
        assert p.link.in_flight == 0 and p.link.ack_deadlines_waiting == 0
        never.set()


async def test_send_wire_on_a_closed_link_is_link_down(pki) -> None:
    async with pair(pki, _ok) as p:
        await p.link.close()
        env = _live()
        with pytest.raises(MeshError) as info:
            await p.link.send_wire(env.correlation_id, env.to_wire(), timeout_s=0.2)
        assert info.value.code == "link_down"


async def test_a_link_lost_while_waiting_for_the_ack_is_link_down(pki) -> None:
    never = asyncio.Event()

    async def stuck(env: Envelope, sender: str) -> Ack:
        await never.wait()
        return Ack.ok(env.correlation_id, SERVER_ID)

    async with pair(pki, stuck) as p:
        env = _live()
        waiting = asyncio.ensure_future(p.link.send_wire(env.correlation_id, env.to_wire(), timeout_s=10.0))
        await until(lambda: p.link.in_flight == 1, "the send to be in flight")
        await p.link.close()
        with pytest.raises(MeshError) as info:
            await waiting
        assert info.value.code == "link_down"
        assert p.link.ack_deadlines_waiting == 0
        never.set()


@contextlib.asynccontextmanager
async def _link_to(pki, handler, **runner_options) -> AsyncIterator[PeerLink]:
    """A running PeerLink to an aiohttp WebSocket server (real TLS) that runs ``handler``."""
    from aiohttp import web

    from a2a import Backoff

    app = web.Application()
    app.router.add_get("/a2a/v1/ws", handler)
    runner = web.AppRunner(app, access_log=None, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=pki.ctx(SERVER_ID, server=True))
    await site.start()
    pinned = {SERVER_ID: pki.server.public_key, CLIENT_ID: pki.client.public_key}
    link = PeerLink(SERVER_ID, f"https://127.0.0.1:{runner.addresses[0][1]}", pki.ctx(CLIENT_ID),
                    pinned=lambda: pinned, backoff=Backoff(0.05, 0.2), ack_timeout_s=2.0, max_bytes=1 << 20)
    task = asyncio.create_task(link.run())
    try:
        yield link
    finally:
        await link.close()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
        await runner.cleanup()


async def test_the_links_socket_answers_a_ping_and_reports_the_peers_close(pki) -> None:
    from aiohttp import WSMsgType, web

    seen: list[tuple[object, object]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=False, protocols=("a2a-batch.1",))
        await ws.prepare(request)
        await ws.ping(b"heartbeat")
        msg = await asyncio.wait_for(ws.receive(), 10)
        seen.append((msg.type, msg.data))
        await ws.close(code=4000, message=b"bye")
        return ws

    async with _link_to(pki, handler) as link:
        await until(lambda: link.last_error is not None, "the peer's close to take the link down")
        assert seen[0] == (WSMsgType.PONG, b"heartbeat")
        assert link.state is not LinkState.UP and link.last_error_code == "link_closed"
        assert "4000" in (link.last_error or "")


async def test_the_link_pings_a_silent_peer_and_goes_down_when_no_pong_comes(pki, monkeypatch) -> None:
    from aiohttp import WSMsgType, web

    from mesh import link as link_module

    monkeypatch.setattr(link_module, "HEARTBEAT_S", 0.2)
    pings: list[object] = []
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        msg = await ws.receive()
        pings.append(msg.type)
        await release.wait()  # never answers, never closes
        return ws

    async with _link_to(pki, handler, shutdown_timeout=1.0) as link:
        try:
            await until(lambda: link.last_error_code == "ws_error", "the link to give up on the silent peer")
            assert pings[0] is WSMsgType.PING
            assert "no pong" in (link.last_error or "")
        finally:
            release.set()


async def test_accepted_acks_are_matched_without_a_decode_and_others_take_the_full_one(pki, monkeypatch) -> None:
    """Over a real socket, an accepted ACK is the template match; a duplicate (or anything else) is decoded."""
    import mesh.link

    decoded: list[bytes] = []

    def counting(data, max_bytes):
        decoded.append(data)
        return real(data, max_bytes)

    real = mesh.link.decode_wire
    monkeypatch.setattr(mesh.link, "decode_wire", counting)
    async with pair(pki, _ok) as p:
        env = _live()
        first = await p.link.send_wire(env.correlation_id, env.to_wire())
        assert first == Ack.ok(env.correlation_id, SERVER_ID) and decoded == []
        again = await p.link.send_wire(env.correlation_id, env.to_wire())  # remembered: a duplicate ACK
        assert again == Ack.duplicate(env.correlation_id, SERVER_ID) and len(decoded) == 1


async def test_ack_deadlines_each_end_their_own_send_and_the_queue_stays_bounded(pki) -> None:
    """One timer per link serves every send's ACK deadline: a send without an ACK ends as ack_timeout at its own
    deadline (a later send with a shorter timeout ends first), the ACKed ones around it are not touched, and many
    sends leave only what still waits in the queue."""
    never = asyncio.Event()
    stuck: set[str] = set()

    async def apply(env: Envelope, sender: str) -> Ack:
        if env.correlation_id in stuck:
            await never.wait()
        return Ack.ok(env.correlation_id, SERVER_ID)

    async with pair(pki, apply, apply_timeout_s=5.0) as p:
        long_env, short_env = _live(), _live()
        stuck.update({long_env.correlation_id, short_env.correlation_id})
        loop = asyncio.get_running_loop()
        started = loop.time()
        ended: dict[str, float] = {}

        async def timed(env: Envelope, timeout_s: float) -> str:
            try:
                await p.link.send_wire(env.correlation_id, env.to_wire(), timeout_s=timeout_s)
            except MeshError as e:
                ended[env.correlation_id] = loop.time() - started
                return e.code
            return "acked"

        long_wait = asyncio.ensure_future(timed(long_env, 1.0))
        short_wait = asyncio.ensure_future(timed(short_env, 0.3))
        for _ in range(300):  # ACKed sends around them, one after another
            env = _live()
            assert (await p.link.send_wire(env.correlation_id, env.to_wire(), timeout_s=5.0)).accepted
        assert len(p.link._deadlines) <= 2 * p.link.in_flight + 64 + 1  # noqa: SLF001
        assert await short_wait == "ack_timeout" and await long_wait == "ack_timeout"
        assert 0.3 <= ended[short_env.correlation_id] < ended[long_env.correlation_id]
        assert ended[long_env.correlation_id] >= 1.0  # no upper bound: a loaded machine may run it late
        assert p.link.in_flight == 0 and p.link.ack_deadlines_waiting == 0
        env = _live()
        assert (await p.link.send_wire(env.correlation_id, env.to_wire(), timeout_s=1.0)).accepted
        never.set()


async def test_a_send_its_caller_cancelled_leaves_nothing_behind_and_a_resend_of_its_id_gets_the_ack(pki) -> None:
    """A caller that stops waiting (its task cancelled) cancels the send's future: the link forgets it by its
    deadline at the latest, and a resend of the same correlation id (as the outbox's retries are) waits for
    the ACK rather than finding the cancelled future."""
    release = asyncio.Event()
    async with pair(pki, _acks_once(release), apply_timeout_s=30.0) as p:
        env = _live()
        waiting = asyncio.ensure_future(p.link.send_wire(env.correlation_id, env.to_wire(), timeout_s=0.2))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await until(lambda: p.link.in_flight == 0, "the cancelled send forgotten")
        assert p.link.ack_deadlines_waiting == 0
        again = asyncio.ensure_future(p.link.send_wire(env.correlation_id, env.to_wire(), timeout_s=30.0))
        await asyncio.sleep(0.05)
        assert not again.done()
        release.set()
        assert (await again).accepted
        assert p.link.in_flight == 0
