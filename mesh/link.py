"""One persistent outbound WebSocket to one peer: connect, verify, send, match ACKs, reconnect.

Each node dials each peer it sends to; the dialer sends envelopes and the peer answers ACKs on the
same socket, many in flight at once, matched by correlation_id. On loss the link reconnects with
jittered exponential backoff; sends in flight fail with ``link_down`` and the outbox retries them.
A connection that stayed up ``settle_s`` resets the backoff, so every outage starts again from the
minimum delay; each outage is logged once (``link_down``) and each recovery (``link_up``). When the
peer refuses the connection, ``last_error`` carries the peer's own code and message.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from a2a import (
    BATCH_MAX_BYTES,
    BATCH_SUBPROTOCOL,
    Ack,
    Backoff,
    Batch,
    Envelope,
    ProtocolError,
    accepted_ack,
    decode_frame,
    decode_wire,
    encode_batch,
    plan_batches,
)
from mesh.errors import MeshCode, MeshError
from mesh.linkstate import LinkState
from mesh.receive import Resumed
from mesh.routes import MESSAGES_PATH, WS_PATH
from mesh.tls import PeerRefused, pinned_to
from mesh.wsframes import CLEAN_CLOSE_CODES, HEARTBEAT_S, Heartbeat, read_frames, send_now

log = logging.getLogger("mesh.link")

# A connection must stay up this long before its loss counts as a fresh outage with the minimum
# reconnect delay; a peer that accepts and drops at once keeps backing off.
LINK_SETTLE_S = 10.0
# Bounds on asking a peer why it refused the WebSocket upgrade (one plain GET), and on its answer.
REFUSAL_PROBE_TIMEOUT_S = 5.0
REFUSAL_BODY_MAX = 64 * 1024
REFUSAL_MESSAGE_MAX = 500
_ERROR_CODE = re.compile(r"[a-z][a-z0-9_:]{0,63}")
# Errors raised by a trust decision (theirs or ours): worth a warning, an operator must act.
# The ACK deadline queue (one per link) is rebuilt from the sends still waiting once it holds more than
# this many settled entries beyond twice the waiting ones.
DEADLINE_SLACK = 64
# A deadline timer may fire this early (libuv's timers run in whole milliseconds): sends due within it are due.
DEADLINE_EARLY_S = 0.001
# Bound on a connection's reader task ending once cancelled (it ends within a loop turn). Seconds.
READER_STOP_S = 2.0
_TRUST_CODES = frozenset({"peer_key_mismatch", "peer_identity_mismatch", "not_a_member", "no_agent_san",
                          "ambiguous_agent_san", "no_client_certificate", "refused"})


class _Reading:
    """What one connection's reader hears: ACK frames go to the link; ``heard`` is the heartbeat's."""

    __slots__ = ("link", "peer", "heard", "peer_close_code")

    def __init__(self, link: PeerLink) -> None:
        self.link, self.peer, self.heard = link, link.agent_id, False
        self.peer_close_code: int | None = None

    def on_frame(self, data: bytes) -> None:
        self.link.on_ack_frame(data)


@dataclass
class LinkHealth:
    """Outage accounting for one link, free of I/O: the caller passes monotonic seconds.

    ``failures`` counts failed attempts (and lost connections) since the link last stayed up
    ``settle_s``; it drives the reconnect delay. ``outages`` counts the times the link stopped being
    up (the first failed attempt counts as one).
    """

    settle_s: float
    failures: int = 0
    outages: int = 0
    up_since: float | None = None
    down_since: float | None = None

    def went_up(self, now: float) -> float | None:
        """Record a connection; returns how long the link had been down (None on the first connect)."""
        down_for = None if self.down_since is None else now - self.down_since
        self.up_since, self.down_since = now, None
        return down_for

    def went_down(self, now: float) -> bool:
        """Record a failed attempt or a lost connection; True when this begins a new outage."""
        was_up = self.up_since is not None
        if self.up_since is not None and now - self.up_since >= self.settle_s:
            self.failures = 0
        self.failures += 1
        self.up_since = None
        if was_up or self.down_since is None:
            self.outages += 1
            self.down_since = now
            return True
        return False

    def settled(self, now: float) -> bool:
        """Up for at least ``settle_s``: losing the link now would start over from the minimum delay."""
        return self.up_since is not None and now - self.up_since >= self.settle_s


class PeerLink:
    def __init__(self, agent_id: str, url: str, ssl_context: ssl.SSLContext, *,
                 pinned: Callable[[], Mapping[str, Ed25519PublicKey]], backoff: Backoff,
                 ack_timeout_s: float, max_bytes: int, settle_s: float = LINK_SETTLE_S,
                 member: Callable[[str], bool] | None = None) -> None:
        self.agent_id = agent_id
        # Membership (mesh.trust = "pinned"): a peer this returns False for is not dialled, so nothing is
        # sent to it and nothing is pulled from it until its .pub is imported. None = dial on CA trust.
        self.member = member
        self.url = url
        self.ssl_context = ssl_context
        self.pinned = pinned
        self.backoff = backoff
        self.ack_timeout_s = ack_timeout_s
        self.max_bytes = max_bytes
        self.ws_max_msg_size = max(max_bytes, BATCH_MAX_BYTES) * 4
        self.state = LinkState.CONNECTING
        self.health = LinkHealth(settle_s)
        # "code: message" of the last failure; a refusal carries the peer's own code and message.
        self.last_error: str | None = None
        self.last_error_code: str | None = None
        # How the last open connection ended: True the peer stopped (a clean close), False it crashed (the socket
        # dropped, 1006, or broke), None no connection was open (a failed dial).
        self._ended_cleanly: bool | None = None
        self.last_delay_s: float | None = None
        self.last_ack_at: float | None = None  # unix seconds
        self.connected_at: float | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        # The peer named BATCH_SUBPROTOCOL on the upgrade: send_many may put many envelopes in one frame.
        self.batch_frames = False
        self._up = asyncio.Event()
        self._pending: dict[str, asyncio.Future[Ack]] = {}
        # send_wire's ACK deadlines: a heap of (deadline, seq, correlation_id, future, timeout) swept by one loop
        # timer set for the earliest (a timer per send cost a TimerHandle and its cancel per peer per envelope).
        # An entry whose future is settled (its ACK came, the link went down) is dropped when it reaches the top.
        self._deadlines: list[tuple[float, int, str, asyncio.Future[Ack], float]] = []
        self._deadline_seq = itertools.count()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # run()'s
        self._on_up: list[Callable[[], None]] = []

    def on_up(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time the link (re)connects (used to wake the outbox and run catch-up)."""
        self._on_up.append(callback)

    @property
    def closed(self) -> bool:
        """True once ``close`` was called: the link does not reconnect."""
        return self.state is LinkState.CLOSED

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def ack_deadlines_waiting(self) -> int:
        """send_wire calls whose ACK deadline still runs (their future is not settled)."""
        return sum(1 for entry in self._deadlines if not entry[3].done())

    async def run(self) -> None:
        """Keep the link up until ``close()``; owned by the node's task group."""
        self._loop = asyncio.get_running_loop()
        # Every TLS connection of this session checks the peer in its handshake, before any byte is sent on it.
        connector = aiohttp.TCPConnector(ssl=pinned_to(self.ssl_context, self.agent_id, self.pinned), limit=0)
        self._session = aiohttp.ClientSession(connector=connector)
        try:
            while self.state is not LinkState.CLOSED:
                error: MeshError | None = None
                try:
                    await self._connect_and_read()
                except (aiohttp.ClientError, OSError, MeshError, TimeoutError) as e:
                    error = await self._explain(e)
                finally:
                    self._mark_down()
                if self.closed:
                    break
                self.state = LinkState.DOWN
                await asyncio.sleep(self._record_down(error))
                if self.state is not LinkState.CLOSED:
                    self.state = LinkState.CONNECTING
        finally:
            await self._session.close()

    def _record_down(self, error: MeshError | None) -> float:
        """Account the failure, log an outage's start (or a changed reason), return the delay in s."""
        if error is None:
            error = MeshError(MeshCode.LINK_CLOSED, "the connection ended")
        previous_code = self.last_error_code
        self.last_error, self.last_error_code = f"{error.code}: {error.message}", error.code
        new_outage = self.health.went_down(time.monotonic())
        self.last_delay_s = self.backoff.next_delay(self.health.failures)
        ev = {"peer": self.agent_id, "code": error.code, "error": self.last_error, "outages": self.health.outages,
              "failures": self.health.failures, "retry_in_s": round(self.last_delay_s, 3)}
        crashed = self._ended_cleanly is False
        ev["peer_stopped"] = "cleanly" if self._ended_cleanly else ("crashed" if crashed else None)
        self._ended_cleanly = None
        level = logging.WARNING if error.code in _TRUST_CODES or crashed else logging.INFO
        if new_outage:
            log.log(level, "link_down", extra={"ev": ev, "state_change": True})
        elif error.code != previous_code:  # by code: messages may differ from one attempt to the next
            log.log(level, "link_still_down", extra={"ev": ev})
        return self.last_delay_s

    async def _explain(self, e: BaseException) -> MeshError:
        """The failure as a MeshError; a refused WebSocket upgrade as the peer's own code and message."""
        if isinstance(e, MeshError):
            return e
        refused = PeerRefused.within(e)
        if refused is not None:
            log.warning(refused.code, extra={"ev": {"peer": self.agent_id, "detail": refused.message}})
            return refused
        if isinstance(e, aiohttp.WSServerHandshakeError) and 400 <= e.status < 600:
            return await self._refusal(e.status)
        return MeshError(MeshCode.CONNECT_FAILED, f"{type(e).__name__}: {e}")

    async def _refusal(self, status: int) -> MeshError:
        """Ask why the peer refused the upgrade: aiohttp drops that answer's body, so send one plain GET
        to the same path (the same identity checks answer it), bounded in time and size."""
        code, reason = "refused", f"HTTP {status} to the WebSocket upgrade"
        assert self._session is not None
        try:
            async with self._session.get(self.url + WS_PATH,
                                         timeout=aiohttp.ClientTimeout(total=REFUSAL_PROBE_TIMEOUT_S)) as resp:
                body = await resp.content.read(REFUSAL_BODY_MAX)
                same = resp.status == status
            err = orjson.loads(body).get("error") if same else None
        except (aiohttp.ClientError, OSError, MeshError, TimeoutError, orjson.JSONDecodeError, AttributeError):
            err = None
        if isinstance(err, dict) and isinstance(err.get("code"), str) and _ERROR_CODE.fullmatch(err["code"]) \
                and isinstance(err.get("message"), str):
            code, reason = err["code"], err["message"][:REFUSAL_MESSAGE_MAX]
        return MeshError(code, f"{self.agent_id} refused this node (HTTP {status}): {reason}")

    async def _connect_and_read(self) -> None:
        assert self._session is not None
        if self.member is not None and not self.member(self.agent_id):
            raise MeshError(MeshCode.NOT_A_MEMBER,
                            f"{self.agent_id} has no .pub in this node's peers/ and mesh.trust is "
                            "\"pinned\": not dialled until its .pub is imported")
        ws = await self._session.ws_connect(self.url + WS_PATH, timeout=aiohttp.ClientWSTimeout(ws_close=2.0),
                                            max_msg_size=self.ws_max_msg_size, heartbeat=None, compress=0,
                                            autoping=False, protocols=(BATCH_SUBPROTOCOL,))
        self._ws = ws
        self.batch_frames = ws.protocol == BATCH_SUBPROTOCOL
        self.state = LinkState.UP
        self.connected_at = time.time()
        down_for = self.health.went_up(time.monotonic())
        self.last_error = self.last_error_code = None
        self._up.set()
        ev: dict[str, object] = {"peer": self.agent_id, "url": self.url}
        if down_for is not None:
            ev.update(recovered=True, down_s=round(down_for, 3), outages=self.health.outages)
        log.info("link_up", extra={"ev": ev})
        for cb in self._on_up:
            cb()
        error, peer_code = await self._read_until_ended(ws)
        if error is not None:
            self._ended_cleanly = False
            # 1011 rather than 1006, which RFC 6455 forbids in a close frame
            await ws.close(code=getattr(error, "code", aiohttp.WSCloseCode.INTERNAL_ERROR))
            raise MeshError(MeshCode.WS_ERROR, str(error))
        await ws.close()  # answers the peer's close frame (or returns at once after our own close)
        code = peer_code or ws.close_code
        self._ended_cleanly = self.closed or code in CLEAN_CLOSE_CODES
        raise MeshError(MeshCode.LINK_CLOSED, f"peer closed the socket (code {code})")

    async def _read_until_ended(self, ws: aiohttp.ClientWebSocketResponse) -> tuple[BaseException | None, int | None]:
        """Read ACK frames (to ``on_ack_frame``) in a task of this one until the socket ends or the heartbeat gives
        up on the peer; (None for the peer's close or the end of the stream, else the error; the code of the
        peer's close frame, None without one)."""
        reading = _Reading(self)
        ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

        def end(error: BaseException | None) -> None:
            if not ended.done():
                ended.set_result(error)

        reader = asyncio.create_task(self._read(ws, reading, end))
        heartbeat = Heartbeat(reading, lambda: None if ws.closed else send_now(ws.ping(b"")), lambda: end(
            TimeoutError(f"no pong from {self.agent_id} within {HEARTBEAT_S / 2:g} s of a ping")), HEARTBEAT_S)
        try:
            return await ended, reading.peer_close_code
        finally:
            heartbeat.stop()
            reader.cancel()  # a reader still waiting (the heartbeat gave up): close() reads what is left
            await asyncio.wait({reader}, timeout=READER_STOP_S)

    @staticmethod
    async def _read(ws: aiohttp.ClientWebSocketResponse, reading: _Reading,
                    end: Callable[[BaseException | None], None]) -> None:
        end(await read_frames(ws, reading))

    def on_ack_frame(self, data: bytes) -> None:
        """One frame the peer sent on this link's socket: an ACK or a batch of them."""
        ack = accepted_ack(data, self.agent_id, self.max_bytes)  # the usual frame, matched byte for byte
        if ack is not None:
            self._on_ack(ack)
            return
        try:
            msg = decode_wire(data, self.max_bytes)
        except ProtocolError as e:
            log.warning("protocol_error", extra={"ev": {"peer": self.agent_id, "code": e.code, "detail": e.message}})
            return
        if isinstance(msg, Batch):
            for item in msg.items:
                try:
                    self._on_ack(decode_frame(item, self.max_bytes))
                except ProtocolError as e:
                    log.warning("protocol_error", extra={"ev": {"peer": self.agent_id, "code": e.code,
                                                                "detail": e.message}})
            return
        self._on_ack(msg)

    def _on_ack(self, msg: Envelope | Ack) -> None:
        if not isinstance(msg, Ack):
            log.warning("unexpected_envelope", extra={"ev": {"peer": self.agent_id,
                                                             "correlation_id": msg.correlation_id}})
            return
        fut = self._pending.pop(msg.correlation_id, None)
        if fut is not None and not fut.done():
            self.last_ack_at = time.time()
            fut.set_result(msg)

    def _mark_down(self) -> None:
        self._up.clear()
        self._ws = None
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(MeshError(MeshCode.LINK_DOWN, f"link to {self.agent_id} went down before the ACK"))
        self._pending.clear()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadlines.clear()

    async def send(self, env: Envelope, *, timeout_s: float | None = None) -> Ack:
        """Send one envelope and wait for its ACK (at most ``timeout_s``, default the ACK timeout).

        Raises MeshError ``link_down`` (no connection within the timeout or lost while waiting)
        or ``ack_timeout``. The caller (the outbox) decides about retries.
        """
        return await self.send_wire(env.correlation_id, env.to_wire(), timeout_s=timeout_s)

    def send_wire(self, correlation_id: str, frame: bytes, *, timeout_s: float | None = None) -> Awaitable[Ack]:
        """Send one envelope's wire bytes; await the result for its ACK (at most ``timeout_s``, default the
        ACK timeout), as ``send`` does, with the same errors.

        While the link is up and the socket takes the frame at once, this writes it now and returns the
        future the ACK settles, bounded by the link's ACK deadline queue: a caller fanning out with
        ``asyncio.gather`` spends no task, no coroutine and no ``asyncio.timeout`` per peer. Otherwise it returns
        a coroutine that waits.
        """
        timeout = self.ack_timeout_s if timeout_s is None else timeout_s
        ws = self._ws
        if ws is None or ws.closed or not self._up.is_set():
            return self._send_wire_waiting(correlation_id, frame, timeout)
        # the loop run() keeps: asyncio.get_running_loop() is a getpid() system call in 3.11, once per peer per
        # envelope here
        loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + timeout
        fut = self._future(correlation_id, loop)
        sending = ws.send_bytes(frame)
        try:
            yielded = sending.send(None)
        except StopIteration:  # written
            pass
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as e:
            self._pending.pop(correlation_id, None)
            return self._failed(MeshError(MeshCode.LINK_DOWN, f"send to {self.agent_id} failed: {e}"))
        else:  # the transport is over its high-water mark: the rest of the send waits for it to drain
            return self._finish_send(correlation_id, fut, Resumed(sending, yielded), deadline, timeout)
        self._arm_ack_timer(correlation_id, fut, deadline, timeout)
        return fut

    @staticmethod
    def _failed(error: MeshError) -> asyncio.Future[Ack]:
        fut: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        fut.set_exception(error)
        return fut

    def _arm_ack_timer(self, correlation_id: str, fut: asyncio.Future[Ack], deadline: float, timeout: float) -> None:
        """End ``fut`` as ``ack_timeout`` at ``deadline`` (loop time) unless its ACK comes first."""
        heap = self._deadlines
        while heap and heap[0][3].done():  # answered already (usually the previous send's entry)
            self._settled(heapq.heappop(heap))
        if len(heap) > 2 * len(self._pending) + DEADLINE_SLACK:  # settled entries below the top: keep it bounded
            for entry in heap:
                if entry[3].done():
                    self._settled(entry)
            heap[:] = [entry for entry in heap if not entry[3].done()]
            heapq.heapify(heap)
        heapq.heappush(heap, (deadline, next(self._deadline_seq), correlation_id, fut, timeout))
        if self._deadline_timer is None or deadline < self._deadline_at:
            self._set_deadline_timer(fut.get_loop(), deadline)

    def _set_deadline_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        # the future's loop: asyncio.get_running_loop() makes a getpid() system call on each call in 3.11
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_at = at
        self._deadline_timer = loop.call_at(at, self._deadlines_due, loop)

    def _deadlines_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The deadline timer: every send due by now without its ACK ends as ``ack_timeout``; the timer is set
        again for the earliest still waiting."""
        self._deadline_timer = None
        heap, now = self._deadlines, loop.time() + DEADLINE_EARLY_S
        while heap and (heap[0][0] <= now or heap[0][3].done()):
            entry = heapq.heappop(heap)
            _, _, correlation_id, fut, timeout = entry
            if fut.done():
                self._settled(entry)
            else:
                self._ack_late(correlation_id, fut, timeout)
        if heap:
            self._set_deadline_timer(loop, heap[0][0])

    def _settled(self, entry: tuple[float, int, str, asyncio.Future[Ack], float]) -> None:
        """A deadline entry whose future is done: one its caller cancelled (no ACK came) still sits in
        ``_pending`` and goes now (an ACK's future left ``_pending`` when the ACK came)."""
        _, _, correlation_id, fut, _ = entry
        if self._pending.get(correlation_id) is fut:
            del self._pending[correlation_id]

    def _ack_late(self, correlation_id: str, fut: asyncio.Future[Ack], timeout: float) -> None:
        if self._pending.get(correlation_id) is fut:
            del self._pending[correlation_id]
        if not fut.done():
            fut.set_exception(MeshError(MeshCode.ACK_TIMEOUT, f"no ACK from {self.agent_id} within {timeout:.3g} s"))

    async def _finish_send(self, correlation_id: str, fut: asyncio.Future[Ack], sending: Awaitable[None],
                           deadline: float, wait_s: float) -> Ack:
        try:
            await sending
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as e:
            self._pending.pop(correlation_id, None)
            raise MeshError(MeshCode.LINK_DOWN, f"send to {self.agent_id} failed: {e}") from None
        self._arm_ack_timer(correlation_id, fut, deadline, wait_s)
        return await fut

    async def _send_wire_waiting(self, correlation_id: str, frame: bytes, wait_s: float) -> Ack:
        """send_wire when the link is not up yet: wait for it (within ``wait_s``), then send."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        if not self._up.is_set():
            try:
                await asyncio.wait_for(self._up.wait(), wait_s)
            except TimeoutError:
                raise MeshError(MeshCode.LINK_DOWN, f"no connection to {self.agent_id} ({self.last_error})") from None
        ws = self._ws
        if ws is None or ws.closed:
            raise MeshError(MeshCode.LINK_DOWN, f"no connection to {self.agent_id}")
        fut = self._future(correlation_id, loop)
        return await self._finish_send(correlation_id, fut, ws.send_bytes(frame), deadline, wait_s)

    async def send_many(self, frames: Sequence[tuple[str, bytes]], *,
                        timeout_s: float | None = None) -> list[Ack | MeshError]:
        """Send many (correlation_id, envelope wire bytes) items and wait for their ACKs, at most ``timeout_s``
        in all (default the ACK timeout).

        Items go out in order, as batch frames when the peer negotiated them (``batch_frames``), else one
        frame each, all pipelined. Returns, in the items' order, each one's ACK or its MeshError
        (``link_down``: no connection within the timeout, the send failed or the link was lost before the
        ACK; ``ack_timeout``); never raises for a per-item failure.
        """
        if not frames:
            return []
        timeout = self.ack_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ws = await self._socket(timeout)
        if isinstance(ws, MeshError):
            return [ws] * len(frames)
        futures = [self._future(cid, loop) for cid, _ in frames]
        try:
            await self._write_many(ws, frames)
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as e:
            self._forget(frames, futures)
            failed = MeshError(MeshCode.LINK_DOWN, f"send to {self.agent_id} failed: {e}")
            return [self._outcome(fut) or failed for fut in futures]
        waiting = {fut for fut in futures if not fut.done()}
        if waiting:
            try:
                await asyncio.wait(waiting, timeout=max(0.0, deadline - loop.time()))
            finally:
                self._forget(frames, futures)
        late = MeshError(MeshCode.ACK_TIMEOUT, f"no ACK from {self.agent_id} within {timeout:.3g} s")
        return [self._outcome(fut) or late for fut in futures]

    async def _socket(self, wait_s: float) -> aiohttp.ClientWebSocketResponse | MeshError:
        """The open socket, waiting up to ``wait_s`` for the link to come up; else ``link_down``."""
        if not self._up.is_set():
            try:
                await asyncio.wait_for(self._up.wait(), wait_s)
            except TimeoutError:
                return MeshError(MeshCode.LINK_DOWN, f"no connection to {self.agent_id} ({self.last_error})")
        ws = self._ws
        if ws is None or ws.closed:
            return MeshError(MeshCode.LINK_DOWN, f"no connection to {self.agent_id}")
        return ws

    def _future(self, correlation_id: str, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Ack]:
        """The future the ACK for ``correlation_id`` settles (shared by concurrent sends of one id)."""
        fut = self._pending.get(correlation_id)
        if fut is None or fut.done():  # done while still here: its sender cancelled it (a retry gets a new one)
            fut = self._pending[correlation_id] = loop.create_future()
        return fut

    def _forget(self, frames: Sequence[tuple[str, bytes]], futures: list[asyncio.Future[Ack]]) -> None:
        """Stop matching ACKs to these items' futures (those still waiting end as ack_timeout)."""
        for (cid, _), fut in zip(frames, futures, strict=True):
            if not fut.done() and self._pending.get(cid) is fut:
                del self._pending[cid]

    async def _write_many(self, ws: aiohttp.ClientWebSocketResponse, frames: Sequence[tuple[str, bytes]]) -> None:
        if not self.batch_frames or len(frames) == 1:
            for _, frame in frames:
                await ws.send_bytes(frame)
            return
        for run in plan_batches([len(frame) for _, frame in frames]):
            if len(run) == 1:
                await ws.send_bytes(frames[run[0]][1])
            else:
                await ws.send_bytes(encode_batch(frames[i][1] for i in run))

    @staticmethod
    def _outcome(fut: asyncio.Future[Ack]) -> Ack | MeshError | None:
        """A settled future's ACK or MeshError; None while it waits (or was cancelled)."""
        if not fut.done() or fut.cancelled():
            return None
        exc = fut.exception()
        if exc is None:
            return fut.result()
        return exc if isinstance(exc, MeshError) else MeshError(MeshCode.LINK_DOWN, f"{type(exc).__name__}: {exc}")

    async def fetch(self, path: str, params: Mapping[str, int | str], *, timeout_s: float) -> bytes:
        """GET ``path`` on the peer over the link's mTLS session (identity verified); returns the body.

        Raises MeshError ``link_down`` when no session runs, ``rate_limited`` on a 429 (the peer's budget for
        us is spent for now), ``http_error`` on any other non-200 answer.
        """
        if self._session is None or self._session.closed:
            raise MeshError(MeshCode.LINK_DOWN, f"no session to {self.agent_id}")
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session.get(self.url + path, params=dict(params), timeout=timeout) as resp:
            body = await resp.read()
            if resp.status == 429:
                raise MeshError(MeshCode.RATE_LIMITED, f"GET {path} on {self.agent_id}: HTTP 429: {body[:200]!r}")
            if resp.status != 200:
                raise MeshError(MeshCode.HTTP_ERROR,
                                f"GET {path} on {self.agent_id}: HTTP {resp.status}: {body[:200]!r}")
            return body

    async def close(self) -> None:
        self.state = LinkState.CLOSED
        ws = self._ws
        if ws is not None:
            await ws.close()
        self._up.set()  # wake senders waiting for a connection; they find it closed


async def post_envelope(url: str, env: Envelope, ssl_context: ssl.SSLContext, *, expected_agent_id: str,
                        pinned: Mapping[str, Ed25519PublicKey], timeout_s: float,
                        max_bytes: int) -> tuple[int, Ack | None, dict[str, Any] | None]:
    """POST one envelope to ``/a2a/v1/messages``: returns (HTTP status, ACK or None, JSON error or None)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(ssl=pinned_to(ssl_context, expected_agent_id, lambda: pinned))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
        try:
            async with s.post(url + MESSAGES_PATH, data=env.to_wire(),
                              headers={"Content-Type": "application/cbor"}) as resp:
                body = await resp.read()
        except aiohttp.ClientConnectorError as e:
            refused = PeerRefused.within(e)  # the peer is not who we meant to reach: its MeshError
            if refused is None:
                raise
            raise refused from None
    if resp.content_type == "application/cbor":
        ack = decode_frame(body, max_bytes)
        return resp.status, ack if isinstance(ack, Ack) else None, None
    try:
        return resp.status, None, orjson.loads(body)
    except orjson.JSONDecodeError:
        return resp.status, None, {"error": {"code": "http", "message": body[:200].decode(errors="replace")}}
