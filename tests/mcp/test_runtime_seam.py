"""The runtime seam, in-process: capabilities and peers read the node running in this process when the backend
was built with one, and the store alone when it was not (the CLI, an embedded MCP server)."""

from __future__ import annotations

from typing import Any

from node.mcp.backend import ServiceBackend
from node.mcp.capabilities import capabilities
from node.mcp.peers import peers

PEER = "ai:peer-b@lab"
ROWS = [{"agent_id": PEER, "fingerprint": None, "trusted_key": False, "url": "https://127.0.0.1:7444",
         "link_state": "up", "last_error": None, "last_ack_age_s": 0.25, "outbox_depth": 0, "in_flight": 1,
         "dead_letters": 0, "last_sync_seq": 7, "parked": 0}]


class FakeRuntime:
    """A node running in this process, as the faces see it (node.mcp.runtime.Runtime)."""

    async def peers(self) -> list[dict[str, Any]]:
        return ROWS

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return True, {"ready": True, "agent_id": "ai:mcp-test@lab", "reasons": [], "peers": {PEER: "up"}}

    def a2a_stats(self) -> dict[str, Any]:
        return {"delivered": 3, "dead_lettered": 0}

    def transports(self) -> list[str]:
        return ["mcp:socket:/run/node.sock"]

    def restore_progress(self) -> dict[str, Any] | None:
        return None

    def catch_up(self) -> dict[str, dict[str, Any]]:
        return {PEER: {"pulled": 7, "cursor": 7, "head": 7, "lag_seqs": 0, "percent": 100.0}}


async def test_capabilities_read_the_runtime_when_a_node_runs_here(service) -> None:
    caps = await capabilities(service, FakeRuntime())
    assert caps["node_running"] is True
    assert caps["a2a"] == {"delivered": 3, "dead_lettered": 0}
    assert caps["transports"] == ["mcp:socket:/run/node.sock"]
    assert caps["readiness"] == {"ready": True, "agent_id": "ai:mcp-test@lab", "reasons": [], "peers": {PEER: "up"}}
    assert caps["peers"] == [{"agent_id": PEER, "link_state": "up", "last_ack_age_s": 0.25, "trusted_key": False}]


async def test_without_a_runtime_capabilities_and_peers_read_the_store(service) -> None:
    caps = await capabilities(service, None)
    assert caps["node_running"] is False and caps["readiness"] is None
    assert "a2a" not in caps and "transports" not in caps
    assert caps["peers"] == [] and await peers(service, None) == []


async def test_a_v2_answer_has_no_sections_even_with_a_runtime(service) -> None:
    caps = await capabilities(service, FakeRuntime(), 2)
    assert caps["schema_version"] == 2 and caps["transports"] == ["mcp:socket:/run/node.sock"]
    assert not {"trust", "sync", "profiles", "storage", "readiness", "permissions"} & set(caps)


async def test_the_backend_hands_its_runtime_to_the_peers_and_capabilities_tools(service) -> None:
    live = ServiceBackend(service, runtime=FakeRuntime())
    assert await live.call("memory_peers", {}) == ROWS
    assert (await live.call("memory_capabilities", {}))["readiness"]["ready"] is True
    embedded = ServiceBackend(service)
    assert await embedded.call("memory_peers", {}) == []
    assert (await embedded.call("memory_capabilities", {"version": 3}))["node_running"] is False
    assert live.calls["memory_peers", "ok"] == embedded.calls["memory_peers", "ok"] == 1
