"""The Decision contract and the chain, with plain values: no processes, no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from node.hooks import decision as dec
from node.hooks.decision import ALLOW, Allow, Ask, AskUser, Chain, Deny, Modify, Proceed, Refuse, parse_decision
from node.hooks.events import SPECS, EventClass, HookEvent, Phase

PRE_STORE = SPECS[HookEvent.PRE_STORE]
POST_STORE = SPECS[HookEvent.POST_STORE]
POST_RECALL = SPECS[HookEvent.POST_RECALL]


@pytest.mark.parametrize("wire,expected", [
    ({"decision": "allow"}, Allow()),
    ({"decision": "modify", "delta": {"title": "t"}}, Modify({"title": "t"})),
    ({"decision": "deny", "code": "secret_detected", "reason": "r"}, Deny("secret_detected", "r")),
    ({"decision": "deny", "code": "x"}, Deny("x", "no reason given")),
    ({"decision": "ask_user", "prompt": "ok?"}, AskUser("ok?", ("approve", "deny"), "deny")),
    ({"decision": "ask_user", "prompt": "which?", "options": ["a", "b"], "default": "b"},
     AskUser("which?", ("a", "b"), "b")),
])
def test_valid_decisions_parse(wire: dict[str, Any], expected: object) -> None:
    got = parse_decision(wire, PRE_STORE)
    assert got == expected
    assert parse_decision(dec.decision_to_wire(got), PRE_STORE) == got


@pytest.mark.parametrize("wire,needle", [
    ("allow", "JSON object"),
    ([], "JSON object"),
    ({}, "'decision'"),
    ({"decision": "ALLOW"}, "'decision'"),
    ({"decision": "allow", "extra": 1}, "unknown key"),
    ({"decision": "modify"}, "lacks"),
    ({"decision": "modify", "delta": {}}, "non-empty"),
    ({"decision": "modify", "delta": {"id": "x"}}, "cannot modify 'id'"),
    ({"decision": "modify", "delta": {"priority": "high"}}, "priority"),
    ({"decision": "modify", "delta": {"priority": True}}, "priority"),
    ({"decision": "modify", "delta": {"tags": ["a", 1]}}, "tags"),
    ({"decision": "modify", "delta": {"links": [{"dst_id": "x"}]}}, "links"),
    ({"decision": "modify", "delta": {"links": [{"dst_id": "x", "relation": "r", "confidence": 2}]}}, "links"),
    ({"decision": "deny", "code": "Bad Code", "reason": "r"}, "snake_case"),
    ({"decision": "deny", "code": "x" * 65}, "snake_case"),
    ({"decision": "deny", "code": "x", "reason": 5}, "reason"),
    ({"decision": "ask_user"}, "lacks"),
    ({"decision": "ask_user", "prompt": "  "}, "prompt"),
    ({"decision": "ask_user", "prompt": "p", "options": []}, "options"),
    ({"decision": "ask_user", "prompt": "p", "options": ["a", "a"]}, "repeat"),
    ({"decision": "ask_user", "prompt": "p", "options": ["a"], "default": "b"}, "default"),
])
def test_malformed_decisions_are_refused_with_a_reason(wire: Any, needle: str) -> None:
    with pytest.raises(dec.DecisionError) as e:
        parse_decision(wire, PRE_STORE)
    assert needle in str(e.value)


def test_modify_on_an_event_without_fields_parses_and_the_chain_ignores_it() -> None:
    d = parse_decision({"decision": "modify", "delta": {"anything": 1}}, POST_STORE)
    chain = Chain.start(POST_STORE, {"memory": {}}).step("late", d)
    assert chain.outcome() == Proceed({"memory": {}})
    assert "accepts no modify" in chain.warnings[0]


def test_deltas_apply_in_order_and_name_their_hooks() -> None:
    chain = Chain.start(PRE_STORE, {"title": "orig", "source": ""})
    chain = chain.step("a", Modify({"title": "A", "source": "a"})).step("b", Allow()).step("c", Modify({"title": "C"}))
    assert chain.outcome() == Proceed({"title": "C", "source": "a"}, ("a", "c"))


def test_link_proposals_accumulate_once_each() -> None:
    p1 = {"dst_id": "m1", "relation": "related_to"}
    p2 = {"dst_id": "m2", "relation": "related_to"}
    chain = Chain.start(PRE_STORE, {}).step("a", Modify({"links": [p1, p1]})).step("b", Modify({"links": [p1, p2]}))
    assert chain.payload["links"] == [p1, p2]


def test_first_deny_ends_the_chain() -> None:
    chain = Chain.start(PRE_STORE, {}).step("a", ALLOW).step("b", Deny("b_code", "r"))
    assert chain.done
    assert chain.outcome() == Refuse("b", Deny("b_code", "r"))


def test_deny_beats_an_earlier_ask_and_ask_beats_allow() -> None:
    asked = Chain.start(PRE_STORE, {"title": "t"}).step("a", AskUser("sure?"))
    assert not asked.done
    assert asked.step("b", ALLOW).outcome() == Ask("a", AskUser("sure?"), {"title": "t"})
    assert asked.step("b", Deny("no", "r")).outcome() == Refuse("b", Deny("no", "r"))


def test_ask_carries_the_payload_after_later_deltas() -> None:
    out = Chain.start(PRE_STORE, {"title": "t"}).step("a", AskUser("sure?")).step("b", Modify({"title": "u"}))
    assert out.outcome() == Ask("a", AskUser("sure?"), {"title": "u"})


def test_deny_on_an_observe_only_event_is_recorded_not_acted_on() -> None:
    chain = Chain.start(POST_STORE, {}).step("a", Deny("x", "r")).step("b", AskUser("p"))
    assert not chain.done and isinstance(chain.outcome(), Proceed) and len(chain.warnings) == 2


def test_deny_on_post_recall_refuses() -> None:
    assert Chain.start(POST_RECALL, {}).step("dlp", Deny("x", "r")).done


def test_chain_order_is_priority_descending_then_file_order() -> None:
    class H:
        def __init__(self, name: str, priority: int) -> None:
            self.name, self.priority = name, priority

    hooks = [H("a", 0), H("b", 5), H("c", 0), H("d", 10)]
    assert [h.name for h in dec.ordered(hooks)] == ["d", "b", "a", "c"]


def test_failure_is_allow_when_open_and_a_coded_deny_when_closed() -> None:
    assert dec.on_failure("h", dec.FailMode.OPEN, dec.Failure.TIMEOUT, "late") == ALLOW
    d = dec.on_failure("h", dec.FailMode.CLOSED, dec.Failure.CRASHED, "exited with status 3")
    assert isinstance(d, Deny) and d.code == "hook_crashed" and "exited with status 3" in d.reason


def test_every_event_has_a_class_deadline_and_post_events_take_no_modify() -> None:
    assert len(SPECS) == len(HookEvent) >= 19
    assert {c: c.deadline_ms for c in EventClass} == {"write": 5000, "read": 2000, "index": 1000,
                                                      "transcript": 5000}
    for spec in SPECS.values():
        assert spec.payload
        if spec.phase is not Phase.PRE:
            assert not spec.modifiable
        if spec.phase is Phase.PRE:
            assert spec.refusable


def test_request_json_carries_bytes_as_hex_and_mappings_as_objects() -> None:
    from types import MappingProxyType

    from node.hooks.executor import to_json
    assert to_json({"sig": b"\x01\xff", "m": MappingProxyType({"a": 1}), "s": {"b", "a"}}) == \
        b'{"sig":"01ff","m":{"a":1},"s":["a","b"]}'
