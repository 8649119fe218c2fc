"""The node's local socket: length-prefixed JSON tool calls between a running node and the processes of its
own host (``ai-memory mcp`` joining it, ``ai-memory status``/``peers``/``doctor`` asking it).

A frame is a 4-byte big-endian length, then one JSON document. A request is ``{tool, args}``; its answer
``{ok: result}`` or ``{error: {code, message}}``. ``start_local_socket`` serves a ``ToolBackend`` on the
socket (mode 0600); ``SocketClientBackend`` is the backend at the other end, and ``ask_node`` one call
through it. Nothing here loads the MCP SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from node.config import LimitsConfig, NodeConfig
from node.errors import ServiceError, describe
from node.mcp.registry import JSON, READ_ONLY_TOOLS, Args

if TYPE_CHECKING:
    from node.mcp.backend import ToolBackend

log = logging.getLogger("node.mcp")

# Local-socket framing: 4-byte big-endian length, then one JSON document.
_HEADER = struct.Struct(">I")
# Frame cap: a full recall page (100 hits of 64 KiB) fits with room to spare; bigger is a bug or abuse.
MAX_FRAME_BYTES = 32 * 1024 * 1024
# Bound on connecting to the node's socket; a live node accepts at once.
CONNECT_TIMEOUT_S = 2.0
# A restarting node is waited for this long (in at most RECONNECT_ATTEMPTS tries, RECONNECT_FIRST_DELAY_S
# apart at first, doubling up to RECONNECT_MAX_DELAY_S): a restart opens its database before the socket.
RECONNECT_WINDOW_S = 15.0
RECONNECT_ATTEMPTS = 30
RECONNECT_FIRST_DELAY_S = 0.05
RECONNECT_MAX_DELAY_S = 1.0
# How long stop() waits for in-flight local-socket calls before cancelling them.
SOCKET_DRAIN_S = 2.0
# ask_node: a running node answers at once; a node that does not is reported, not waited on. Seconds.
ASK_TIMEOUT_S = 10.0


# ---- framing --------------------------------------------------------------------------------

def encode_frame(obj: Any) -> bytes:
    """``obj`` as one frame: its JSON's length (4 bytes, big-endian), then the JSON."""
    body = orjson.dumps(obj)
    return _HEADER.pack(len(body)) + body


class BadBody(ServiceError):
    """A whole frame whose body is not a JSON document this node takes (not JSON, nested past the parser's
    1024 levels, a lone surrogate escape): the framing is intact, so the connection can go on."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_frame", message)


async def read_frame(reader: asyncio.StreamReader) -> Any | None:
    """One framed JSON document, or None at a clean EOF; ServiceError('bad_frame') on garbage: BadBody when the
    frame was read whole (the next frame can be read), another when the framing is lost."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise ServiceError("bad_frame", "connection closed inside a frame header") from None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ServiceError("bad_frame", f"frame of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte cap")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise ServiceError("bad_frame", "connection closed inside a frame") from None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadBody(f"frame is not a JSON document this node takes: {e}") from None


def error_reply(exc: BaseException) -> dict[str, Any]:
    """The ``{error: {code, message}}`` answer for a failed call (``internal`` for an unexpected exception)."""
    d = describe(exc)
    return {"error": {"code": d.code, "message": d.message}}


# ---- the node's side ------------------------------------------------------------------------

@dataclass
class SocketHandle:
    """A serving local socket; ``stop()`` ends it."""

    path: Path
    _server: asyncio.Server
    _conns: set[asyncio.Task[Any]] = field(default_factory=set)

    async def stop(self) -> None:
        """Stop accepting, let in-flight calls finish (bounded), close connections, remove the file."""
        self._server.close()
        conns = list(self._conns)
        if conns:
            _, pending = await asyncio.wait(conns, timeout=SOCKET_DRAIN_S)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=SOCKET_DRAIN_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), SOCKET_DRAIN_S)
        await asyncio.to_thread(self.path.unlink, missing_ok=True)


async def _remove_stale_socket(path: Path) -> None:
    try:
        st = await asyncio.to_thread(path.lstat)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServiceError("socket_path_taken", f"{path} exists and is not a socket; refusing to replace it")
    try:
        _, w = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        await asyncio.to_thread(path.unlink, missing_ok=True)  # nobody listens: a leftover from a node that died
        return
    w.close()
    raise ServiceError("socket_in_use", f"another process is serving {path}; is a node already running?")


async def start_local_socket(backend: ToolBackend, path: Path) -> SocketHandle:
    """Serve tool calls on a Unix socket at ``path`` (mode 0600): frames ``{tool, args}`` ->
    ``{ok: result}`` | ``{error: {code, message}}``, each a 4-byte big-endian length then JSON."""
    path = Path(path)
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)  # a private directory closes the bind-to-chmod window
    await _remove_stale_socket(path)
    conns: set[asyncio.Task[Any]] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's callback in a task of its own
        conns.add(task)
        try:
            await _serve_connection(backend, reader, writer)
        finally:
            conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), SOCKET_DRAIN_S)

    server = await asyncio.start_unix_server(on_connect, str(path), limit=MAX_FRAME_BYTES)
    os.chmod(path, 0o600)
    return SocketHandle(path, server, conns)


async def _serve_connection(backend: ToolBackend, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
    """Answer each frame in order. A frame that is not a request is answered with its error and the connection
    goes on; one whose framing is lost (cut short, over the cap) is answered, then the connection is closed. A
    ``hello`` names the agent the connection's calls run as from then on (docs/mcp.md, "Agents")."""
    agent: str | None = None
    while True:
        try:
            request = await read_frame(reader)
        except BadBody as exc:
            reply: dict[str, Any] = error_reply(exc)
        except Exception as exc:  # framing is lost: say why, then drop the connection
            await _answer(writer, error_reply(exc))
            return
        else:
            if request is None:
                return
            if isinstance(request, dict) and "hello" in request:
                reply, agent = await _hello(backend, request["hello"], agent)
            else:
                reply = await _call(backend, request, agent)
        if not await _answer(writer, reply):
            return


async def _hello(backend: ToolBackend, hello: Any, agent: str | None) -> tuple[dict[str, Any], str | None]:
    """``{hello: {agent: ID}}``: the agent the connection acts as from now on (made on first use); answered with
    who it is. A refused hello leaves the connection as it was."""
    if not isinstance(hello, dict) or not isinstance(hello.get("agent"), str):
        return {"error": {"code": "bad_request", "message": "hello must be an object {agent: string}"}}, agent
    try:
        return {"ok": await backend.hello(hello["agent"])}, hello["agent"]
    except Exception as exc:  # reported to the caller; the connection keeps serving as before
        return error_reply(exc), agent


async def _call(backend: ToolBackend, request: Any, agent: str | None = None) -> dict[str, Any]:
    if (not isinstance(request, dict) or not isinstance(request.get("tool"), str)
            or not isinstance(request.get("args", {}), dict)):
        return {"error": {"code": "bad_request", "message": "request must be an object {tool: string, args: object}"}}
    try:
        return {"ok": await backend.call(request["tool"], request.get("args") or {}, agent)}
    except Exception as exc:  # reported to the caller; the connection keeps serving
        reply = error_reply(exc)
        if reply["error"]["code"] == "internal":
            log.exception("local-socket call %s failed unexpectedly", request["tool"])
        return reply


async def _answer(writer: asyncio.StreamWriter, reply: dict[str, Any]) -> bool:
    """Write one answer; False when the peer is gone. An answer that cannot be encoded is answered ``internal``."""
    try:
        frame = encode_frame(reply)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError: nesting past 255, a lone surrogate
        log.warning("local-socket answer not encodable: %s", exc)
        frame = encode_frame({"error": {"code": "internal", "message": f"the answer could not be encoded: {exc}"}})
    try:
        writer.write(frame)
        await writer.drain()
    except OSError:
        return False
    return True


# ---- the client's side ----------------------------------------------------------------------

class SocketClientBackend:
    """Forwards tool calls to a running node over its local socket; one connection, one call at a time.

    The node may restart under a long-lived session. A connection found closed before a request is
    written, or one that fails while writing, is replaced (waiting up to ``reconnect_window_s`` for the
    node to come back) and the request sent on the new one: it never reached the node. When the
    connection is lost after the request was written, the answer is lost with it: a read-only tool is
    sent again, any other fails ``node_restarted`` (it may or may not have been applied; it is never
    silently run twice).
    """

    def __init__(self, path: Path, *, limits: LimitsConfig, call_timeout_s: float,
                 reconnect_window_s: float = RECONNECT_WINDOW_S, agent: str | None = None) -> None:
        self.path = Path(path)
        # The agent every call of this client runs as (named in a hello on each connection); None: the node.
        self.agent = agent
        # What the node answered the last hello (the agent, its key's fingerprint, its delegation).
        self.whoami: dict[str, Any] | None = None
        # Used only for the tool list shown to clients; the node checks arguments against its own.
        self.limits = limits
        self.call_timeout_s = call_timeout_s
        self.reconnect_window_s = reconnect_window_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self.reconnects = 0

    @classmethod
    async def connect(cls, path: Path, *, limits: LimitsConfig, call_timeout_s: float = 30.0,
                      reconnect_window_s: float = RECONNECT_WINDOW_S, agent: str | None = None) -> SocketClientBackend:
        """Connect or raise OSError/TimeoutError (no node listening). ``call_timeout_s`` bounds each call;
        ``reconnect_window_s`` how long a call waits for a restarting node (seconds); ``agent``: the agent every
        call runs as (ServiceError when the node refuses it, ``node_too_old`` from a node that knows no agents)."""
        self = cls(path, limits=limits, call_timeout_s=call_timeout_s, reconnect_window_s=reconnect_window_s,
                   agent=agent)
        await self._connect()
        return self

    @classmethod
    async def wait(cls, path: Path, *, limits: LimitsConfig, within_s: float,
                   call_timeout_s: float = 30.0, agent: str | None = None) -> SocketClientBackend:
        """Connect to a node that may still be starting, trying for up to ``within_s`` seconds (the restart
        schedule's delays); ServiceError node_unavailable when none answers by then."""
        self = cls(path, limits=limits, call_timeout_s=call_timeout_s, reconnect_window_s=within_s, agent=agent)
        await self._reconnect()
        self.reconnects = 0
        return self

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(self.path), limit=MAX_FRAME_BYTES), CONNECT_TIMEOUT_S)
        if self.agent is not None:
            await self._hello(self.agent)

    async def _hello(self, agent: str) -> None:
        """Name the agent this connection acts as; a node older than agents answers a hello ``bad_request``."""
        assert self._reader is not None and self._writer is not None
        self._writer.write(encode_frame({"hello": {"agent": agent}}))
        await self._writer.drain()
        reply = await asyncio.wait_for(read_frame(self._reader), self.call_timeout_s)
        if isinstance(reply, dict) and isinstance(reply.get("ok"), dict):
            self.whoami = reply["ok"]
            return
        await self._drop()
        err = reply.get("error") if isinstance(reply, dict) else None
        if isinstance(err, dict) and err.get("code") == "bad_request":
            raise ServiceError("node_too_old", f"the node at {self.path} knows no agents (it answered the hello "
                                               f"{err.get('message')!r}): upgrade it, or connect without --agent-id")
        if isinstance(err, dict) and isinstance(err.get("code"), str) and isinstance(err.get("message"), str):
            raise ServiceError(err["code"], err["message"])
        raise ServiceError("bad_frame", f"unexpected hello reply from the node: {str(reply)[:80]}")

    async def hello(self, agent: str) -> dict[str, Any]:
        """Who this client acts as, as the node answered its hello (``agent`` is the one it was made with)."""
        if self.whoami is None:
            raise ServiceError("bad_input", "this client was connected without an agent")
        return self.whoami

    def is_open(self) -> bool:
        """A connection that has not been seen to close (EOF, reset or our own drop)."""
        # The node closing its end shows as EOF on our reader once the loop has seen it.
        return (self._writer is not None and not self._writer.is_closing()
                and self._reader is not None and not self._reader.at_eof() and self._reader.exception() is None)

    async def _reconnect(self) -> None:
        """Replace a dead connection, waiting (bounded) for a restarting node; node_unavailable if it does not come."""
        await self._drop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_window_s
        delay = RECONNECT_FIRST_DELAY_S
        last: BaseException | None = None
        # Enough tries to cover the window at the longest delay, and never unbounded.
        for _ in range(RECONNECT_ATTEMPTS + int(self.reconnect_window_s / RECONNECT_MAX_DELAY_S)):
            try:
                await self._connect()
                self.reconnects += 1
                return
            except (OSError, TimeoutError) as e:
                last = e
            if loop.time() + delay >= deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_DELAY_S)
        raise ServiceError("node_unavailable", f"the node at {self.path} is not answering "
                                               f"({type(last).__name__}: {last})") from None

    async def call(self, name: str, args: Args, agent: str | None = None) -> JSON:
        """Run ``name`` on the node as this client's agent (named at connect; ``agent`` is not sent per call)."""
        frame = encode_frame({"tool": name, "args": args})
        async with self._lock:
            reply = await self._exchange(name, frame)
        if isinstance(reply, dict) and "ok" in reply:
            result: JSON = reply["ok"]
            return result
        err = reply.get("error") if isinstance(reply, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), str) and isinstance(err.get("message"), str):
            raise ServiceError(err["code"], err["message"])
        raise ServiceError("bad_frame", f"unexpected reply from the node: {str(reply)[:80]}")

    async def _exchange(self, name: str, frame: bytes) -> Any:
        """Send one request and read its reply, replacing a dead connection at most twice."""
        for _ in range(3):
            if not self.is_open():
                await self._reconnect()
            assert self._reader is not None and self._writer is not None
            try:
                self._writer.write(frame)
                await self._writer.drain()
            except OSError:
                await self._drop()
                continue  # not delivered: send it on a new connection
            try:
                reply = await asyncio.wait_for(read_frame(self._reader), self.call_timeout_s)
            except TimeoutError:
                await self._drop()  # a late answer would be read as the next call's
                raise ServiceError("node_unavailable", f"the node at {self.path} did not answer {name} "
                                                       f"within {self.call_timeout_s:g} s") from None
            except OSError:
                reply = None  # reset: the answer is lost
            except ServiceError:
                if not self._reader.at_eof():
                    await self._drop()  # garbage from the node: framing is lost, and so is this call
                    raise
                reply = None  # cut inside a frame: the answer is lost
            if reply is not None:
                return reply
            await self._drop()
            if name not in READ_ONLY_TOOLS:
                raise ServiceError("node_restarted",
                                   f"the connection to the node at {self.path} was lost after {name} was sent, "
                                   "so it may or may not have been applied; check (e.g. memory_list) before "
                                   "calling it again")
        raise ServiceError("node_unavailable", f"the node at {self.path} keeps dropping the connection")

    async def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await asyncio.wait_for(self._writer.wait_closed(), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                pass
            self._writer = None
            self._reader = None

    async def close(self) -> None:
        async with self._lock:
            await self._drop()


async def ask_node(cfg: NodeConfig, tool: str, args: Args | None = None) -> JSON | None:
    """The running node's answer to ``tool``, or None when no node listens on ``cfg.socket_path``.

    A node that answers with an error raises it (ServiceError with the node's code)."""
    try:
        client = await SocketClientBackend.connect(cfg.socket_path, limits=cfg.limits,
                                                   call_timeout_s=ASK_TIMEOUT_S, reconnect_window_s=0.0)
    except (OSError, TimeoutError):
        return None
    try:
        return await client.call(tool, dict(args or {}))
    finally:
        await client.close()
