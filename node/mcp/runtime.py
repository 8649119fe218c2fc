"""The running node as the faces see it: what only a node in this process knows (live links, readiness,
A2A counters, the doors it serves). ``node.node.Node`` is one; the CLI and an embedded MCP server have none
and pass None."""

from __future__ import annotations

from typing import Any, Protocol


class Runtime(Protocol):
    async def peers(self) -> list[dict[str, Any]]:
        """One row per configured or trusted peer, with its live link state (``node.mcp.peers.peer_rows``)."""
        ...

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, what /readyz answers)."""
        ...

    def a2a_stats(self) -> dict[str, Any]:
        """The seen-cache, receive, federation, delivery and sync counters since the node started."""
        ...

    def transports(self) -> list[str]:
        """The doors the node serves, e.g. ``mesh:mtls:HOST:PORT``, ``mcp:socket:PATH``."""
        ...

    def catch_up(self) -> dict[str, dict[str, Any]]:
        """Each peer's catch-up by sync: items pulled, the peer's head seq vs our cursor, lag in seqs, percent."""
        ...

    def restore_progress(self) -> dict[str, Any] | None:
        """The restore from the mesh the node runs or ran since it started (items, percent, each peer), or None."""
        ...
