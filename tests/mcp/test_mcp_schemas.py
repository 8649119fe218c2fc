"""Every tool's input schema accepts the arguments the tests send and refuses wrong types."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from node.config import LimitsConfig
from node.errors import ServiceError
from node.mcp.registry import TOOL_NAMES, tool_specs
from node.mcp.validate import ArgValidator

UUID = "00000000-0000-4000-8000-000000000000"
GOOD = {
    "memory_store": [{"content": "alpha", "tags": ["ops"]}, {"content": "beta", "title": "sig"},
                     {"content": "x", "namespace": "n", "priority": 10, "confidence": 0.5, "source": "s"}],
    "memory_update": [{"id": UUID, "content": "new text"}, {"id": UUID, "tags": ["a"], "priority": 2}],
    "memory_get": [{"id": UUID}],
    "memory_list": [{}, {"limit": 10}, {"namespace": "n", "limit": 1, "offset": 3}],
    "memory_recall": [{"query": "Ed25519 signatures"}, {"query": '"', "limit": 100},
                      {"query": "NEAR(", "namespace": "n"}],
    "memory_link": [{"src_id": UUID, "dst_id": UUID, "relation": "related_to"},
                    {"src_id": "a", "dst_id": "b", "relation": "r", "valid_until": None, "confidence": 1}],
    "memory_link_many": [{"links": [{"src_id": UUID, "dst_id": UUID, "relation": "related_to"}]},
                         {"links": [{"src_id": "a", "dst_id": "b", "relation": "r", "confidence": 1}] * 100}],
    "memory_verify": [{"link_id": "ab" * 32}],
    "memory_kg_query": [{"memory_id": UUID}, {"memory_id": UUID, "depth": 5, "relations": ["r"], "as_of": 0,
                                              "limit": 3}],
    "memory_find_paths": [{"src_id": UUID, "dst_id": UUID}, {"src_id": "a", "dst_id": "b", "max_depth": 1,
                                                              "limit": 100, "relations": ["x", "y"], "as_of": 5}],
    "memory_kg_timeline": [{"memory_id": UUID}, {"memory_id": UUID, "limit": 7}],
    "memory_kg_invalidate": [{"link_id": "ab" * 32}, {"link_id": "ab" * 32, "valid_until": 1}],
    "memory_transcript_store": [{"content": "user: hi"}, {"content": "x y", "namespace": "n",
                                                           "spans": [{"memory_id": UUID, "start": 0, "end": 1}]}],
    "memory_replay": [{"memory_id": UUID}, {"memory_id": UUID, "full": True}],
    "memory_peers": [{}],
    "memory_capabilities": [{}, {"version": 2}, {"version": 3}],
    "memory_approval_list": [{}, {"status": "denied", "limit": 5}],
    "memory_approval_decide": [{"id": UUID, "choice": "approve"},
                               {"id": UUID, "choice": "deny", "remember": "once", "decided_by": "ops"}],
}
WRONG_TYPE = {
    "memory_store": {"content": 5},
    "memory_update": {"id": UUID, "priority": "high"},
    "memory_get": {"id": ["x"]},
    "memory_list": {"limit": "10"},
    "memory_recall": {"query": "x", "limit": True},
    "memory_link": {"src_id": "a", "dst_id": "b", "relation": "r", "valid_until": "tomorrow"},
    "memory_link_many": {"links": [{"src_id": "a", "dst_id": "b", "relation": 5}]},
    "memory_verify": {"link_id": None},
    "memory_kg_query": {"memory_id": UUID, "depth": "5"},
    "memory_find_paths": {"src_id": UUID, "dst_id": UUID, "relations": "related_to"},
    "memory_kg_timeline": {"memory_id": UUID, "limit": 1.5},
    "memory_kg_invalidate": {"link_id": "ab" * 32, "valid_until": "now"},
    "memory_transcript_store": {"content": "x", "spans": [{"memory_id": UUID, "start": "0", "end": 1}]},
    "memory_replay": {"memory_id": UUID, "full": "yes"},
    "memory_peers": {"verbose": True},
    "memory_capabilities": {"x": 1},
    "memory_approval_list": {"limit": "all"},
    "memory_approval_decide": {"id": UUID, "choice": True},
}
SPECS = {s.name: s for s in tool_specs(LimitsConfig())}


def test_the_table_covers_exactly_the_tool_set() -> None:
    assert set(TOOL_NAMES) == set(GOOD) == set(WRONG_TYPE)


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_schema_is_valid_json_schema_and_closed(name: str) -> None:
    schema = SPECS[name].schema
    Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert SPECS[name].summary
    for prop in schema["properties"].values():
        assert "type" in prop or "enum" in prop


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_schema_accepts_what_the_tests_send(name: str) -> None:
    v = ArgValidator(tuple(SPECS.values()))
    for args in GOOD[name]:
        assert v.check(name, args) == args


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_schema_rejects_a_wrong_type_naming_the_argument(name: str) -> None:
    v = ArgValidator(tuple(SPECS.values()))
    with pytest.raises(ServiceError) as e:
        v.check(name, WRONG_TYPE[name])
    assert e.value.code == "bad_input"
    assert any(arg in e.value.message for arg in WRONG_TYPE[name])


def test_bounds_follow_the_limits_in_force() -> None:
    lim = LimitsConfig(max_recall_limit=7, max_query_chars=5)
    v = ArgValidator(tool_specs(lim))
    with pytest.raises(ServiceError) as e:
        v.check("memory_recall", {"query": "x", "limit": 8})
    assert e.value.code == "bad_input" and "<= 7" in e.value.message
    with pytest.raises(ServiceError) as e:
        v.check("memory_recall", {"query": "toolong"})
    assert e.value.code == "too_large"
