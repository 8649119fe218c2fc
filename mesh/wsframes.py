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
from typing import Any, Protocol

from aiohttp import WSMsgType
from aiohttp._websocket.reader import WebSocketDataQueue

log = logging.getLogger("mesh.wsframes")


class FrameSink(Protocol):
    peer: str

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
        kind = data[0]
        if kind is WSMsgType.BINARY:
            self.sink.on_frame(data[1])
        elif kind is WSMsgType.PING:
            self.sink.on_ping(data[1])
        elif kind is WSMsgType.PONG:
            pass  # any data read resets the heartbeat
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

