"""Tool profiles and loaders through the SDK's client, capabilities v2 and v3, and the tools/list byte budget."""

from __future__ import annotations

import anyio
import mcp_types as types
import pytest

from node.config import LimitsConfig, from_dict
from node.mcp.profiles import Family, match_intent
from node.mcp.registry import FAMILY_OF, LOADERS, TOOL_NAMES, family_of, listed, loader_specs, tool_specs
from node.mcp.server import build_server
from tests.mcp.conftest import CALL_TIMEOUT_S, err, ok, stdio_session

# tools/list of each tool as main served it before profiles and compact schemas (bytes of its JSON, as
# the SDK sends it), and the whole list then: 7547 bytes (13 tools) for every session.
BEFORE_BYTES = {"memory_store": 931, "memory_update": 901, "memory_get": 262, "memory_list": 494,
                "memory_recall": 501, "memory_link": 753, "memory_verify": 507, "memory_peers": 201,
                "memory_capabilities": 221}
BEFORE_LIST_BYTES = 7547


def listing_bytes(names: list[str]) -> int:
    specs = {s.name: s for s in tool_specs(LimitsConfig()) + loader_specs()}
    tools = [types.Tool(name=n, description=specs[n].summary, input_schema=specs[n].listed_schema)
             for n in names]
    return len(types.ListToolsResult(tools=tools).model_dump_json(by_alias=True, exclude_none=True))


def test_the_before_numbers_cover_every_tool_there_is() -> None:
    before = {**BEFORE_BYTES, **KG_BEFORE_BYTES, **APPROVAL_BEFORE_BYTES, **TRANSCRIPT_BEFORE_BYTES}
    assert set(before) == set(TOOL_NAMES)


# The knowledge-graph tools as they were listed when they landed (bytes each, before compact schemas).
KG_BEFORE_BYTES = {"memory_kg_query": 883, "memory_find_paths": 936, "memory_kg_timeline": 420,
                   "memory_kg_invalidate": 456}
# The approval tools with the descriptive schemas they were written with (bytes each).
APPROVAL_BEFORE_BYTES = {"memory_approval_list": 540, "memory_approval_decide": 728}
# The transcript tools likewise, and memory_link_many (its full schema, bounds and all, as the validator holds it).
TRANSCRIPT_BEFORE_BYTES = {"memory_transcript_store": 1098, "memory_replay": 548, "memory_link_many": 772}


@pytest.mark.parametrize("family", list(Family))
def test_each_profile_lists_at_most_half_the_bytes_of_the_same_tools_before(family: Family) -> None:
    before = {**BEFORE_BYTES, **KG_BEFORE_BYTES, **APPROVAL_BEFORE_BYTES, **TRANSCRIPT_BEFORE_BYTES}
    names = listed([*TOOL_NAMES, *LOADERS], [family])
    old = [n for n in names if n in before]
    # The same tools as before, at equal information (bounds, units and id formats said once, in the
    # server's instructions), take at most half the bytes; the two loaders are new and counted apart.
    assert listing_bytes(old) <= (sum(before[n] for n in old) + len(old) + 11) / 2


def test_default_profile_is_at_most_five_tools_and_a_fifth_of_the_bytes() -> None:
    names = listed([*TOOL_NAMES, *LOADERS], [Family.CORE])
    assert len(names) <= 5 and set(LOADERS) <= set(names)
    assert listing_bytes(names) <= BEFORE_LIST_BYTES / 5


def test_a_tool_with_no_line_in_the_table_is_listed_in_full_only() -> None:
    assert family_of("memory_kg_query_new") is Family.FULL
    assert listed(["memory_store", "memory_new"], [Family.GRAPH]) == ["memory_store"]
    assert listed(["memory_store", "memory_new"], [Family.FULL]) == ["memory_store", "memory_new"]
    assert set(FAMILY_OF) >= set(TOOL_NAMES) | LOADERS


def test_intent_words_choose_families() -> None:
    assert match_intent("link these two memories and verify the signature") == [Family.GRAPH]
    assert match_intent("which peers are up?") == [Family.ADMIN]
    assert match_intent("Update the title, then list everything") == [Family.POWER]
    assert match_intent("hello") == []


def test_the_server_announces_tools_list_changed() -> None:
    server = build_server(object(), limits=LimitsConfig(), session={})  # type: ignore[arg-type]
    caps = server.create_initialization_options().capabilities
    assert caps.tools is not None and caps.tools.list_changed is True


def test_an_unknown_profile_is_a_config_error() -> None:
    from node.config import ConfigError
    with pytest.raises(ConfigError) as e:
        from_dict({"mcp": {"profile": "everything"}}, env={})
    assert "families: core, graph, admin, power, full" in e.value.message


async def test_loading_a_family_sends_list_changed_and_its_tools_work(home) -> None:
    changed = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with stdio_session(home, message_handler=on_message) as s:
        first = {t.name for t in (await s.list_tools()).tools}
        assert len(first) <= 5 and "memory_link" not in first
        a = await ok(s, "memory_store", {"content": "graph tools arrive on demand"})
        b = await ok(s, "memory_store", {"content": "a second memory to link"})
        assert await err(s, "memory_load_family", {"family": "everything"}) == "bad_input"
        assert not changed.is_set()
        loaded = await ok(s, "memory_load_family", {"family": "graph"})
        assert loaded == {"added": ["graph"], "loaded": ["core", "graph"]}
        with anyio.fail_after(CALL_TIMEOUT_S):
            await changed.wait()
        now = {t.name for t in (await s.list_tools()).tools}
        assert now == first | {"memory_link", "memory_link_many", "memory_verify", "memory_kg_query",
                               "memory_find_paths", "memory_kg_timeline", "memory_kg_invalidate"}
        link = await ok(s, "memory_link", {"src_id": a["id"], "dst_id": b["id"], "relation": "related_to"})
        assert (await ok(s, "memory_verify", {"link_id": link["link_id"]}))["signature_verified"] is True

        smart = await ok(s, "memory_smart_load", {"intent": "which peers are up right now?"})
        assert smart["added"] == ["admin"] and "memory_peers" in {t.name for t in (await s.list_tools()).tools}
        none = await ok(s, "memory_smart_load", {"intent": "hello"})
        assert none["added"] == [] and "graph:" in none["hint"]


async def test_capabilities_v3_keeps_every_v2_field_and_v2_is_asked_for(home) -> None:
    async with stdio_session(home) as s:
        v2 = await ok(s, "memory_capabilities", {"version": 2})
        v3 = await ok(s, "memory_capabilities")
        assert v2["schema_version"] == 2 and v3["schema_version"] == 3
        assert set(v2) <= set(v3)
        for key in set(v2) - {"schema_version", "mcp"}:
            assert v3[key] == v2[key], key
        assert v2["mcp"] == {"transport": "stdio", "mode": "embedded"}
        assert v3["mcp"]["profile"] == "core" and v3["mcp"]["loaded"] == ["core"]
        assert set(v3) - set(v2) == {"trust", "sync", "profiles", "storage", "readiness", "permissions", "agents"}
        assert v3["trust"]["mode"] == "pinned" and v3["sync"]["parked"] == 0
        assert v3["profiles"]["families"]["graph"][:2] == ["memory_link", "memory_link_many"]
        assert v3["storage"]["schema_version"] >= 3 and v3["storage"]["bytes"] > 0
        assert v3["readiness"] is None  # embedded: no node runs in this process
        assert await err(s, "memory_capabilities", {"version": 1}) == "bad_input"
