"""The inbound mTLS server: /a2a/v1/ws, /a2a/v1/messages, /a2a/v1/sync and /healthz; and the plain
loopback health port: /healthz (liveness), /readyz (readiness) and /metrics (Prometheus text).

Every route first establishes the peer's agent_id from its client certificate (and its pinned
.pub where one is known); both message routes then go through the one ``Receiver``.
Errors are HTTP statuses with a JSON body ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cbor2
import orjson
from aiohttp import WebSocketError, WSCloseCode, web
from aiohttp.typedefs import Handler, Middleware
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from a2a import BATCH_MAX_BYTES, BATCH_SUBPROTOCOL, Envelope, Outcome, encode_batch, plan_batches
from base.errors import describe, status_of
from mesh.errors import MeshCode, MeshError
from mesh.receive import Pending, Received, Receiver, Resumed
from mesh.routes import HEALTHZ_PATH, MESSAGES_PATH, METRICS_PATH, READYZ_PATH, SYNC_PATH, WS_PATH
from mesh.tls import verify_peer
from mesh.wsframes import CLEAN_CLOSE_CODES, HEARTBEAT_S, Heartbeat, read_frames, send_now

log = logging.getLogger("mesh.server")

CBOR = "application/cbor"
# The peer agent id the TLS handshake proved, set on the request by the authentication middleware.
PEER_KEY = web.RequestKey("peer_agent_id", str)
SOCKETS_KEY = web.AppKey("sockets", set[web.WebSocketResponse])
# Frames up to this multiple of the message limit are read and refused with a protocol error while
# the socket stays open; anything larger makes aiohttp close the socket (1009).
WS_READ_SLACK = 4
# Applies waiting (on storage) at once per WebSocket; more wait, which pushes back on the sender over TCP.
WS_INFLIGHT = 512
# A socket's peer is checked for membership again at least this often while it sends (seconds), and at
# once whenever the keyring reloads (``ServerHooks.member_generation``).
MEMBER_RECHECK_S = 1.0
# Bound on handing one ACK to a peer that does not read: past it the socket is closed (the sender
# reconnects and resends; applies are idempotent). Seconds.
ACK_SEND_TIMEOUT_S = 10.0
# Bound on reading one POSTed message body (a peer trickling bytes holds no handler for ever). Seconds.
BODY_READ_TIMEOUT_S = 10.0

MemberCheck = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class SyncQuery:
    """A GET /a2a/v1/sync's parameters, checked: the change-log seq to start after, the most items, the agents
    whose writes to leave out (the puller gets them from their writers), whether to serve the puller's own writes
    too (``mine``: its restore), and the payload kinds the puller reads beyond the common ones (``accepts``)."""

    since: int
    limit: int
    skip: tuple[str, ...] = ()
    mine: bool = False
    accepts: tuple[str, ...] = ()


# (peer, the request's parameters) -> the page.
SyncHandler = Callable[[str, SyncQuery], Awaitable[Mapping[str, Any]]]
# Bounds of GET /a2a/v1/sync parameters (since is a change-log seq, a signed 64-bit integer).
SYNC_SINCE_MAX = 2**63 - 1
SYNC_LIMIT_MAX = 10_000
SYNC_SKIP_MAX = 64
SYNC_SKIP_ID_MAX = 128
SYNC_ACCEPTS_MAX = 16
SYNC_ACCEPTS_KIND_MAX = 64
HealthHandler = Callable[[], Mapping[str, Any]]
# (ready, JSON body saying why): /readyz answers 200 when ready, 503 otherwise.
ReadyHandler = Callable[[], tuple[bool, Mapping[str, Any]]]
# The request's Accept header -> (exposition bytes, content type) for /metrics.
MetricsHandler = Callable[[str], Awaitable[tuple[bytes, str]]]


def json_error(code: str, message: str) -> web.Response:
    """The error answer: the status the project's one map gives ``code``, and ``{"error": {code, message}}``."""
    return web.Response(status=status_of(code), body=orjson.dumps({"error": {"code": code, "message": message}}),
                        content_type="application/json")


@dataclass
class ServerHooks:
    receiver: Receiver
    pinned: Callable[[], Mapping[str, Ed25519PublicKey]]
    health: HealthHandler
    sync: SyncHandler | None = None
    # Membership: an authenticated peer this returns False for is refused (403 not_a_member). None = all.
    member: MemberCheck | None = None
    ready: ReadyHandler | None = None
    metrics: MetricsHandler | None = None
    # Changes whenever the membership answer may have changed (the keyring reloaded); None = check every frame.
    member_generation: Callable[[], object] | None = None
    # Offer BATCH_SUBPROTOCOL on the WebSocket upgrade (batch frames in, batched ACKs out).
    batch_frames: bool = True


def build_app(hooks: ServerHooks) -> web.Application:
    max_bytes = hooks.receiver.max_bytes
    app = web.Application(middlewares=[_peer_identity(hooks)], client_max_size=max_bytes + 1)
    app.router.add_post(MESSAGES_PATH, _messages(hooks))
    app.router.add_get(WS_PATH, _websocket(hooks))
    app.router.add_get(SYNC_PATH, _sync(hooks))
    app.router.add_get(HEALTHZ_PATH, _health(hooks))
    app[SOCKETS_KEY] = set()
    app.on_shutdown.append(_close_sockets)
    return app


async def _close_sockets(app: web.Application) -> None:
    sockets: set[web.WebSocketResponse] = app[SOCKETS_KEY]
    for ws in list(sockets):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"node shutting down")


def build_health_app(hooks: ServerHooks) -> web.Application:
    """Plain HTTP for a separate loopback port (no client certificate needed): /healthz, /readyz, /metrics."""
    app = web.Application()
    app.router.add_get(HEALTHZ_PATH, _health(hooks))
    if hooks.ready is not None:
        app.router.add_get(READYZ_PATH, _ready(hooks.ready))
    if hooks.metrics is not None:
        app.router.add_get(METRICS_PATH, _metrics(hooks.metrics))
    return app


def _ready(ready: ReadyHandler) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        ok, body = ready()
        return web.Response(status=200 if ok else 503, body=orjson.dumps(dict(body)),
                            content_type="application/json")
    return handler


def _metrics(metrics: MetricsHandler) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        body, content_type = await metrics(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})
    return handler


def _peer_identity(hooks: ServerHooks) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
        if der is None:
            return json_error("no_client_certificate", "this endpoint requires a mesh client certificate")
        try:
            peer = verify_peer(der, expected_agent_id=None, pinned=hooks.pinned())
        except MeshError as e:
            # Refused before any message is read, and counted with the messages' refusals (aimem_rejections_total).
            hooks.receiver.counters[f"rejected:{e.code}"] += 1
            log.warning(e.code, extra={"ev": {"remote": request.remote, "detail": e.message}})
            return json_error(e.code, e.message)
        if hooks.member is not None and not hooks.member(peer):
            hooks.receiver.counters["rejected:not_a_member"] += 1
            log.warning("not_a_member", extra={"ev": {"remote": request.remote, "peer": peer}})
            return json_error("not_a_member",
                              f"{peer} holds a mesh certificate but is not a member of this node's federation "
                              "(no .pub in its peers/; mesh.trust = \"pinned\")")
        request[PEER_KEY] = peer
        return await handler(request)
    return middleware


def _messages(hooks: ServerHooks) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            async with asyncio.timeout(BODY_READ_TIMEOUT_S):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return json_error("too_large", f"message is larger than {hooks.receiver.max_bytes} bytes")
        except TimeoutError:
            return json_error("body_timeout", f"the message body did not arrive within {BODY_READ_TIMEOUT_S:g} s")
        result = await hooks.receiver.receive(body, request[PEER_KEY])
        if result.error is not None:
            return json_error(result.error.code, result.error.message)
        decision = result.decision
        if decision is not None and decision.code == "sender_mismatch":
            return json_error("sender_mismatch",
                              f"sender does not match the TLS identity {request[PEER_KEY]!r}")
        if decision is not None and decision.outcome is Outcome.EXPIRED:
            return json_error("expired", "message expired before it arrived; dropped without an ACK")
        if result.ack is None:
            return json_error("not_stored", "the message could not be stored now; retry later")
        return web.Response(body=result.ack.to_wire(), content_type=CBOR)
    return handler


def _websocket(hooks: ServerHooks) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        protocols = (BATCH_SUBPROTOCOL,) if hooks.batch_frames else ()
        peer = request[PEER_KEY]
        # autoping off: pings and pongs come to the socket's own reader (read_frames), which the heartbeat hears.
        ws = web.WebSocketResponse(heartbeat=None, autoping=False, protocols=protocols, compress=False,
                                   max_msg_size=max(hooks.receiver.max_bytes, BATCH_MAX_BYTES) * WS_READ_SLACK)
        await ws.prepare(request)
        sock = _Socket(hooks, peer, ws)
        sockets = request.app[SOCKETS_KEY]
        sockets.add(ws)
        log.info("ws_accepted", extra={"ev": {"peer": peer, "batch_frames": sock.batch}})
        try:
            async with asyncio.TaskGroup() as tg:
                await sock.serve(tg)
        except (ConnectionResetError, ConnectionError) as e:
            log.info("ws_reset", extra={"ev": {"peer": peer, "error": str(e)}})
        finally:
            sockets.discard(ws)
        code = sock.peer_close_code or ws.close_code
        clean = code in CLEAN_CLOSE_CODES
        # A peer that stopped closes cleanly (info); one whose socket dropped (1006: its process died) is a warning.
        log.log(logging.INFO if clean else logging.WARNING, "ws_closed",
                extra={"ev": {"peer": peer, "code": code, "peer_stopped": "cleanly" if clean else "crashed"}})
        return ws
    return handler


class _Socket:
    """One inbound WebSocket: reads its frames in order (``read_frames``), applies their envelopes and writes the
    ACKs.

    A message whose apply needs no waiting is answered inline (no task, no timer); one that waits (on
    storage) finishes in a task, at most ``WS_INFLIGHT`` at once (past that the rest of the frame's envelopes
    wait in ``backlog`` and the socket reads nothing more, which pushes back on the sender over TCP once
    aiohttp's read buffer is full). The ACKs of the frames one read carried are written together when the reader
    is about to wait (``idle``), those of applies that waited at the end of their loop turn; either way as one
    batch frame when the peer negotiated them. An ACK write the transport cannot take (the peer does not read) stops
    reading until it drains, bounded by ``ACK_SEND_TIMEOUT_S``, past which the socket is closed.
    """

    def __init__(self, hooks: ServerHooks, peer: str, ws: web.WebSocketResponse) -> None:
        self.receiver = hooks.receiver
        self.member = hooks.member
        self.member_generation = hooks.member_generation
        self.peer = peer
        self.ws = ws
        self.batch = ws.ws_protocol == BATCH_SUBPROTOCOL
        self.tg: asyncio.TaskGroup | None = None  # set by serve(), which starts the reading
        self.loop = asyncio.get_running_loop()
        self.acks: list[bytes] = []
        # Inside on_frame: the reader's idle() writes the ACKs made meanwhile; elsewhere (an apply that waited,
        # the backlog taken) they go at the end of the loop turn.
        self.reading = False
        self.flush_at_turn_end = False
        self.draining: asyncio.Task[None] | None = None
        self.waiting_applies = 0
        self.backlog: deque[Envelope | Received] = deque()
        # The reader waits on this for room (the backlog taken, no ACK write draining) before reading on.
        self.room: asyncio.Future[None] | None = None
        self.heard = False
        self.peer_close_code: int | None = None
        self.ended: asyncio.Future[BaseException | None] = self.loop.create_future()
        self.close_with: tuple[int, bytes] | None = None
        self.checked_generation: object = None
        self.member_recheck_at = 0.0

    async def serve(self, tg: asyncio.TaskGroup) -> None:
        """Read and apply frames (tasks in ``tg``) until the socket ends (the peer closed or went away, a parse
        error, or we close it), then close it."""
        self.tg = tg
        reading = tg.create_task(self._read())
        heartbeat = Heartbeat(self, self._ping, lambda: self.end(TimeoutError(
            f"no pong within {HEARTBEAT_S / 2:g} s of a ping")), HEARTBEAT_S)
        try:
            error = await self.ended
        finally:
            heartbeat.stop()
            reading.cancel()  # nothing more is applied; aiohttp's close() reads the peer's close frame itself
        await asyncio.wait({reading}, timeout=ACK_SEND_TIMEOUT_S)
        self.backlog.clear()
        ws = self.ws
        if self.close_with is not None:
            await ws.close(code=self.close_with[0], message=self.close_with[1])
        elif isinstance(error, WebSocketError):
            log.warning("ws_error", extra={"ev": {"peer": self.peer, "error": str(error)}})
            await ws.close(code=error.code)
        elif error is not None:
            log.warning("ws_error", extra={"ev": {"peer": self.peer, "error": f"{type(error).__name__}: {error}"}})
            await ws.close(code=WSCloseCode.INTERNAL_ERROR)  # not 1006: RFC 6455 forbids it in a close frame
        else:
            await ws.close(drain=False)

    async def _read(self) -> None:
        self.end(await read_frames(self.ws, self, self.idle))

    def end(self, error: BaseException | None) -> None:
        if not self.ended.done():
            self.ended.set_result(error)

    def _ping(self) -> None:
        if not self.ws.closed:
            send_now(self.ws.ping(b""))

    def on_frame(self, data: bytes) -> Awaitable[None] | None:
        """One data frame, from the reader; returns what to await before reading the next (room for more)."""
        if self.ended.done() or not self._member_or_end():
            return None
        self.reading = True  # the ACKs this frame makes wait for idle(): one write for all a read carried
        try:
            self._take(self.receiver.units(data, self.peer))
        finally:
            self.reading = False
        if self.draining is not None or self.backlog:
            return self._room()
        return None

    def idle(self) -> None:
        """The reader is about to wait: write the ACKs of the frames it read (nothing waits for the loop turn)."""
        if self.acks:
            self.flush()

    async def _room(self) -> None:
        """Until the backlog is taken and no ACK write drains (a socket that ends cancels the reader)."""
        while self.backlog or self.draining is not None:
            self.room = room = self.loop.create_future()
            await room

    def _member_or_end(self) -> bool:
        """Membership is read again when peers/ changes: a removed member's open socket ends, and what it sent
        that still waits in the backlog is dropped unapplied (unACKed: nothing is lost for a member)."""
        if self.member is None or self._still_member():
            return True
        log.warning("not_a_member", extra={"ev": {"peer": self.peer, "route": "ws", "closing": True}})
        self.close_with = (WSCloseCode.POLICY_VIOLATION, b"not_a_member")
        self.backlog.clear()
        self.end(None)
        return False

    def _take(self, units: list[Envelope | Received]) -> None:
        for i, unit in enumerate(units):
            if not isinstance(unit, Received) and self.waiting_applies >= WS_INFLIGHT:
                self.backlog.extend(units[i:])
                return
            self._take_one(unit)

    def _take_one(self, unit: Envelope | Received) -> None:
        assert self.tg is not None
        if isinstance(unit, Received):
            self._answer(unit)
            return
        result = self.receiver.receive_now(unit, self.peer)
        if isinstance(result, Received):
            self._answer(result)
        else:
            self.waiting_applies += 1
            self.tg.create_task(self._finish(result))

    def _resume(self) -> None:
        """Take the backlog while there is room; let the reader read on once it is empty and no ACK write waits."""
        if self.backlog and self.waiting_applies < WS_INFLIGHT and not self.ended.done() and self._member_or_end():
            backlog = self.backlog  # taken from the front while there is room: no copy per finished apply
            while backlog and (isinstance(backlog[0], Received) or self.waiting_applies < WS_INFLIGHT):
                self._take_one(backlog.popleft())
        room = self.room
        if room is not None and not self.backlog and self.draining is None:
            self.room = None
            if not room.done():
                room.set_result(None)

    def _still_member(self) -> bool:
        """Ask the membership check when the keyring may have changed: its generation moved (someone read a
        changed peers/), or ``MEMBER_RECHECK_S`` passed (nobody else looked). Not on every frame: it stats."""
        assert self.member is not None
        if self.member_generation is None:
            return self.member(self.peer)
        generation, now = self.member_generation(), self.loop.time()
        if generation == self.checked_generation and now < self.member_recheck_at:
            return True
        if not self.member(self.peer):
            return False
        self.checked_generation = self.member_generation()  # the check itself may have reloaded the keyring
        self.member_recheck_at = now + MEMBER_RECHECK_S
        return True

    async def _finish(self, pending: Pending) -> None:
        try:
            self._answer(await pending)
        finally:
            self.waiting_applies -= 1
            if self.backlog or self.room is not None:
                self._resume()

    def _answer(self, result: Received) -> None:
        if result.ack is None:
            return
        self.acks.append(result.ack.to_wire())
        if not self.reading and not self.flush_at_turn_end:
            self.flush_at_turn_end = True
            self.loop.call_soon(self._flush_at_turn_end)

    def _flush_at_turn_end(self) -> None:
        if self.flush_at_turn_end:
            self.flush()

    def flush(self) -> None:
        """Write the ACKs gathered so far (at the end of the loop turn that made them)."""
        self.flush_at_turn_end = False
        if self.draining is not None:
            return  # the drain task writes them once the transport takes data again
        ws = self.ws
        if ws.closed:
            log.info("ack_not_sent", extra={"ev": {"peer": self.peer, "error": "socket closed",
                                                   "acks": len(self.acks)}})
            self.acks = []
            return
        frames, self.acks = self._frames(self.acks), []
        for i, frame in enumerate(frames):
            sending = ws.send_bytes(frame)
            try:
                yielded = sending.send(None)
            except StopIteration:
                continue
            except (ConnectionError, RuntimeError) as e:
                # The peer went away with these ACKs in flight; it resends, and the applies are idempotent.
                log.info("ack_not_sent", extra={"ev": {"peer": self.peer, "error": f"{type(e).__name__}: {e}"}})
                return
            # The frame is written; the transport is over its high-water mark and the send waits for it
            # to drain: finish that, and everything after it, in one task bounded by ACK_SEND_TIMEOUT_S,
            # and read nothing more until it is done.
            assert self.tg is not None  # ACKs exist only for frames taken after serve() began
            self.draining = self.tg.create_task(self._drain(Resumed(sending, yielded), frames[i + 1:]))
            return

    def _frames(self, acks: list[bytes]) -> list[bytes]:
        if not self.batch or len(acks) == 1:
            return acks
        return [acks[run[0]] if len(run) == 1 else encode_batch(acks[i] for i in run)
                for run in plan_batches([len(a) for a in acks])]

    async def _drain(self, sending: Awaitable[Any], rest: list[bytes]) -> None:
        ws = self.ws
        try:
            async with asyncio.timeout(ACK_SEND_TIMEOUT_S):
                await sending
                for frame in rest:
                    await ws.send_bytes(frame)
                while self.acks:
                    frames, self.acks = self._frames(self.acks), []
                    for frame in frames:
                        await ws.send_bytes(frame)
        except (ConnectionError, RuntimeError) as e:
            log.info("ack_not_sent", extra={"ev": {"peer": self.peer, "error": f"{type(e).__name__}: {e}"}})
        except TimeoutError:
            # The peer does not read its ACKs: drop it rather than buffer for ever; it reconnects and resends.
            log.warning("ack_send_timeout", extra={"ev": {"peer": self.peer, "timeout_s": ACK_SEND_TIMEOUT_S}})
            self.close_with = (WSCloseCode.TRY_AGAIN_LATER, b"ACKs not read")
            self.end(None)
        finally:
            self.draining = None
            self._resume()


def _sync(hooks: ServerHooks) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        if hooks.sync is None:
            return json_error("not_found", "this node does not serve a change log")
        try:
            query = _sync_params(request.query)
        except ValueError as e:
            return json_error("bad_input", str(e))
        try:
            page = await hooks.sync(request[PEER_KEY], query)
        except Exception as e:
            log.warning("sync_failed", extra={"ev": {"peer": request[PEER_KEY], "error": f"{type(e).__name__}: {e}"}})
            d = describe(e)
            return json_error(d.code, d.message)
        # A page of thousands of items takes milliseconds to encode: off the event loop, so that the pings and
        # messages this node answers meanwhile wait at most a GIL switch interval, not the whole encoding.
        body = await asyncio.to_thread(cbor2.dumps, dict(page))
        return web.Response(body=body, content_type=CBOR)
    return handler


def _sync_params(query: Mapping[str, str]) -> SyncQuery:
    """since (0..2^63-1), limit (1..SYNC_LIMIT_MAX), skip (comma-separated agent ids), mine (0 or 1: the puller's
    own writes too, for its restore) and accepts (comma-separated payload kinds; absent from an older node);
    ValueError says why."""
    raw_since, raw_limit = query.get("since", "0"), query.get("limit", "100")
    if not (_is_decimal(raw_since) and _is_decimal(raw_limit)):
        raise ValueError("since and limit must be non-negative decimal integers")
    since, limit = int(raw_since), int(raw_limit)
    if since > SYNC_SINCE_MAX:
        raise ValueError(f"since must be in 0..{SYNC_SINCE_MAX}, got {raw_since[:40]}")
    if not 1 <= limit <= SYNC_LIMIT_MAX:
        raise ValueError(f"limit must be in 1..{SYNC_LIMIT_MAX}, got {raw_limit[:40]}")
    skip = [a for a in query.get("skip", "").split(",") if a]
    if len(skip) > SYNC_SKIP_MAX or any(len(a) > SYNC_SKIP_ID_MAX for a in skip):
        raise ValueError(f"skip names at most {SYNC_SKIP_MAX} agent ids of at most {SYNC_SKIP_ID_MAX} chars")
    mine = query.get("mine", "0")
    if mine not in ("0", "1"):
        raise ValueError("mine must be 0 or 1")
    accepts = [k for k in query.get("accepts", "").split(",") if k]
    if len(accepts) > SYNC_ACCEPTS_MAX or any(len(k) > SYNC_ACCEPTS_KIND_MAX for k in accepts):
        raise ValueError(f"accepts names at most {SYNC_ACCEPTS_MAX} kinds of at most {SYNC_ACCEPTS_KIND_MAX} chars")
    return SyncQuery(since, limit, tuple(skip), mine == "1", tuple(accepts))


def _is_decimal(text: str) -> bool:
    return 0 < len(text) <= 20 and text.isascii() and text.isdigit()


def _health(hooks: ServerHooks) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps(dict(hooks.health())), content_type="application/json")
    return handler


async def _bind(site: web.TCPSite, key: str, host: str, port: int) -> None:
    try:
        await site.start()
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise MeshError(MeshCode.PORT_IN_USE, f"{host}:{port} ({key}) is in use: is this node already running, "
                                                  f"or does another program hold the port?") from None
        raise MeshError(MeshCode.CANNOT_LISTEN, f"cannot listen on {host}:{port} ({key}): {e.strerror or e}") from None


class MeshServer:
    """Runs the app on host:port with the mTLS context (and optionally a plain health port)."""

    def __init__(self, hooks: ServerHooks, ssl_context: ssl.SSLContext, host: str, port: int,
                 health_port: int = 0, health_host: str = "127.0.0.1") -> None:
        self.hooks = hooks
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self.health_port = health_port
        self.health_host = health_host
        self._runners: list[web.AppRunner] = []

    async def start(self) -> int:
        """Start listening; returns the bound port (useful with port 0). MeshError port_in_use names the port."""
        runner = web.AppRunner(build_app(self.hooks), access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        await _bind(web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl_context, backlog=512),
                    "mesh.listen_port", self.host, self.port)
        self.port = runner.addresses[0][1]
        if self.health_port:
            health = web.AppRunner(build_health_app(self.hooks), access_log=None, handle_signals=False)
            await health.setup()
            self._runners.append(health)
            await _bind(web.TCPSite(health, self.health_host, self.health_port), "mesh.health_port",
                        self.health_host, self.health_port)
        return self.port

    async def stop_accepting(self) -> None:
        """Close the listening sockets; connections already open keep being served."""
        for runner in self._runners:
            for site in list(runner.sites):
                await site.stop()

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, give in-flight requests ``timeout_s`` seconds, close sockets."""
        await self.stop_accepting()
        for runner in self._runners:
            try:
                await asyncio.wait_for(runner.cleanup(), timeout_s)
            except TimeoutError:
                log.warning("drain_timeout", extra={"ev": {"timeout_s": timeout_s}})
        self._runners.clear()
