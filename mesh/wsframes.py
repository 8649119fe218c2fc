"""What both mesh sockets (mesh/server.py's inbound one, mesh/link.py's outbound one) share beside aiohttp's
public WebSocket API: the heartbeat, and writing a control frame without a task.

Each socket reads with ``receive()`` (``autoping=False``: pings, pongs and closes come to the socket's own
loop), sets ``heard`` on every message, and answers a ping with its pong at once. The frames on the wire are
aiohttp's, unchanged.

``receive()`` returns without waiting while aiohttp holds frames already parsed (all those one TCP read carried);
given an ``idle`` callback, ``read_frames`` steps it once by hand to learn whether it would wait, and calls
``idle()`` just before it does: the server writes there the ACKs of everything that read carried, in the reader's
own task step, instead of in a loop callback one turn later (one wake-up per read, not two).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from aiohttp import ClientWebSocketResponse, WSCloseCode, WSMsgType, web

from mesh.receive import Resumed

# A peer that stops cleanly closes with one of these (1000, 1001: its drain); anything else that ends an open
# socket (1006: the connection dropped with no close frame, as when the peer's process dies) is a crash.
CLEAN_CLOSE_CODES = frozenset({WSCloseCode.OK, WSCloseCode.GOING_AWAY})

log = logging.getLogger("mesh.wsframes")

# Seconds a mesh socket may stay silent before it is pinged; no answer within half of it ends the socket.
HEARTBEAT_S = 15.0


class Heard(Protocol):
    heard: bool  # set on every message read (the heartbeat clears it)


class FrameSink(Heard, Protocol):
    peer: str
    # The code of the peer's close frame, once one came (what aiohttp's own close leaves in ``close_code`` is
    # 1006 when the peer hung up right after it: not what the peer said).
    peer_close_code: int | None

    def on_frame(self, data: bytes) -> Awaitable[None] | None:
        """One binary message; what it returns (if anything) is awaited before the next is read (room to take
        more)."""


async def read_frames(ws: ClientWebSocketResponse[Any] | web.WebSocketResponse[Any], sink: FrameSink,
                      idle: Callable[[], None] | None = None) -> BaseException | None:
    """Read ``ws`` (opened with ``autoping=False``) until it ends: each binary message to ``sink.on_frame``, each
    ping answered with its pong at once, a text frame logged and ignored. Returns None when the peer closed or
    the stream ended (aiohttp has answered the close), else the error (a parse error, an oversized frame; aiohttp
    has closed the socket with its code). ``idle()``, when given, is called whenever the reader is about to wait
    (for the next read, or for room), every frame read so far handed to ``on_frame``."""
    on_idle = _nothing if idle is None else idle
    while True:
        msg = await ws.receive() if idle is None else _next_message(ws, idle)
        if isinstance(msg, Resumed):
            msg = await msg
        sink.heard = True
        kind = msg.type
        if kind is WSMsgType.BINARY:
            room = sink.on_frame(msg.data)
            if room is not None:
                on_idle()
                await room
        elif kind is WSMsgType.PING:
            if not ws.closed:
                send_now(ws.pong(msg.data))
        elif kind is WSMsgType.PONG:
            pass  # any message read counts for the heartbeat
        elif kind is WSMsgType.TEXT:
            log.warning("protocol_error", extra={"ev": {"peer": sink.peer, "code": "text_frame"}})
        else:  # an error, a close: the socket ends
            on_idle()
            return _ending(msg, sink)


def _nothing() -> None:
    pass


def _next_message(ws: ClientWebSocketResponse[Any] | web.WebSocketResponse[Any], idle: Callable[[], None]) -> Any:
    """The next message when aiohttp has it parsed already, else (after ``idle()``) the awaitable that waits
    for it: ``receive()`` stepped once by hand."""
    receiving = ws.receive()
    try:
        waiting = receiving.send(None)
    except StopIteration as done:
        return done.value
    idle()
    return Resumed(receiving, waiting)


def _ending(msg: Any, sink: FrameSink) -> BaseException | None:
    """What an error or close message ends the socket with (read_frames' return)."""
    if msg.type is WSMsgType.ERROR:
        error = msg.data
        return error if isinstance(error, BaseException) else RuntimeError(str(error))
    if msg.type is WSMsgType.CLOSE and isinstance(msg.data, int):  # else closing, closed
        sink.peer_close_code = msg.data
    return None


class Heartbeat:
    """Pings a socket that read nothing for a whole ``interval_s`` tick (so after ``interval_s`` to twice that
    of silence) and calls ``dead`` when nothing (a pong or any message) comes back within half of it. One
    timer per socket, re-armed once an interval; reading only sets ``sink.heard`` (aiohttp's own heartbeat
    schedules a callback per read)."""

    def __init__(self, sink: Heard, ping: Callable[[], None], dead: Callable[[], None],
                 interval_s: float) -> None:
        self.sink, self.ping, self.dead, self.interval_s = sink, ping, dead, interval_s
        self.loop = asyncio.get_running_loop()
        self.pinged = False
        self.timer = self.loop.call_later(interval_s, self._tick)

    def _tick(self) -> None:
        if self.sink.heard:
            self.sink.heard = self.pinged = False
            self.timer = self.loop.call_later(self.interval_s, self._tick)
        elif self.pinged:
            self.dead()
        else:
            self.pinged = True
            self.ping()
            self.timer = self.loop.call_later(self.interval_s / 2, self._tick)

    def stop(self) -> None:
        self.timer.cancel()


def send_now(sending: Coroutine[Any, Any, None]) -> None:
    """Write a control frame (ping, pong) now, without waiting for the transport to drain (a task per ping
    is not worth it); a socket already going away drops it."""
    try:
        sending.send(None)
    except (StopIteration, ConnectionError, RuntimeError):
        return
    sending.close()
