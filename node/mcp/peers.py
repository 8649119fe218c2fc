"""The peer table shown by `ai-memory peers` and the memory_peers tool: one row per configured or trusted peer."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from mesh.keys import fingerprint
from node.federation.codes import RejectCode
from storage import changelog, outbox

if TYPE_CHECKING:
    from mesh.link import PeerLink
    from node.mcp.runtime import Runtime
    from node.service import Service


class InFlight(Protocol):
    """The outbox sender, as the table reads it."""

    def inflight(self, peer: str) -> int:
        """Messages sent to ``peer`` and not yet ACKed."""
        ...


async def peers(service: Service, runtime: Runtime | None) -> list[dict[str, Any]]:
    """The peer table: the running node's (live link state) when one runs in this process, else read from
    the store (``runtime`` None: link state ``not_running``)."""
    if runtime is not None:
        return await runtime.peers()
    return await peer_rows(service)


async def peer_rows(svc: Service, links: Mapping[str, PeerLink] | None = None,
                    sender: InFlight | None = None) -> list[dict[str, Any]]:
    """Every configured or trusted peer: key, link state, last ACK, outbox depth, dead letters, sync seq.

    Without ``links`` (no node running in this process) the link state reads ``not_running``.
    """
    # A running node's links are its configured peers as of its last reload (SIGHUP); the file's otherwise.
    configured = ({p: link.url for p, link in links.items()} if links is not None
                  else {p.agent_id: p.url for p in svc.cfg.mesh.peers})
    names = sorted(set(configured) | set(svc.peer_keys))

    def read(conn: sqlite3.Connection) -> dict[str, Any]:
        return {"states": {s.peer: s for s in changelog.list_peer_states(conn)},
                "depth": {p: outbox.depth(conn, p) for p in names},
                "dead": {p: outbox.dead_letter_count(conn, p) for p in names},
                "parked": {p: changelog.parked_count(conn, p) for p in names},
                "unknown_key": {p: changelog.parked_count(conn, p, code=RejectCode.UNKNOWN_KEY) for p in names}}

    data = await svc.db.read(read)
    now = time.time()
    out = []
    for p in names:
        link = (links or {}).get(p)
        key = svc.peer_keys.get(p)
        state = data["states"].get(p)
        last_ack = link.last_ack_at if link and link.last_ack_at else (
            state.last_ack_at / 1000 if state and state.last_ack_at else None)
        if link is not None:
            link_state = link.state.value
        else:
            link_state = "not_running" if links is None and p in configured else "not_configured"
        out.append({
            "agent_id": p, "fingerprint": fingerprint(key) if key else None, "trusted_key": key is not None,
            "url": configured.get(p), "link_state": link_state, "last_error": link.last_error if link else None,
            "last_ack_age_s": round(now - last_ack, 3) if last_ack else None,
            "outbox_depth": data["depth"][p], "in_flight": sender.inflight(p) if sender else 0,
            "dead_letters": data["dead"][p], "last_sync_seq": state.last_sync_seq if state else 0,
            # Sync items from this peer parked: given up on after federation.sync_park_after rounds, or
            # (parked_unknown_key, counted in both) waiting for a key of their signer this node does not know.
            "parked": data["parked"][p], "parked_unknown_key": data["unknown_key"][p],
        })
    return out
