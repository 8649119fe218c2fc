"""The MCP tool table, free of any transport: names, JSON Schemas, argument validation, dispatch.

``tool_specs(limits)`` is what ``tools/list`` shows; a ``ToolBackend`` runs a call. Two backends:
``ServiceBackend`` calls a ``Service`` in this process; ``SocketClientBackend`` forwards the call to a
running node over its local Unix socket (``node.mcp_server.start_local_socket`` is the other end).
Arguments are checked against the schema before dispatch, so a bad call never reaches the service.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from node.config import KgConfig, LimitsConfig, TranscriptPolicy
from node.errors import ServiceError, describe

JSON = dict[str, Any] | list[Any]

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


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]


class ToolBackend(Protocol):
    async def call(self, name: str, args: dict[str, Any]) -> JSON:
        """Run tool ``name``; raises an error with ``.code``/``.message`` (ServiceError) on failure."""
        ...


# ---- the table ------------------------------------------------------------------------------

def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def _text(desc: str, max_chars: int, *, min_chars: int = 0) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string", "description": desc, "maxLength": max_chars}
    if min_chars:
        s["minLength"] = min_chars
    return s


def tool_specs(limits: LimitsConfig, kg: KgConfig | None = None) -> tuple[ToolSpec, ...]:
    """The tool set, with bounds taken from the limits (and knowledge-graph bounds) in force."""
    lim = limits
    kg = KgConfig() if kg is None else kg

    def depth(default: int) -> dict[str, Any]:
        return {"type": "integer", "minimum": 1, "maximum": kg.max_depth, "default": default,
                "description": f"hops, 1..{kg.max_depth}"}

    relations = {"type": "array", "maxItems": kg.max_relations, "description": "only links with these relations",
                 "items": _text("relation", lim.max_relation_chars, min_chars=1)}
    as_of = {"type": "integer", "minimum": 0, "description": "links valid at this instant, unix ms (default now)"}
    memory_id = _text("memory id (UUIDv4)", lim.max_id_chars, min_chars=1)
    namespace = _text("namespace (default 'default')", lim.max_namespace_chars, min_chars=1)

    def limit(default: int) -> dict[str, Any]:
        return {"type": "integer", "minimum": 1, "maximum": lim.max_recall_limit, "default": default,
                "description": f"max results, 1..{lim.max_recall_limit}"}

    confidence = {"type": "number", "minimum": 0, "maximum": 1, "description": "confidence 0..1"}
    return (
        ToolSpec("memory_store",
                 "Store a new memory; returns it with its new id and created_at/updated_at in unix ms.",
                 _obj({"content": _text(f"memory text, at most {lim.max_content_bytes} UTF-8 bytes",
                                        lim.max_content_bytes, min_chars=1),
                       "title": _text("short title", lim.max_title_chars),
                       "namespace": namespace,
                       "tags": {"type": "array", "maxItems": lim.max_tags, "description": "tags",
                                "items": _text("tag", lim.max_tag_chars, min_chars=1)},
                       "priority": {"type": "integer", "minimum": 1, "maximum": 10, "default": 5,
                                    "description": "priority 1..10"},
                       "confidence": {**confidence, "default": 1},
                       "source": _text("where the memory came from", lim.max_source_chars)},
                      ("content",))),
        ToolSpec("memory_update",
                 "Change fields of a memory; bumps its version and updated_at (unix ms) and replicates it.",
                 _obj({"id": memory_id,
                       "content": _text(f"new text, at most {lim.max_content_bytes} UTF-8 bytes",
                                        lim.max_content_bytes, min_chars=1),
                       "title": _text("short title", lim.max_title_chars),
                       "tags": {"type": "array", "maxItems": lim.max_tags, "description": "tags (replaces all)",
                                "items": _text("tag", lim.max_tag_chars, min_chars=1)},
                       "priority": {"type": "integer", "minimum": 1, "maximum": 10, "description": "priority 1..10"},
                       "confidence": confidence,
                       "source": _text("where the memory came from", lim.max_source_chars)},
                      ("id",))),
        ToolSpec("memory_get", "Fetch one memory by id (times in unix ms).", _obj({"id": memory_id}, ("id",))),
        ToolSpec("memory_list", "List memories, newest first, optionally in one namespace (times in unix ms).",
                 _obj({"namespace": namespace, "limit": limit(50),
                       "offset": {"type": "integer", "minimum": 0, "default": 0, "description": "rows to skip"}})),
        ToolSpec("memory_recall", "Full-text recall ranked by BM25, best first; any text is a safe query.",
                 _obj({"query": _text("search text", lim.max_query_chars, min_chars=1), "limit": limit(10),
                       "namespace": namespace}, ("query",))),
        ToolSpec("memory_link",
                 "Link two stored memories with a relation; signed with the node key (self_signed) when it has one.",
                 _obj({"src_id": memory_id, "dst_id": memory_id,
                       "relation": _text("relation, e.g. related_to, contradicts", lim.max_relation_chars,
                                         min_chars=1),
                       "valid_until": {"type": ["integer", "null"], "minimum": 0,
                                       "description": "end of validity, unix ms (null = open-ended)"},
                       "confidence": confidence},
                      ("src_id", "dst_id", "relation"))),
        ToolSpec("memory_verify",
                 "Re-derive a stored link's (link_id) or a memory's current version's (memory_id) signed payload "
                 "and check its signature against the signer's keys; give exactly one; signed_at is unix ms.",
                 _obj({"link_id": _text("link id (hex SHA-256)", lim.max_id_chars, min_chars=1),
                       "memory_id": _text("memory id (UUIDv4)", lim.max_id_chars, min_chars=1)}, ())),
        ToolSpec("memory_kg_query",
                 "Memories reachable from one memory along links valid at as_of (unix ms, default now), "
                 f"1..{kg.max_depth} hops, nearest first, each with the path of link ids that reached it.",
                 _obj({"memory_id": memory_id, "depth": depth(2), "relations": relations, "as_of": as_of,
                       "limit": {"type": "integer", "minimum": 1, "maximum": kg.max_results,
                                 "description": f"most neighbours, 1..{kg.max_results} (default all up to it)"}},
                      ("memory_id",))),
        ToolSpec("memory_find_paths",
                 "Simple paths (no memory twice) between two memories along links valid at as_of, "
                 "shortest first; each path is a list of link ids.",
                 _obj({"src_id": memory_id, "dst_id": memory_id, "max_depth": depth(3),
                       "limit": {"type": "integer", "minimum": 1, "maximum": kg.max_paths, "default": 10,
                                 "description": f"most paths, 1..{kg.max_paths}"},
                       "relations": relations, "as_of": as_of},
                      ("src_id", "dst_id"))),
        ToolSpec("memory_kg_timeline",
                 "The links touching a memory over time: when each began and ended, and its invalidations.",
                 _obj({"memory_id": memory_id,
                       "limit": {"type": "integer", "minimum": 1, "maximum": kg.max_timeline,
                                 "description": f"most links, 1..{kg.max_timeline}"}},
                      ("memory_id",))),
        ToolSpec("memory_kg_invalidate",
                 "End a link's validity with a new signed invalidation record (links themselves never change); "
                 "replicated to peers.",
                 _obj({"link_id": _text("link id (hex SHA-256)", lim.max_id_chars, min_chars=1),
                       "valid_until": {"type": "integer", "minimum": 0,
                                       "description": "end of validity, unix ms (default now)"}},
                      ("link_id",))),
        *_transcript_specs(lim, memory_id, namespace),
        ToolSpec("memory_peers", "List the peers this node trusts, with what it knows of each right now.", _obj({})),
        ToolSpec("memory_capabilities",
                 "Report this node's live state: schema version, key, attest counts, limits in force.", _obj({})),
    )


def _transcript_specs(lim: LimitsConfig, memory_id: dict[str, Any], namespace: dict[str, Any]) -> tuple[ToolSpec, ...]:
    """memory_transcript_store and memory_replay (node/transcripts.py); sizes are bounded per namespace there."""
    span = _obj({"memory_id": memory_id,
                 "start": {"type": "integer", "minimum": 0, "description": "first code point cited"},
                 "end": {"type": "integer", "minimum": 1, "description": "one past the last code point cited"}},
                ("memory_id", "start", "end"))
    return (
        ToolSpec("memory_transcript_store",
                 "Store the conversation or reasoning trail behind memories (zstd-compressed, signed), with the "
                 "spans each memory was drawn from: [start, end) in Unicode code points of the text. Only in "
                 "namespaces whose [transcripts] table enables it.",
                 _obj({"content": _text("the transcript text", TranscriptPolicy().max_bytes, min_chars=1),
                       "namespace": namespace,
                       "spans": {"type": "array", "items": span, "description": "spans cited by stored memories"}},
                      ("content",))),
        ToolSpec("memory_replay",
                 "The transcript spans a memory was drawn from, each with its text; with full=true the whole "
                 "transcripts, where the namespace allows it (else permission_denied).",
                 _obj({"memory_id": memory_id,
                       "full": {"type": "boolean", "default": False, "description": "return whole transcripts"}},
                      ("memory_id",))),
    )


TOOL_NAMES = tuple(s.name for s in tool_specs(LimitsConfig()))
# Tools that change nothing: safe to send again when the answer to a sent call was lost.
READ_ONLY_TOOLS = frozenset({"memory_get", "memory_list", "memory_recall", "memory_verify", "memory_peers",
                             "memory_capabilities", "memory_replay"})

class ArgValidator:
    """Compiled validators for every tool; ``check`` raises ServiceError naming the argument."""

    def __init__(self, specs: tuple[ToolSpec, ...]) -> None:
        self.specs = {s.name: s for s in specs}
        self._validators = {s.name: Draft202012Validator(s.input_schema) for s in specs}

    def check(self, name: str, args: Any) -> dict[str, Any]:
        if name not in self._validators:
            raise ServiceError("unknown_tool", f"no tool named {name!r}; tools: {', '.join(self.specs)}")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ServiceError("bad_input", f"{name}: arguments must be a JSON object, got {type(args).__name__}")
        error = best_match(self._validators[name].iter_errors(args))
        if error is not None:
            raise _arg_error(name, error)
        return dict(args)


def _arg_error(tool: str, e: ValidationError) -> ServiceError:
    """bad_input naming the argument; size bounds give too_large, as the service's own checks do."""
    arg = ".".join(str(p) for p in e.absolute_path)
    if e.validator == "required":
        missing = e.message.split("'")[1] if "'" in e.message else e.message
        return ServiceError("bad_input", f"{tool}: missing required argument {missing!r}")
    if e.validator == "additionalProperties":
        return ServiceError("bad_input", f"{tool}: unknown argument(s): {e.message.split('(')[-1].rstrip(')')}")
    where = f"argument {arg!r}" if arg else "arguments"
    if e.validator == "maxLength":
        return ServiceError("too_large",
                            f"{tool}: {where} is {len(e.instance)} chars, the limit is {e.validator_value}")
    if e.validator == "maxItems":
        return ServiceError("too_large",
                            f"{tool}: {where} has {len(e.instance)} items, the limit is {e.validator_value}")
    value = repr(e.instance)
    if len(value) > 60:
        value = value[:57] + "..."
    return ServiceError("bad_input", f"{tool}: {where} {value} is invalid: {_schema_rule(e)}")


def _schema_rule(e: ValidationError) -> str:
    v, val = e.validator, e.validator_value
    if v == "type":
        return f"must be of type {' or '.join(val) if isinstance(val, list) else val}"
    if v == "minimum":
        return f"must be >= {val}"
    if v == "maximum":
        return f"must be <= {val}"
    if v == "minLength":
        return "must not be empty" if val == 1 else f"must be at least {val} characters"
    return e.message


# ---- in-process backend ---------------------------------------------------------------------

# Knowledge-graph tools -> (method of node.kg.KnowledgeGraph, arguments passed by position).
_KG_TOOLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "memory_kg_query": ("query", ("memory_id",)),
    "memory_find_paths": ("find_paths", ("src_id", "dst_id")),
    "memory_kg_timeline": ("timeline", ("memory_id",)),
    "memory_kg_invalidate": ("invalidate", ("link_id",)),
}

# Transcript tools -> (method of node.transcripts.TranscriptRoom, arguments passed by position).
_TRANSCRIPT_TOOLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "memory_transcript_store": ("store", ("content",)),
    "memory_replay": ("replay", ("memory_id",)),
}

class ServiceBackend:
    """Runs tool calls on a ``node.service.Service`` in this process."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.limits: LimitsConfig = service.cfg.limits
        self.validator = ArgValidator(tool_specs(self.limits, service.cfg.kg))

    async def call(self, name: str, args: dict[str, Any]) -> JSON:
        args = self.validator.check(name, args)
        kg_tool = _KG_TOOLS.get(name)
        if kg_tool is not None:
            method, positional = kg_tool
            first = [args.pop(a) for a in positional]
            result: JSON = await getattr(self.service.kg, method)(*first, **args)
            return result
        transcript_tool = _TRANSCRIPT_TOOLS.get(name)
        if transcript_tool is not None:
            method, positional = transcript_tool
            first = [args.pop(a) for a in positional]
            done: JSON = await getattr(self.service.transcripts, method)(*first, **args)
            return done
        return await self._call_first_set(name, args)

    async def _call_first_set(self, name: str, args: dict[str, Any]) -> JSON:
        s = self.service
        match name:
            case "memory_store":
                return await s.memory_store(**args)
            case "memory_update":
                return await s.memory_update(args.pop("id"), **args)
            case "memory_get":
                return await s.memory_get(args["id"])
            case "memory_list":
                return await s.memory_list(**args)
            case "memory_recall":
                return await s.memory_recall(args.pop("query"), **args)
            case "memory_link":
                return await s.memory_link(args.pop("src_id"), args.pop("dst_id"), args.pop("relation"), **args)
            case "memory_verify":
                return await s.memory_verify(_one_verify_id(args))
            case "memory_peers":
                return await s.peers()
            case "memory_capabilities":
                return await s.capabilities()
        raise ServiceError("unknown_tool", f"no tool named {name!r}")  # unreachable: checked above


def _one_verify_id(args: dict[str, Any]) -> str:
    given = [args[k] for k in ("link_id", "memory_id") if k in args]
    if len(given) != 1:
        raise ServiceError("bad_input", "give exactly one of link_id or memory_id")
    return str(given[0])


# ---- local-socket framing and client backend ------------------------------------------------

def encode_frame(obj: Any) -> bytes:
    body = orjson.dumps(obj)
    return _HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> Any | None:
    """One framed JSON document, or None at a clean EOF; ServiceError('bad_frame') on garbage."""
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
        raise ServiceError("bad_frame", f"frame is not JSON: {e}") from None


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
                 reconnect_window_s: float = RECONNECT_WINDOW_S) -> None:
        self.path = Path(path)
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
                      reconnect_window_s: float = RECONNECT_WINDOW_S) -> SocketClientBackend:
        """Connect or raise OSError/TimeoutError (no node listening). ``call_timeout_s`` bounds each call;
        ``reconnect_window_s`` how long a call waits for a restarting node (seconds)."""
        self = cls(path, limits=limits, call_timeout_s=call_timeout_s, reconnect_window_s=reconnect_window_s)
        await self._connect()
        return self

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(self.path), limit=MAX_FRAME_BYTES), CONNECT_TIMEOUT_S)

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
        for _ in range(RECONNECT_ATTEMPTS):
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

    async def call(self, name: str, args: dict[str, Any]) -> JSON:
        frame = encode_frame({"tool": name, "args": args})
        async with self._lock:
            reply = await self._exchange(name, frame)
        if isinstance(reply, dict) and "ok" in reply:
            return reply["ok"]
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


def error_reply(exc: BaseException) -> dict[str, Any]:
    d = describe(exc)
    return {"error": {"code": d.code, "message": d.message}}
