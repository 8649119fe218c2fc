"""``memory_capabilities`` in its versions: v2 (the shape clients know) and v3 (v2 plus sections).

A v3 section is one entry of ``SECTIONS``: its name (the key in the answer) and a function of the
service that returns live state (a value or an awaitable). To add one, write the function beside the
state it reads and add one line to the table, e.g. ``"kg_backend": kg.capabilities_section``.
Every section reads state that exists now; none is a placeholder.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from node.profiles import ABOUT, FAMILY_OF

V2, V3 = 2, 3
VERSIONS = (V2, V3)

Section = Callable[[Any], Any]


def _trust(svc: Any) -> dict[str, Any]:
    """Membership and keys: who may talk to this node, and how many retired keys still verify."""
    keyring = svc.keyring
    members = sorted(keyring.peer_keys)
    return {"mode": svc.cfg.mesh.trust, "members": members,
            "retired_keys": {agent: len(keyring.keys_for(agent)) - 1 for agent in members
                             if len(keyring.keys_for(agent)) > 1},
            "configured_peers_without_key": sorted(p.agent_id for p in svc.cfg.mesh.peers
                                                   if p.agent_id not in keyring.peer_keys)}


async def _sync(svc: Any) -> dict[str, Any]:
    """Catch-up sync: each peer's cursor and parked items, and the settings that drive it."""
    from storage import changelog

    def read(conn: Any) -> dict[str, Any]:
        return {"cursors": {s.peer: s.last_sync_seq for s in changelog.list_peer_states(conn)},
                "parked": changelog.parked_count(conn)}

    stored = await svc.db.read(read)
    fed = svc.cfg.federation
    return {**stored, "interval_s": fed.sync_interval_s, "park_after": fed.sync_park_after,
            "page_limit": fed.sync_page_limit}


def _profiles(svc: Any) -> dict[str, Any]:
    """The MCP tool families: the configured profile and each family's tools (a session's own loaded
    families are in ``mcp.loaded``)."""
    families: dict[str, list[str]] = {str(f): [] for f in ABOUT}
    for tool, family in FAMILY_OF.items():
        families[str(family)].append(tool)
    return {"profile": svc.cfg.mcp.profile, "families": families}


def _storage(svc: Any) -> dict[str, Any]:
    """The database: its schema version, size on disk, the writer's time in its current batch and its idle
    full-text merging."""
    busy = svc.db.writer_busy_s()
    return {"schema_version": svc.db.schema_version, "bytes": svc.db.bytes_used(),
            "max_bytes": svc.cfg.limits.max_db_bytes,
            "writer_busy_s": round(busy, 3) if busy != float("inf") else None,
            "fts_merge": svc.db.merge_stats}


def _readiness(svc: Any) -> dict[str, Any] | None:
    """What /readyz answers, when a node runs in this process (None from the CLI or an embedded MCP)."""
    if svc.runtime is None:
        return None
    return svc.runtime.readiness()[1]


def _permissions(svc: Any) -> dict[str, Any]:
    """The permission gate: its mode and a one-line summary per rule (docs/permissions.md)."""
    if svc.gate is None:
        return {"mode": "off", "rule_summary": []}
    snapshot: dict[str, Any] = svc.gate.snapshot()
    return snapshot


SECTIONS: dict[str, Section] = {
    "trust": _trust,
    "sync": _sync,
    "profiles": _profiles,
    "storage": _storage,
    "readiness": _readiness,
    "permissions": _permissions,
}


async def sections(svc: Any) -> dict[str, Any]:
    """Every registered section's live value, in table order."""
    out = {}
    for name, fn in SECTIONS.items():
        value = fn(svc)
        out[name] = await value if inspect.isawaitable(value) else value
    return out
