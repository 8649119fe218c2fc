"""The MCP tool table, free of any transport: names, JSON Schemas, argument validation, dispatch.

``tool_specs(limits)`` is what ``tools/list`` shows; a ``ToolBackend`` runs a call. Two backends:
``ServiceBackend`` calls a ``Service`` in this process; ``SocketClientBackend`` forwards the call to a
running node over its local Unix socket (``node.mcp_server.start_local_socket`` is the other end).
Arguments are checked against the schema before dispatch, so a bad call never reaches the service.
"""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import fastjsonschema
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


# Said once per session in INSTRUCTIONS instead of in every listed schema (the validator still checks them).
SHARED_KEYWORDS = frozenset({"maxLength", "minLength", "maxItems", "minimum", "maximum", "default",
                             "additionalProperties"})


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    # The schema calls are validated against: closed, with every bound in force.
    input_schema: dict[str, Any]

    @property
    def listed_schema(self) -> dict[str, Any]:
        """The schema ``tools/list`` shows: ``input_schema`` without what INSTRUCTIONS says once for all tools."""
        return _without(self.input_schema, SHARED_KEYWORDS)


def _without(schema: Any, keys: frozenset[str]) -> Any:
    if isinstance(schema, dict):
        # An empty "properties" says nothing "type": "object" does not.
        return {k: _without(v, keys) for k, v in schema.items() if k not in keys and (k, v) != ("properties", {})}
    if isinstance(schema, list):
        return [_without(v, keys) for v in schema]
    return schema


class ToolBackend(Protocol):
    async def call(self, name: str, args: dict[str, Any]) -> JSON:
        """Run tool ``name``; raises an error with ``.code``/``.message`` (ServiceError) on failure."""
        ...


# ---- the table ------------------------------------------------------------------------------

def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def _text(max_chars: int, desc: str = "", *, min_chars: int = 0) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string", "maxLength": max_chars}
    if min_chars:
        s["minLength"] = min_chars
    if desc:
        s["description"] = desc
    return s


def _int(lo: int, hi: int | None = None, default: int | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer", "minimum": lo}
    if hi is not None:
        s["maximum"] = hi
    if default is not None:
        s["default"] = default
    return s


def instructions(lim: LimitsConfig, kg: KgConfig | None = None) -> str:
    """What every tool shares, said once per session (the MCP server's instructions) instead of in each
    listed schema: units, id formats, the length bounds in force, and that unknown arguments are refused."""
    kg = KgConfig() if kg is None else kg
    return (f"ai-memory: a signed, federated memory store. Times are unix ms; memory ids UUIDv4, link ids hex "
            f"SHA-256; namespace defaults to 'default'. Text bounds (chars): content {lim.max_content_bytes} "
            f"UTF-8 bytes, title {lim.max_title_chars}, source {lim.max_source_chars}, namespace "
            f"{lim.max_namespace_chars}, tags {lim.max_tags} of {lim.max_tag_chars}, relation "
            f"{lim.max_relation_chars}, query {lim.max_query_chars}, ids {lim.max_id_chars}; ids, content, query, "
            f"relation and tags not empty. Numbers: priority 1..10 (default 5), confidence 0..1 (default 1 on "
            f"store), limit 1..{lim.max_recall_limit} (list 50, recall 10), offset >= 0 (0), valid_until >= 0 or "
            "null (open-ended). source: where a memory came from; relation e.g. related_to. Unknown arguments are "
            "refused. memory_capabilities version: 3 (default) or 2. "
            f"Graph tools: links valid at as_of (default now); depth 1..{kg.max_depth} (query 2, paths 3), "
            f"relations at most {kg.max_relations}, limit up to {kg.max_results} neighbours, {kg.max_paths} paths "
            f"(10), {kg.max_timeline} timeline links; invalidate's valid_until defaults to now; memory_link_many: 1.."
            f"{lim.max_links_per_call} links, each made or refused on its own. More tools: "
            "memory_load_family or memory_smart_load.")


def tool_specs(limits: LimitsConfig, kg: KgConfig | None = None) -> tuple[ToolSpec, ...]:
    """The service's tools, with bounds taken from the limits (and knowledge-graph bounds) in force;
    descriptions kept short because every session pays for them in its context (units, id formats and
    bounds are said once, in ``instructions``)."""
    lim = limits
    kg = KgConfig() if kg is None else kg
    relations = {"type": "array", "maxItems": kg.max_relations, "items": _text(lim.max_relation_chars, min_chars=1)}
    as_of = _int(0)
    memory_id = _text(lim.max_id_chars, min_chars=1)
    namespace = _text(lim.max_namespace_chars, min_chars=1)
    tags = {"type": "array", "maxItems": lim.max_tags, "items": _text(lim.max_tag_chars, min_chars=1)}
    confidence = {"type": "number", "minimum": 0, "maximum": 1}
    content = _text(lim.max_content_bytes, min_chars=1)
    fields = {"title": _text(lim.max_title_chars), "tags": tags, "priority": _int(1, 10),
              "confidence": confidence, "source": _text(lim.max_source_chars)}
    link = _obj({"src_id": memory_id, "dst_id": memory_id, "relation": _text(lim.max_relation_chars, min_chars=1),
                 "valid_until": {"type": ["integer", "null"], "minimum": 0}, "confidence": confidence},
                ("src_id", "dst_id", "relation"))
    return (
        ToolSpec("memory_store", "Store a memory; returns it.",
                 _obj({"content": content, "namespace": namespace, **fields,
                       "priority": _int(1, 10, 5), "confidence": {**confidence, "default": 1}}, ("content",))),
        ToolSpec("memory_update", "Change fields (tags replace all); new version.",
                 _obj({"id": memory_id, "content": content, **fields}, ("id",))),
        ToolSpec("memory_get", "Fetch one memory.", _obj({"id": memory_id}, ("id",))),
        ToolSpec("memory_list", "List memories, newest first.",
                 _obj({"namespace": namespace, "limit": _int(1, lim.max_recall_limit, 50),
                       "offset": _int(0, None, 0)})),
        ToolSpec("memory_recall", "BM25 full-text search; any text is safe.",
                 _obj({"query": _text(lim.max_query_chars, min_chars=1), "limit": _int(1, lim.max_recall_limit, 10),
                       "namespace": namespace}, ("query",))),
        ToolSpec("memory_link", "Link src to dst by relation, signed by this node.", link),
        ToolSpec("memory_link_many", f"Up to {lim.max_links_per_call} memory_links in one call; each item "
                                     "succeeds or fails on its own: results in order, {ok: link} or {error}.",
                 _obj({"links": {"type": "array", "minItems": 1, "maxItems": lim.max_links_per_call,
                                 "items": link}}, ("links",))),
        ToolSpec("memory_verify", "Verify a link's or memory's signature; give one id.",
                 _obj({"link_id": _text(lim.max_id_chars, min_chars=1), "memory_id": memory_id})),
        ToolSpec("memory_kg_query", "Memories reachable from one along valid links, nearest first, with paths.",
                 _obj({"memory_id": memory_id, "depth": _int(1, kg.max_depth, 2), "relations": relations,
                       "as_of": as_of, "limit": _int(1, kg.max_results)}, ("memory_id",))),
        ToolSpec("memory_find_paths", "Paths (lists of link ids) between two memories, shortest first.",
                 _obj({"src_id": memory_id, "dst_id": memory_id, "max_depth": _int(1, kg.max_depth, 3),
                       "limit": _int(1, kg.max_paths, 10), "relations": relations, "as_of": as_of},
                      ("src_id", "dst_id"))),
        ToolSpec("memory_kg_timeline", "A memory's links over time: begins, ends, invalidations.",
                 _obj({"memory_id": memory_id, "limit": _int(1, kg.max_timeline)}, ("memory_id",))),
        ToolSpec("memory_kg_invalidate", "End a link's validity (a signed record; replicated).",
                 _obj({"link_id": _text(lim.max_id_chars, min_chars=1), "valid_until": _int(0)}, ("link_id",))),
        *_transcript_specs(lim, memory_id, namespace),
        ToolSpec("memory_peers", "Trusted peers, live link state.", _obj({})),
        ToolSpec("memory_capabilities", "Node state: key, counts, limits.",
                 _obj({"version": {"enum": [2, 3]}})),
        ToolSpec("memory_approval_list", "Pending actions (writes parked by an ask), oldest first.",
                 _obj({"status": {"enum": ["pending", "applied", "denied", "expired", "failed"],
                                  "default": "pending"},
                       "limit": _int(1, lim.max_recall_limit, 100)})),
        ToolSpec("memory_approval_decide", "Approve (runs the parked write once) or deny a pending action.",
                 _obj({"id": _text(lim.max_id_chars, min_chars=1), "choice": {"enum": ["approve", "deny"]},
                       "remember": {"enum": ["once", "forever"], "default": "once"},
                       "decided_by": _text(256, min_chars=1)},
                      ("id", "choice"))),
    )


def loader_specs() -> tuple[ToolSpec, ...]:
    """The two tools a session grows its tool list with (answered by the MCP server, not the node)."""
    from node.profiles import Family
    return (
        ToolSpec("memory_load_family", "Add tools: graph (link, verify), admin (peers, state), power "
                                       "(update, list, transcripts), full.",
                 _obj({"family": {"enum": [str(f) for f in Family if f is not Family.CORE]}}, ("family",))),
        ToolSpec("memory_smart_load", "Add the tools a task needs.",
                 _obj({"intent": _text(1000, min_chars=1)}, ("intent",))),
    )


def _transcript_specs(lim: LimitsConfig, memory_id: dict[str, Any], namespace: dict[str, Any]) -> tuple[ToolSpec, ...]:
    """memory_transcript_store and memory_replay (node/transcripts.py); sizes are bounded per namespace there."""
    span = _obj({"memory_id": memory_id, "start": _int(0), "end": _int(1)}, ("memory_id", "start", "end"))
    return (
        ToolSpec("memory_transcript_store", "Store the transcript memories were drawn from, with their spans "
                                            "[start, end) in code points; where the namespace enables it.",
                 _obj({"content": _text(TranscriptPolicy().max_bytes, min_chars=1), "namespace": namespace,
                       "spans": {"type": "array", "items": span}}, ("content",))),
        ToolSpec("memory_replay", "A memory's transcript spans with their text; full=true: whole transcripts.",
                 _obj({"memory_id": memory_id, "full": {"type": "boolean", "default": False}}, ("memory_id",))),
    )


TOOL_NAMES = tuple(s.name for s in tool_specs(LimitsConfig()))
# Answered by the MCP server itself (a session's tool list), never sent to the node.
LOADERS = frozenset(s.name for s in loader_specs())
# Tools that change nothing: safe to send again when the answer to a sent call was lost.
READ_ONLY_TOOLS = frozenset({"memory_get", "memory_list", "memory_recall", "memory_verify", "memory_peers",
                             "memory_capabilities", "memory_approval_list", "memory_replay",
                             "memory_kg_query", "memory_find_paths", "memory_kg_timeline"})

class ArgValidator:
    """Compiled validators for every tool; ``check`` raises ServiceError naming the argument.

    Arguments first meet a schema compiled to Python by fastjsonschema (no defaults filled in, no formats):
    what it accepts is accepted. Anything it refuses is decided by jsonschema's Draft 2020-12 validator,
    whose error names the argument, so a refusal and its message are jsonschema's. The two agree on the
    keywords the tool schemas use (tests/mcp/test_arg_validator.py checks that the fast one accepts
    nothing jsonschema refuses); the fast one is ~30x cheaper: 5.7 ms -> 0.19 ms for a 100-link
    memory_link_many, 86 -> 3 us for a memory_store (PERFORMANCE.md, issue 16)."""

    def __init__(self, specs: tuple[ToolSpec, ...]) -> None:
        self.specs = {s.name: s for s in specs}
        self._validators = {s.name: Draft202012Validator(s.input_schema) for s in specs}
        self._fast = {s.name: fastjsonschema.compile(s.input_schema, use_default=False, use_formats=False,
                                                     detailed_exceptions=False) for s in specs}

    def check(self, name: str, args: Any) -> dict[str, Any]:
        if name not in self._validators:
            raise ServiceError("unknown_tool", f"no tool named {name!r}; tools: {', '.join(self.specs)}")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ServiceError("bad_input", f"{name}: arguments must be a JSON object, got {type(args).__name__}")
        try:
            self._fast[name](args)
        except fastjsonschema.JsonSchemaException:
            error = best_match(self._validators[name].iter_errors(args))
            if error is not None:
                raise _arg_error(name, error) from None
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

# Tools answered by one room of the service: (room attribute, method, arguments passed positionally).
_ROOM_TOOLS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "memory_kg_query": ("kg", "query", ("memory_id",)),
    "memory_find_paths": ("kg", "find_paths", ("src_id", "dst_id")),
    "memory_kg_timeline": ("kg", "timeline", ("memory_id",)),
    "memory_kg_invalidate": ("kg", "invalidate", ("link_id",)),
    "memory_transcript_store": ("transcripts", "store", ("content",)),
    "memory_replay": ("transcripts", "replay", ("memory_id",)),
}

class ServiceBackend:
    """Runs tool calls on a ``node.service.Service`` in this process."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.limits: LimitsConfig = service.cfg.limits
        self.validator = ArgValidator(tool_specs(self.limits, service.cfg.kg))
        # (tool, "ok" or the error code) -> calls; an unknown tool name counts as "unknown" (bounded labels).
        self.calls: Counter[tuple[str, str]] = Counter()

    async def call(self, name: str, args: dict[str, Any]) -> JSON:
        tool = name if name in self.validator.specs else "unknown"
        try:
            result = await self._dispatch(name, args)
        except Exception as exc:
            self.calls[tool, describe(exc).code] += 1
            raise
        self.calls[tool, "ok"] += 1
        return result

    async def _dispatch(self, name: str, args: dict[str, Any]) -> JSON:
        args = self.validator.check(name, args)
        room_tool = _ROOM_TOOLS.get(name)
        if room_tool is not None:
            room, method, positional = room_tool
            first = [args.pop(a) for a in positional]
            result: JSON = await getattr(getattr(self.service, room), method)(*first, **args)
            return result
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
            case "memory_link_many":
                return await s.memory_link_many(args["links"])
            case "memory_verify":
                return await s.memory_verify(_one_verify_id(args))
            case "memory_peers" | "memory_capabilities" | "memory_approval_list" | "memory_approval_decide":
                return await _state_call(s, name, args)
        raise ServiceError("unknown_tool", f"no tool named {name!r}")  # unreachable: checked above


async def _state_call(s: Any, name: str, args: dict[str, Any]) -> JSON:
    """The tools about the node rather than one memory: peers, capabilities, approvals."""
    match name:
        case "memory_peers":
            return await s.peers()
        case "memory_capabilities":
            return await s.capabilities(**args)
        case "memory_approval_list":
            return await s.approval_list(**args)
        case "memory_approval_decide":
            return await s.approval_decide(args.pop("id"), args.pop("choice"),
                                           decided_by=args.pop("decided_by", "mcp"), **args)
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
