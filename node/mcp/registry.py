"""The MCP tool table, free of any transport: one ``ToolSpec`` per tool, and all that reads it.

A tool is its entry here: its name (spelled nowhere else), its handler, its family, the JSON Schema its
arguments are validated against, and its summary (the description ``tools/list`` shows). ``tool_specs(limits)``
are the node's tools, run by a backend (``node.mcp.backend.ServiceBackend`` in this process, or the node's
own over its local socket); ``loader_specs()`` are the two tools the MCP server answers itself, which grow a
session's tool list. The server's listing, the argument validator, the dispatch, the profiles' families and
capabilities' family lists all read these entries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from node.config import KgConfig, LimitsConfig, TranscriptPolicy
from node.errors import ServiceError
from node.mcp.profiles import ABOUT, Family, match_intent, parse_family

if TYPE_CHECKING:
    from node.service import Service

JSON = dict[str, Any] | list[Any]
# A call's arguments once validated against the tool's schema (a fresh dict the handler may consume).
Args = dict[str, Any]
Ctx = TypeVar("Ctx")

# The two tools the CLI asks a running node for by name (ai-memory status, peers, doctor); their entries below.
PEERS = "memory_peers"
CAPABILITIES = "memory_capabilities"

# Said once per session in INSTRUCTIONS instead of in every listed schema (the validator still checks them).
SHARED_KEYWORDS = frozenset({"maxLength", "minLength", "maxItems", "minimum", "maximum", "default",
                             "additionalProperties"})


class NodeSide(Protocol):
    """What a node tool's handler runs against: the service, and the node's live state (peers and
    capabilities read the runtime when a node runs in this process). ``ServiceBackend`` is one."""

    @property
    def service(self) -> Service: ...

    async def peers(self) -> list[dict[str, Any]]: ...

    async def capabilities(self, version: int = ...) -> dict[str, Any]: ...


class AgentTools(Protocol):
    """What a loader's handler runs against: the calling agent's tool list (one MCP session's), which it grows."""

    def load(self, families: Sequence[Family]) -> frozenset[Family]:
        """Add ``families`` to what the agent lists; returns every family it has loaded now."""
        ...


@dataclass(frozen=True)
class Door:
    """The MCP door a call came through, as ``memory_capabilities`` reports it under ``mcp``: the door's own
    description (transport, mode, socket), the server's profile and the families the agent has loaded."""

    session: Mapping[str, Any]
    profile: Family
    loaded: frozenset[Family]


Handler = Callable[[Ctx, Args], Awaitable[JSON]]
# The one-line head of a result's text rendering.
Headline = Callable[[dict[str, Any]], str]
# What a result reports under "mcp" about the door it came through, from the call's (raw) arguments.
DoorView = Callable[[Mapping[str, Any], Door], dict[str, Any]]


@dataclass(frozen=True)
class ToolSpec(Generic[Ctx]):
    """One tool: all the faces need to list it, check a call's arguments, run it and render its answer.
    ``Ctx`` is what its handler runs against: ``NodeSide`` for the node's tools, ``AgentTools`` for the loaders."""

    name: str
    handler: Handler[Ctx]
    family: Family
    # The schema calls are validated against: closed, with every bound in force.
    schema: dict[str, Any]
    # What tools/list says the tool does (short: every session pays for it in its context).
    summary: str
    # Changes nothing: safe to send again when the answer to a sent call was lost.
    read_only: bool = False
    headline: Headline | None = None
    door_view: DoorView | None = None

    @property
    def listed_schema(self) -> dict[str, Any]:
        """The schema ``tools/list`` shows: ``schema`` without what INSTRUCTIONS says once for all tools."""
        listed: dict[str, Any] = _without(self.schema, SHARED_KEYWORDS)
        return listed


def _without(schema: Any, keys: frozenset[str]) -> Any:
    if isinstance(schema, dict):
        # An empty "properties" says nothing "type": "object" does not.
        return {k: _without(v, keys) for k, v in schema.items() if k not in keys and (k, v) != ("properties", {})}
    if isinstance(schema, list):
        return [_without(v, keys) for v in schema]
    return schema


# ---- schema pieces --------------------------------------------------------------------------

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


# ---- the table ------------------------------------------------------------------------------

def tool_specs(limits: LimitsConfig, kg: KgConfig | None = None) -> tuple[ToolSpec[NodeSide], ...]:
    """The node's tools, with bounds taken from the limits (and knowledge-graph bounds) in force;
    summaries kept short because every session pays for them in its context (units, id formats and
    bounds are said once, in ``instructions``)."""
    lim = limits
    kg = KgConfig() if kg is None else kg
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
        ToolSpec("memory_store", _store, Family.CORE,
                 _obj({"content": content, "namespace": namespace, **fields,
                       "priority": _int(1, 10, 5), "confidence": {**confidence, "default": 1}}, ("content",)),
                 "Store a memory; returns it.", headline=_memory_head),
        ToolSpec("memory_update", _update, Family.POWER,
                 _obj({"id": memory_id, "content": content, **fields}, ("id",)),
                 "Change fields (tags replace all); new version."),
        ToolSpec("memory_get", _get, Family.CORE, _obj({"id": memory_id}, ("id",)),
                 "Fetch one memory.", read_only=True, headline=_memory_head),
        ToolSpec("memory_list", _list, Family.POWER,
                 _obj({"namespace": namespace, "limit": _int(1, lim.max_recall_limit, 50),
                       "offset": _int(0, None, 0)}),
                 "List memories, newest first.", read_only=True),
        ToolSpec("memory_recall", _recall, Family.CORE,
                 _obj({"query": _text(lim.max_query_chars, min_chars=1), "limit": _int(1, lim.max_recall_limit, 10),
                       "namespace": namespace}, ("query",)),
                 "BM25 full-text search; any text is safe.", read_only=True),
        ToolSpec("memory_link", _link, Family.GRAPH, link,
                 "Link src to dst by relation, signed by this node.", headline=_link_head),
        ToolSpec("memory_link_many", _link_many, Family.GRAPH,
                 _obj({"links": {"type": "array", "minItems": 1, "maxItems": lim.max_links_per_call,
                                 "items": link}}, ("links",)),
                 f"Up to {lim.max_links_per_call} memory_links in one call; each item succeeds or fails on its "
                 "own: results in order, {ok: link} or {error}.", headline=_link_many_head),
        ToolSpec("memory_verify", _verify, Family.GRAPH,
                 _obj({"link_id": _text(lim.max_id_chars, min_chars=1), "memory_id": memory_id}),
                 "Verify a link's or memory's signature; give one id.", read_only=True, headline=_verify_head),
        *_graph_specs(lim, kg, memory_id),
        *_transcript_specs(lim, memory_id, namespace),
        *_admin_specs(lim),
    )


def _graph_specs(lim: LimitsConfig, kg: KgConfig, memory_id: dict[str, Any]) -> tuple[ToolSpec[NodeSide], ...]:
    """The knowledge-graph tools (node/kg.py)."""
    relations = {"type": "array", "maxItems": kg.max_relations, "items": _text(lim.max_relation_chars, min_chars=1)}
    as_of = _int(0)
    return (
        ToolSpec("memory_kg_query", _kg_query, Family.GRAPH,
                 _obj({"memory_id": memory_id, "depth": _int(1, kg.max_depth, 2), "relations": relations,
                       "as_of": as_of, "limit": _int(1, kg.max_results)}, ("memory_id",)),
                 "Memories reachable from one along valid links, nearest first, with paths.", read_only=True),
        ToolSpec("memory_find_paths", _find_paths, Family.GRAPH,
                 _obj({"src_id": memory_id, "dst_id": memory_id, "max_depth": _int(1, kg.max_depth, 3),
                       "limit": _int(1, kg.max_paths, 10), "relations": relations, "as_of": as_of},
                      ("src_id", "dst_id")),
                 "Paths (lists of link ids) between two memories, shortest first.", read_only=True),
        ToolSpec("memory_kg_timeline", _kg_timeline, Family.GRAPH,
                 _obj({"memory_id": memory_id, "limit": _int(1, kg.max_timeline)}, ("memory_id",)),
                 "A memory's links over time: begins, ends, invalidations.", read_only=True),
        ToolSpec("memory_kg_invalidate", _kg_invalidate, Family.GRAPH,
                 _obj({"link_id": _text(lim.max_id_chars, min_chars=1), "valid_until": _int(0)}, ("link_id",)),
                 "End a link's validity (a signed record; replicated)."),
    )


def _transcript_specs(lim: LimitsConfig, memory_id: dict[str, Any],
                      namespace: dict[str, Any]) -> tuple[ToolSpec[NodeSide], ...]:
    """The transcript tools (node/transcripts.py); sizes are bounded per namespace there."""
    span = _obj({"memory_id": memory_id, "start": _int(0), "end": _int(1)}, ("memory_id", "start", "end"))
    return (
        ToolSpec("memory_transcript_store", _transcript_store, Family.POWER,
                 _obj({"content": _text(TranscriptPolicy().max_bytes, min_chars=1), "namespace": namespace,
                       "spans": {"type": "array", "items": span}}, ("content",)),
                 "Store the transcript memories were drawn from, with their spans [start, end) in code points; "
                 "where the namespace enables it."),
        ToolSpec("memory_replay", _replay, Family.POWER,
                 _obj({"memory_id": memory_id, "full": {"type": "boolean", "default": False}}, ("memory_id",)),
                 "A memory's transcript spans with their text; full=true: whole transcripts.", read_only=True),
    )


def _admin_specs(lim: LimitsConfig) -> tuple[ToolSpec[NodeSide], ...]:
    """The tools about the node rather than one memory: peers, capabilities, approvals."""
    return (
        ToolSpec(PEERS, _peers, Family.ADMIN, _obj({}), "Trusted peers, live link state.", read_only=True),
        ToolSpec(CAPABILITIES, _capabilities, Family.ADMIN, _obj({"version": {"enum": [2, 3]}}),
                 "Node state: key, counts, limits.", read_only=True, door_view=_capabilities_door),
        ToolSpec("memory_approval_list", _approval_list, Family.ADMIN,
                 _obj({"status": {"enum": ["pending", "applied", "denied", "expired", "failed"],
                                  "default": "pending"},
                       "limit": _int(1, lim.max_recall_limit, 100)}),
                 "Pending actions (writes parked by an ask), oldest first.", read_only=True),
        ToolSpec("memory_approval_decide", _approval_decide, Family.ADMIN,
                 _obj({"id": _text(lim.max_id_chars, min_chars=1), "choice": {"enum": ["approve", "deny"]},
                       "remember": {"enum": ["once", "forever"], "default": "once"},
                       "decided_by": _text(256, min_chars=1)},
                      ("id", "choice")),
                 "Approve (runs the parked write once) or deny a pending action."),
    )


def loader_specs() -> tuple[ToolSpec[AgentTools], ...]:
    """The two tools a session grows its tool list with (answered by the MCP server, not the node)."""
    return (
        ToolSpec("memory_load_family", _load_family, Family.CORE,
                 _obj({"family": {"enum": [str(f) for f in Family if f is not Family.CORE]}}, ("family",)),
                 "Add tools: graph (link, verify), admin (peers, state), power (update, list, transcripts), full."),
        ToolSpec("memory_smart_load", _smart_load, Family.CORE, _obj({"intent": _text(1000, min_chars=1)}, ("intent",)),
                 "Add the tools a task needs."),
    )



# ---- handlers: the node's tools -------------------------------------------------------------

async def _store(node: NodeSide, a: Args) -> JSON:
    return await node.service.memory_store(**a)


async def _update(node: NodeSide, a: Args) -> JSON:
    return await node.service.memory_update(a.pop("id"), **a)


async def _get(node: NodeSide, a: Args) -> JSON:
    return await node.service.memory_get(a["id"])


async def _list(node: NodeSide, a: Args) -> JSON:
    return await node.service.memory_list(**a)


async def _recall(node: NodeSide, a: Args) -> JSON:
    return await node.service.memory_recall(a.pop("query"), **a)


async def _link(node: NodeSide, a: Args) -> JSON:
    return await node.service.memory_link(a.pop("src_id"), a.pop("dst_id"), a.pop("relation"), **a)


async def _link_many(node: NodeSide, a: Args) -> JSON:
    return await node.service.memory_link_many(a["links"])


async def _verify(node: NodeSide, a: Args) -> JSON:
    given = [a[k] for k in ("link_id", "memory_id") if k in a]
    if len(given) != 1:
        raise ServiceError("bad_input", "give exactly one of link_id or memory_id")
    return await node.service.memory_verify(str(given[0]))


async def _kg_query(node: NodeSide, a: Args) -> JSON:
    return await node.service.kg.query(a.pop("memory_id"), **a)


async def _find_paths(node: NodeSide, a: Args) -> JSON:
    return await node.service.kg.find_paths(a.pop("src_id"), a.pop("dst_id"), **a)


async def _kg_timeline(node: NodeSide, a: Args) -> JSON:
    return await node.service.kg.timeline(a.pop("memory_id"), **a)


async def _kg_invalidate(node: NodeSide, a: Args) -> JSON:
    return await node.service.kg.invalidate(a.pop("link_id"), **a)


async def _transcript_store(node: NodeSide, a: Args) -> JSON:
    return await node.service.transcripts.store(a.pop("content"), **a)


async def _replay(node: NodeSide, a: Args) -> JSON:
    return await node.service.transcripts.replay(a.pop("memory_id"), **a)


async def _peers(node: NodeSide, a: Args) -> JSON:
    return await node.peers()


async def _capabilities(node: NodeSide, a: Args) -> JSON:
    return await node.capabilities(**a)


async def _approval_list(node: NodeSide, a: Args) -> JSON:
    return await node.service.approval_list(**a)


async def _approval_decide(node: NodeSide, a: Args) -> JSON:
    return await node.service.approval_decide(a.pop("id"), a.pop("choice"), decided_by=a.pop("decided_by", "mcp"),
                                              **a)


# ---- handlers: the loaders ------------------------------------------------------------------

async def _load_family(agent: AgentTools, a: Args) -> JSON:
    try:
        families = [parse_family(a["family"])]
    except ValueError as e:
        raise ServiceError("bad_input", str(e)) from None
    return _loaded(agent, families)


async def _smart_load(agent: AgentTools, a: Args) -> JSON:
    return _loaded(agent, match_intent(a["intent"]))


def _loaded(agent: AgentTools, families: list[Family]) -> JSON:
    loaded = agent.load(families)
    out: dict[str, Any] = {"added": [str(f) for f in families], "loaded": sorted(map(str, loaded))}
    if not families:
        out["hint"] = "no family matched; families: " + "; ".join(f"{f}: {a}" for f, a in ABOUT.items())
    return out


# ---- how results read -----------------------------------------------------------------------

def _memory_head(r: dict[str, Any]) -> str:
    return f"memory {r.get('id')}"


def _link_head(r: dict[str, Any]) -> str:
    return f"link {r.get('link_id')} ({r.get('attest_level')})"


def _link_many_head(r: dict[str, Any]) -> str:
    return f"{r.get('made')} link(s) made, {r.get('failed')} failed"


def _verify_head(r: dict[str, Any]) -> str:
    what = f"link {r['link_id']}" if "link_id" in r else f"memory {r.get('memory_id')}"
    return f"{what}: " + ("verified" if r.get("signature_verified") else f"NOT verified ({r.get('reason')})")


def _capabilities_door(args: Mapping[str, Any], door: Door) -> dict[str, Any]:
    """v2 answers carry the door as it was; v3 adds the server's profile and the agent's loaded families."""
    if args.get("version") == 2:
        return dict(door.session)
    return {**door.session, "profile": str(door.profile), "loaded": sorted(map(str, door.loaded))}


# ---- what the table says about the tools ----------------------------------------------------

TOOL_NAMES = tuple(s.name for s in tool_specs(LimitsConfig()))
# Answered by the MCP server itself (a session's tool list), never sent to the node.
LOADERS = frozenset(s.name for s in loader_specs())
# Tools that change nothing: safe to send again when the answer to a sent call was lost.
READ_ONLY_TOOLS = frozenset(s.name for s in tool_specs(LimitsConfig()) if s.read_only)
# Each tool's family, in table order.
_EVERY_TOOL: tuple[ToolSpec[Any], ...] = (*tool_specs(LimitsConfig()), *loader_specs())
FAMILY_OF: dict[str, Family] = {s.name: s.family for s in _EVERY_TOOL}


def family_of(tool: str) -> Family:
    """The family ``tool`` is listed in; a name not in the table is listed in "full" only."""
    return FAMILY_OF.get(tool, Family.FULL)


def listed(tools: Iterable[str], loaded: Iterable[Family]) -> list[str]:
    """The tools (in the order given) a session with ``loaded`` families lists; CORE is always loaded."""
    have = {Family.CORE, *loaded}
    return [t for t in tools if Family.FULL in have or family_of(t) in have]
