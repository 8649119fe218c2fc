"""The one tool walk-through every transport must pass: store two, recall, link, verify, capabilities."""

from __future__ import annotations

from mcp import ClientSession

from node.mcp.registry import LOADERS, TOOL_NAMES
from tests.mcp.conftest import AGENT, ok


async def walk_through(session: ClientSession) -> dict:
    first = await session.list_tools()
    assert len(first.tools) <= 5 and {"memory_store", "memory_recall", "memory_load_family"} <= {
        t.name for t in first.tools}
    await ok(session, "memory_load_family", {"family": "full"})
    listed = await session.list_tools()
    assert sorted(t.name for t in listed.tools) == sorted([*TOOL_NAMES, *LOADERS])
    for t in listed.tools:
        assert t.input_schema["type"] == "object" and t.description

    a = await ok(session, "memory_store", {"content": "alpha keys are rotated quarterly", "tags": ["ops"]})
    b = await ok(session, "memory_store", {"content": "beta signatures use Ed25519", "title": "sig"})
    assert a["origin"] == AGENT and a["created_at"] > 0

    hits = (await ok(session, "memory_recall", {"query": "Ed25519 signatures"}))["results"]
    assert [h["id"] for h in hits] == [b["id"]]
    assert (await ok(session, "memory_get", {"id": a["id"]}))["content"] == a["content"]
    listed_ids = {m["id"] for m in (await ok(session, "memory_list", {"limit": 10}))["results"]}
    assert {a["id"], b["id"]} <= listed_ids

    link = await ok(session, "memory_link", {"src_id": a["id"], "dst_id": b["id"], "relation": "related_to"})
    assert link["attest_level"] == "self_signed" and link["signed_by"] == AGENT

    v = await ok(session, "memory_verify", {"link_id": link["link_id"]})
    assert v["signature_verified"] is True and v["attest_level"] == "self_signed"

    caps = await ok(session, "memory_capabilities")
    assert caps["agent_id"] == AGENT
    assert caps["key_fingerprint"] and caps["signing"] is True
    assert caps["links_by_attest_level"]["self_signed"] >= 1
    assert caps["limits"]["max_content_bytes"] > 0
    assert caps["schema_version"] >= 1
    assert isinstance((await ok(session, "memory_peers"))["results"], list)
    return {"a": a, "b": b, "link": link, "caps": caps}
