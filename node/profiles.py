"""Tool families and profiles: which tools an MCP session lists, and what the loaders add (pure).

A session starts with its profile's families (``[mcp] profile``, default "core": at most five tools) and
grows with ``memory_load_family`` / ``memory_smart_load``. Listing is about legibility, not permission:
a call to a known tool that is not listed still runs.

To put a new tool in a family, add one line to ``FAMILY_OF``; a tool with no line is listed in "full" only.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable


class Family(enum.StrEnum):
    CORE = "core"
    GRAPH = "graph"
    ADMIN = "admin"
    POWER = "power"
    FULL = "full"


# One line per tool (memory_approval_* belong in ADMIN).
FAMILY_OF: dict[str, Family] = {
    "memory_store": Family.CORE,
    "memory_recall": Family.CORE,
    "memory_get": Family.CORE,
    "memory_load_family": Family.CORE,
    "memory_smart_load": Family.CORE,
    "memory_link": Family.GRAPH,
    "memory_link_many": Family.GRAPH,
    "memory_verify": Family.GRAPH,
    "memory_kg_query": Family.GRAPH,
    "memory_find_paths": Family.GRAPH,
    "memory_kg_timeline": Family.GRAPH,
    "memory_kg_invalidate": Family.GRAPH,
    "memory_peers": Family.ADMIN,
    "memory_capabilities": Family.ADMIN,
    "memory_approval_list": Family.ADMIN,
    "memory_approval_decide": Family.ADMIN,
    "memory_update": Family.POWER,
    "memory_list": Family.POWER,
    "memory_transcript_store": Family.POWER,
    "memory_replay": Family.POWER,
}

# What each family is for: shown by the loaders, matched by memory_smart_load's intent words.
ABOUT: dict[Family, str] = {
    Family.CORE: "store, recall and fetch memories",
    Family.GRAPH: "link memories, verify signatures, walk the knowledge graph",
    Family.ADMIN: "peers, node capabilities and state, approvals",
    Family.POWER: "update memories, list and page through them, store and replay transcripts",
    Family.FULL: "every tool",
}
INTENT_WORDS: dict[Family, tuple[str, ...]] = {
    Family.GRAPH: ("link", "relat", "graph", "path", "connect", "verif", "signature", "attest", "timeline",
                   "invalidat", "neighbo", "kg"),
    Family.ADMIN: ("peer", "capabilit", "status", "health", "approv", "permission", "admin", "federat", "hook",
                   "mesh", "node"),
    Family.POWER: ("update", "edit", "change", "modify", "correct", "list", "browse", "page", "all memories",
                   "transcript", "replay", "conversation"),
}


def family_of(tool: str) -> Family:
    return FAMILY_OF.get(tool, Family.FULL)


def listed(tools: Iterable[str], loaded: Iterable[Family]) -> list[str]:
    """The tools (in table order) a session with ``loaded`` families lists; CORE is always loaded."""
    have = {Family.CORE, *loaded}
    return [t for t in tools if Family.FULL in have or family_of(t) in have]


def parse_family(name: str) -> Family:
    """The family called ``name``; ValueError naming the families otherwise."""
    try:
        return Family(name)
    except ValueError:
        raise ValueError(f"no tool family {name!r}; families: {', '.join(Family)}") from None


def match_intent(intent: str) -> list[Family]:
    """Families whose words occur in ``intent`` (case-insensitive), in table order; [] when none does."""
    text = intent.lower()
    return [f for f, words in INTENT_WORDS.items() if any(re.search(rf"\b{re.escape(w)}", text) for w in words)]
