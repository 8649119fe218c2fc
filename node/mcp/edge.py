"""Every MCP message a door reads gets an answer: the check at the edge of the stdio and HTTP doors.

The SDK parses each stdio line and each HTTP body with pydantic. What pydantic refuses, the SDK's stdio
reader drops without a reply (the client waits until its own timeout), and its HTTP handler answers without
the request's id, as a parse error, also for a well-formed document it merely cannot take: one nested past
pydantic's 200 levels, or one holding a lone surrogate escape (``"\\ud800"``, which no UTF-8 text can carry).

``refusal`` runs the SDK's own parse (``mcp_types.jsonrpc_message_adapter``) first, so a message it passes
is one the SDK takes; where it fails, it says why as the JSON-RPC error the door sends itself:

- ``-32700`` parse error (id null): the line is not JSON;
- ``-32602`` invalid params (the request's id): ``params`` are JSON that cannot be taken (nested too deep,
  a lone surrogate);
- ``-32600`` invalid request (the id when there is one): anything else that is not a JSON-RPC message.

The doors wrap only what they own, with public APIs: ``CheckedLines`` is the stdin the SDK's stdio
transport reads (``node.mcp.server.run_stdio``), ``AnsweredBodies`` the ASGI app in front of the SDK's
streamable HTTP app (``node.mcp.server.start_http``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecurityMiddleware
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("node.mcp")

# Top-level members looked at for the id of a document too deep for even the stdlib parser.
LEADING_MEMBERS_MAX = 16
# Steps of a path into the message named in an error (a deep one is cut there).
PATH_SHOWN = 6
# Bound on the reason quoted back to the client and logged.
REASON_MAX = 300


@dataclass(frozen=True, slots=True)
class Refusal:
    """The answer to a message the SDK cannot take; ``notification`` when it was one (JSON-RPC answers none
    over stdio; over HTTP the POST itself is answered)."""

    error: types.JSONRPCError
    notification: bool

    @property
    def code(self) -> int:
        return self.error.error.code

    def json(self) -> str:
        return self.error.model_dump_json(by_alias=True, exclude_unset=True)


def refusal(raw: str | bytes) -> Refusal | None:
    """None when the SDK takes ``raw`` (one JSON-RPC message); else the error that answers it."""
    try:
        types.jsonrpc_message_adapter.validate_json(raw, by_name=False)
        return None
    except ValidationError as e:
        errors = e.errors(include_url=False, include_input=False)
        first = errors[0] if errors else {"type": "", "msg": str(e), "loc": ()}
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    # loc[0] names the union member (JSONRPCRequest, ...); the rest is the path into the message.
    where = [p for p in tuple(first.get("loc", ()))[1:] if isinstance(p, (str, int))]
    try:
        return _diagnose(text, str(first.get("type")), where, str(first.get("msg")))
    except Exception:  # a bug here must not cost the client its answer, nor the door its session
        log.exception("mcp edge check failed")
        return _refused(None, None, "Internal error: the message could not be checked", False,
                        code=types.INTERNAL_ERROR)


def _diagnose(text: str, kind: str, where: list[str | int], why: str) -> Refusal:
    try:
        doc = json.loads(text)
    except RecursionError:
        req_id, member = _leading(text)
        return _refused(req_id, member, "is nested deeper than this server parses", False)
    except ValueError as e:
        return _refused(None, None, f"Parse error: {e}", False, code=types.PARSE_ERROR)
    req_id = _request_id(doc)
    notification = isinstance(doc, dict) and "id" not in doc and isinstance(doc.get("method"), str)
    surrogate, deepest, depth = _walk(doc)
    if surrogate is not None:
        return _refused(req_id, surrogate, "holds a lone surrogate escape, which is not Unicode text", notification)
    if kind == "json_invalid":  # valid JSON pydantic could not parse: only its nesting is left to blame
        return _refused(req_id, deepest, f"is nested {depth} levels deep, deeper than this server parses",
                        notification)
    return _refused(req_id, where or None, f": {why} (not a JSON-RPC 2.0 message)", notification)


def _refused(req_id: Any, path: list[str | int] | str | None, what: str, notification: bool, *,
             code: int | None = None) -> Refusal:
    """The error for ``path`` (a member or a path into the message; None: the message) that ``what``; an
    explicit ``code`` takes ``what`` as the whole message."""
    if code is not None:
        message = what
    else:
        top = path[0] if isinstance(path, list) and path else path
        code = types.INVALID_PARAMS if top == "params" else types.INVALID_REQUEST
        where = _path_text(path) if isinstance(path, list) else (path or "the message")
        label = "Invalid params" if code == types.INVALID_PARAMS else "Invalid request"
        message = f"{label}: {where}{what}" if what.startswith(":") else f"{label}: {where} {what}"
    error = types.JSONRPCError(jsonrpc="2.0", id=req_id,
                               error=types.ErrorData(code=code, message=message[:REASON_MAX]))
    return Refusal(error, notification)


def _path_text(path: list[str | int]) -> str:
    """``params.arguments.tags[0]``; a long path keeps its first PATH_SHOWN steps."""
    out = ""
    for p in path[:PATH_SHOWN]:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return (out + ("..." if len(path) > PATH_SHOWN else "")) or "the message"


def _request_id(doc: Any) -> str | int | None:
    if not isinstance(doc, dict):
        return None
    value = doc.get("id")
    if (isinstance(value, str) and _is_text(value)) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


def _walk(doc: Any) -> tuple[list[str | int] | None, list[str | int], int]:
    """(the path of the first string holding a lone surrogate or None, the deepest path, its depth); an
    explicit stack, so a document the stdlib could parse is walked whatever its depth."""
    surrogate: list[str | int] | None = None
    deepest: list[str | int] = []
    stack: list[tuple[Any, list[str | int]]] = [(doc, [])]
    while stack:
        value, path = stack.pop()
        if len(path) > len(deepest):
            deepest = path
        if isinstance(value, dict):
            for k, v in value.items():
                if surrogate is None and not _is_text(k):
                    surrogate = [*path, k.encode("utf-8", "backslashreplace").decode()]
                stack.append((v, [*path, k]))
        elif isinstance(value, list):
            stack.extend((v, [*path, i]) for i, v in enumerate(value))
        elif isinstance(value, str) and surrogate is None and not _is_text(value):
            surrogate = path
    return surrogate, deepest, len(deepest)


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _leading(text: str) -> tuple[str | int | None, str | None]:
    """For a document too deep for the stdlib parser: its id and the member that is too deep, read member by
    member from the top (the id is found when it comes before that member, as every SDK writes it)."""
    dec = json.JSONDecoder()
    i = _skip(text, 0)
    if not text.startswith("{", i):
        return None, None
    i, req_id = i + 1, None
    for _ in range(LEADING_MEMBERS_MAX):
        key: Any = None
        try:
            key, i = dec.raw_decode(text, _skip(text, i))
            i = _skip(text, i)
            if not isinstance(key, str) or not text.startswith(":", i):
                break
            value, i = dec.raw_decode(text, _skip(text, i + 1))
        except RecursionError:
            return req_id, key if isinstance(key, str) else None
        except ValueError:
            break
        if key == "id":
            req_id = _request_id({"id": value})
        i = _skip(text, i)
        if not text.startswith(",", i):
            break
        i += 1
    return req_id, None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


# ---- stdio ----------------------------------------------------------------------------------

class CheckedLines:
    """The stdin the SDK's stdio transport reads: the lines it can take, in order. Each other non-blank line is
    answered through ``answers`` (a request's error; a notification's is only logged, as JSON-RPC wants)."""

    def __init__(self, lines: anyio.AsyncFile[str], answers: MemoryObjectSendStream[types.JSONRPCError]) -> None:
        self.lines = lines
        self.answers = answers

    async def __aiter__(self) -> AsyncIterator[str]:
        async with self.answers:
            async for line in self.lines:
                if not line.strip():
                    continue
                refused = refusal(line)
                if refused is None:
                    yield line
                    continue
                _log(refused, "stdio")
                if not refused.notification:
                    await self.answers.send(refused.error)


def _log(refused: Refusal, door: str) -> None:
    log.warning("mcp_message_refused", extra={"ev": {"door": door, "code": refused.code,
                                                     "id": refused.error.id, "why": refused.error.error.message}})


@contextlib.contextmanager
def private_stdin() -> Iterator[anyio.AsyncFile[str]]:
    """This process's stdin as UTF-8 lines read from a private duplicate, with fd 0 pointed at the null device
    meanwhile (what the SDK's stdio transport does when it reads stdin itself): children and stray reads see
    EOF, never the client's messages. fd 0 is restored on exit."""
    private = os.dup(0)
    os.set_inheritable(private, False)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    # closefd=False: a worker thread may still be blocked reading it when the transport exits.
    raw = os.fdopen(private, "rb", buffering=0, closefd=False)
    text = io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="replace")
    try:
        yield anyio.wrap_file(text)
    finally:
        os.dup2(private, 0)


# ---- streamable HTTP ------------------------------------------------------------------------

class AnsweredBodies:
    """ASGI app in front of the SDK's streamable HTTP app: a POST to ``path`` whose body the SDK cannot take is
    answered here (HTTP 400, the JSON-RPC error with the request's id), once the SDK's own Host/Origin guard
    would let it through; every other request goes to the SDK unchanged (its body replayed)."""

    def __init__(self, app: ASGIApp, path: str, guard: TransportSecurityMiddleware,
                 max_body: int = DEFAULT_MAX_REQUEST_BODY_SIZE) -> None:
        self.app = app
        self.path = path
        self.guard = guard
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != self.path:
            await self.app(scope, receive, send)
            return
        buffered, body, complete = await self._buffer(receive)
        replay = _replayer(buffered, receive)
        if complete and await self.guard.validate_request(Request(scope), is_post=True) is None:
            refused = refusal(body)
            if refused is not None:
                _log(refused, "http")
                await Response(refused.json(), status_code=400, media_type="application/json")(scope, replay, send)
                return
        await self.app(scope, replay, send)

    async def _buffer(self, receive: Receive) -> tuple[list[Message], bytes, bool]:
        """The request's messages read so far, its body, and whether that is all of it (a body past
        ``max_body`` is left to the SDK, which refuses it 413)."""
        buffered: list[Message] = []
        body = bytearray()
        while len(body) <= self.max_body:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                return buffered, bytes(body), False
            body.extend(message.get("body", b""))
            if not message.get("more_body", False):
                return buffered, bytes(body), len(body) <= self.max_body
        return buffered, bytes(body), False


def _replayer(buffered: list[Message], receive: Receive) -> Receive:
    pending = list(buffered)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
