"""``memory_capabilities`` in its versions: v2 (the shape clients know) and v3 (v2 plus sections).

``capabilities(service, runtime)`` is honest live state: only what this process does and holds right now.
``runtime`` is the node running in this process, or None (the CLI reading the store, an embedded MCP server).

A v3 section is one entry of ``SECTIONS``: its name (the key in the answer) and an async function of the
service and the runtime that returns live state. To add one, write the function beside the state it reads
and add one line to the table, e.g. ``"kg_backend": kg.capabilities_section``. Every section reads state
that exists now; none is a placeholder.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from node.errors import ServiceError
from node.federation.codes import RejectCode
from node.federation.restore import RestoreProgress, marker_path
from node.mcp.peers import peers
from node.mcp.profiles import ABOUT
from node.mcp.registry import FAMILY_OF
from storage import changelog, links, memories, outbox, transcripts

if TYPE_CHECKING:
    from node.mcp.runtime import Runtime
    from node.service import Service

V2, V3 = 2, 3
VERSIONS = (V2, V3)

Section = Callable[["Service", "Runtime | None"], Awaitable[Any]]


async def capabilities(service: Service, runtime: Runtime | None, version: int = V3) -> dict[str, Any]:
    """The node's state as ``memory_capabilities`` answers it.

    ``version`` 2 is the shape v2 clients know; 3 (the default) keeps every v2 field where it is and adds
    the sections of ``SECTIONS``."""
    if version not in VERSIONS:
        raise ServiceError("bad_input", f"capabilities version must be one of {VERSIONS}, got {version!r}")

    def read(conn: sqlite3.Connection) -> dict[str, Any]:
        return {"links": links.counts_by_attest_level(conn), "memories": memories.count(conn),
                "memories_by_attest_level": memories.counts_by_attest_level(conn),
                "sync_parked": changelog.parked_count(conn),
                "sync_parked_unknown_key": changelog.parked_count(conn, code=RejectCode.UNKNOWN_KEY),
                "outbox_depth": outbox.depth(conn), "dead_letters": outbox.dead_letter_count(conn),
                "change_log_seq": changelog.last_seq(conn), "counters": changelog.all_counters(conn)}

    stored = await service.db.read(read)
    rows = await peers(service, runtime)
    caps: dict[str, Any] = {
        "schema_version": version,
        "agent_id": service.agent_id,
        "key_fingerprint": service.identity.fingerprint if service.identity else None,
        "signing": service.identity is not None,
        "memories": stored["memories"],
        "memories_by_attest_level": stored["memories_by_attest_level"],
        "links_by_attest_level": stored["links"],
        "sync_parked": stored["sync_parked"],
        # Of those, the items waiting for a key of their signer this node does not know (import its key history).
        "sync_parked_unknown_key": stored["sync_parked_unknown_key"],
        "mesh_trust": service.cfg.mesh.trust,
        "outbox_depth": stored["outbox_depth"],
        "dead_letters": stored["dead_letters"],
        "change_log_seq": stored["change_log_seq"],
        # Durable tallies: inbound changes applied by kind and outcome, rejections by code.
        "applied": stored["counters"],
        "peers": [{k: p[k] for k in ("agent_id", "link_state", "last_ack_age_s", "trusted_key")} for p in rows],
        "write_quorum": service.cfg.federation.write_quorum,
        "limits": asdict(service.cfg.limits),
        "node_running": runtime is not None,
        "hooks": service.hooks.snapshot(),
        "kg_backend": service.kg.backend,
        "transcripts": await service.db.read(transcripts.counts),
    }
    if runtime is not None:
        caps["a2a"] = runtime.a2a_stats()
        caps["transports"] = runtime.transports()
    if version >= V3:
        caps.update(await sections(service, runtime))
    return caps


async def _agents(svc: Service, runtime: Runtime | None) -> dict[str, Any]:
    """Agents as principals: each of this node's agents (and the node) with its memories, bytes against its quota,
    requests per second and this process's MCP calls by outcome."""
    gate = svc.writes.gate
    default = svc.cfg.permissions.max_bytes_per_agent
    return await svc.agents.section(gate.quota_of if gate is not None else lambda _agent: default)


async def _trust(svc: Service, runtime: Runtime | None) -> dict[str, Any]:
    """Membership and keys: who may talk to this node, and how many retired keys still verify."""
    keyring = svc.keyring
    members = sorted(keyring.peer_keys)
    return {"mode": svc.cfg.mesh.trust, "members": members,
            "retired_keys": {agent: len(keyring.keys_for(agent)) - 1 for agent in members
                             if len(keyring.keys_for(agent)) > 1},
            "configured_peers_without_key": sorted(p.agent_id for p in svc.cfg.mesh.peers
                                                   if p.agent_id not in keyring.peer_keys)}


async def _sync(svc: Service, runtime: Runtime | None) -> dict[str, Any]:
    """Catch-up sync: each peer's cursor and parked items, the settings that drive it, and a restore from the mesh
    (``restore``)."""

    def read(conn: sqlite3.Connection) -> dict[str, Any]:
        return {"cursors": {s.peer: s.last_sync_seq for s in changelog.list_peer_states(conn)},
                "parked": changelog.parked_count(conn),
                "parked_unknown_key": changelog.parked_count(conn, code=RejectCode.UNKNOWN_KEY)}

    stored = await svc.db.read(read)
    fed = svc.cfg.federation
    return {**stored, "interval_s": fed.sync_interval_s, "park_after": fed.sync_park_after,
            "page_limit": fed.sync_page_limit, "park_max": fed.sync_park_max,
            "restore": await _restore(svc, runtime),
            # The running node's pulls: per peer, items pulled, its head vs our cursor, percent (None: not running).
            "catch_up": runtime.catch_up() if runtime is not None else None}


async def _restore(svc: Service, runtime: Runtime | None) -> dict[str, Any] | None:
    """A restore from the mesh: the running node's progress (items, percent, each peer), else what its marker
    says of one that was stopped before it ended (``state: interrupted``; the next start resumes it); None when
    there is none."""
    if runtime is not None:
        return runtime.restore_progress()
    stopped = RestoreProgress.read(marker_path(svc.cfg), [p.agent_id for p in svc.cfg.mesh.peers])
    if stopped is None:
        return None
    return {**stopped.snapshot(), "state": "interrupted", "items": None, "percent": None}


async def _profiles(svc: Service, runtime: Runtime | None) -> dict[str, Any]:
    """The MCP tool families: the configured profile and each family's tools, in table order (a session's own
    loaded families are in ``mcp.loaded``)."""
    families: dict[str, list[str]] = {str(f): [] for f in ABOUT}
    for tool, family in FAMILY_OF.items():
        families[str(family)].append(tool)
    return {"profile": svc.cfg.mcp.profile, "families": families}


async def _storage(svc: Service, runtime: Runtime | None) -> dict[str, Any]:
    """The database: its schema version, size on disk, the writer's time in its current batch (s) and its idle
    full-text merging."""
    busy = svc.db.writer_busy_s()
    return {"schema_version": svc.db.schema_version, "bytes": svc.db.bytes_used(),
            "max_bytes": svc.cfg.limits.max_db_bytes,
            "writer_busy_s": round(busy, 3) if busy != float("inf") else None,
            "fts_merge": svc.db.merge_stats}


async def _readiness(svc: Service, runtime: Runtime | None) -> dict[str, Any] | None:
    """What /readyz answers, when a node runs in this process (None from the CLI or an embedded MCP)."""
    if runtime is None:
        return None
    return runtime.readiness()[1]


async def _permissions(svc: Service, runtime: Runtime | None) -> dict[str, Any]:
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
    "agents": _agents,
}


async def sections(svc: Service, runtime: Runtime | None) -> dict[str, Any]:
    """Every registered section's live value, in table order."""
    return {name: await section(svc, runtime) for name, section in SECTIONS.items()}
