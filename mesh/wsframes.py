"""Frames from aiohttp's WebSocket parser, handed to the mesh socket in the parser's own call.

aiohttp reads a WebSocket through a message queue: the C parser puts each message in it and the
socket's task wakes up in ``receive()`` to take it. ``FrameQueue`` replaces that queue on the mesh
sockets (both ends): a data frame goes to ``FrameSink.on_frame`` at once, a ping is answered at once,
and only what aiohttp's own ``close()`` reads (a close frame, the end of the stream, a parse error) is
queued as before, and ends the sink. The frames on the wire do not change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from aiohttp import WSCloseCode, WSMsgType
from aiohttp._websocket.reader import WebSocketDataQueue

# A peer that stops cleanly closes with one of these (1000, 1001: its drain); anything else that ends an open
# socket (1006: the connection dropped with no close frame, as when the peer's process dies) is a crash.
CLEAN_CLOSE_CODES = frozenset({WSCloseCode.OK, WSCloseCode.GOING_AWAY})

log = logging.getLogger("mesh.wsframes")


# Seconds a mesh socket may stay silent before it is pinged; no answer within half of it ends the socket.
HEARTBEAT_S = 15.0


class FrameSink(Protocol):
    peer: str
    heard: bool  # set on every message read (the heartbeat clears it)

    def on_frame(self, data: bytes) -> None:
        """One binary message, in the parser's call (it must not block)."""

    def on_ping(self, data: bytes) -> None:
        """A ping to answer with a pong carrying ``data``."""

    def end(self, error: BaseException | None) -> None:
        """The socket is ending: the peer's close or the end of the stream (None), or a parse error."""


class FrameQueue(WebSocketDataQueue):
    """aiohttp's WebSocket message queue, with data frames and pings handed to ``sink`` at once."""

    def __init__(self, sink: FrameSink, protocol: Any, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(protocol, limit, loop=loop)
        self.sink = sink

    def feed_data(self, data: Any, size: int) -> None:
        self.sink.heard = True
        kind = data[0]
        if kind is WSMsgType.BINARY:
            self.sink.on_frame(data[1])
        elif kind is WSMsgType.PING:
            self.sink.on_ping(data[1])
        elif kind is WSMsgType.PONG:
            pass  # any message read counts for the heartbeat
        elif kind is WSMsgType.TEXT:
            log.warning("protocol_error", extra={"ev": {"peer": self.sink.peer, "code": "text_frame"}})
        else:  # close, closing, error: for aiohttp's close() to read
            super().feed_data(data, size)
            if kind is WSMsgType.CLOSE:
                self.sink.end(None)

    def feed_eof(self) -> None:
        super().feed_eof()
        self.sink.end(None)

    def set_exception(self, exc: BaseException, *args: Any) -> None:
        super().set_exception(exc, *args)
        self.sink.end(exc)



class Heartbeat:
    """Pings a socket that read nothing for a whole ``interval_s`` tick (so after ``interval_s`` to twice that
    of silence) and calls ``dead`` when nothing (a pong or any message) comes back within half of it. One
    timer per socket, re-armed once an interval; reading only sets ``sink.heard`` (aiohttp's own heartbeat
    schedules a callback per read)."""

    def __init__(self, sink: FrameSink, ping: Callable[[], None], dead: Callable[[], None],
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
