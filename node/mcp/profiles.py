"""Tool families (pure): the families a tool belongs to, what each is for, and the words that choose them.

A session starts with its profile's families (``[mcp] profile``, default "core": at most five tools) and
grows with ``memory_load_family`` / ``memory_smart_load``. Listing is about legibility, not permission:
a call to a known tool that is not listed still runs. Each tool names its family in its registry entry
(``node/mcp/registry.py``); a tool of family FULL is listed in "full" only.
"""

from __future__ import annotations

import enum
import re


class Family(enum.StrEnum):
    CORE = "core"
    GRAPH = "graph"
    ADMIN = "admin"
    POWER = "power"
    FULL = "full"


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
