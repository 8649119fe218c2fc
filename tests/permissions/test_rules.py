"""The permission decision as plain values: rules + request -> Decision."""

from __future__ import annotations

import pytest

from node.hooks.decision import ALLOW, AskUser, Deny
from node.permissions.rules import (
    Action,
    Operation,
    PermissionRuleError,
    Request,
    RuleIndex,
    ancestors,
    decide,
    parse_rules,
    rule_summary,
)

STORE = Operation.STORE


def index(*rules: dict, default: Action = Action.ALLOW) -> RuleIndex:
    return RuleIndex(parse_rules(list(rules), "rules"), default)


def rule(agent: str, ns: str, action: str, ops: tuple[str, ...] = ("store",), **kw: object) -> dict:
    return {"agent": agent, "namespace": ns, "action": action, "operations": list(ops), **kw}


def test_ancestors_run_from_the_root_to_the_namespace() -> None:
    assert ancestors("team/project/sub") == ["team", "team/project", "team/project/sub"]


def test_a_parent_deny_blocks_a_child_write() -> None:
    ix = index(rule("*", "team", "deny"))
    d, r = decide(ix, Request("ai:a", "team/project/sub", STORE))
    assert isinstance(d, Deny) and d.code == "permission_denied" and r is not None and r.namespace == "team"


def test_inherit_false_on_the_child_stops_the_parent_deny() -> None:
    ix = index(rule("*", "team", "deny"), rule("*", "team/open", "allow", inherit=False))
    assert decide(ix, Request("ai:a", "team/open", STORE))[0] is ALLOW
    assert decide(ix, Request("ai:a", "team/open/deeper", STORE))[0] is ALLOW
    assert isinstance(decide(ix, Request("ai:a", "team/closed", STORE))[0], Deny)


def test_inherited_rules_still_apply_below_a_child_that_inherits() -> None:
    ix = index(rule("*", "team", "deny"), rule("*", "team/open", "allow"))
    assert isinstance(decide(ix, Request("ai:a", "team/open", STORE))[0], Deny)  # deny first


def test_deny_beats_ask_beats_allow() -> None:
    ix = index(rule("*", "x", "allow"), rule("ai:a", "x", "ask"))
    assert isinstance(decide(ix, Request("ai:a", "x", STORE))[0], AskUser)
    assert decide(ix, Request("ai:b", "x", STORE))[0] is ALLOW
    ix = index(rule("*", "x", "ask"), rule("ai:a", "x/y", "deny"))
    assert isinstance(decide(ix, Request("ai:a", "x/y", STORE))[0], Deny)


def test_rules_match_the_agent_and_the_operation() -> None:
    ix = index(rule("ai:a", "*", "deny", ("link", "update")))
    assert decide(ix, Request("ai:a", "x", STORE))[0] is ALLOW
    assert isinstance(decide(ix, Request("ai:a", "x", Operation.LINK))[0], Deny)
    assert decide(ix, Request("ai:b", "x", Operation.LINK))[0] is ALLOW


def test_sibling_namespaces_with_a_shared_prefix_are_not_ancestors() -> None:
    ix = index(rule("*", "team", "deny"))
    assert decide(ix, Request("ai:a", "teammates", STORE))[0] is ALLOW


def test_the_default_applies_when_no_rule_matches() -> None:
    assert isinstance(decide(index(default=Action.DENY), Request("ai:a", "x", STORE))[0], Deny)
    assert isinstance(decide(index(default=Action.ASK), Request("ai:a", "x", STORE))[0], AskUser)
    assert decide(index(), Request("ai:a", "x", STORE))[0] is ALLOW


def test_contradicting_rules_are_refused_naming_both() -> None:
    with pytest.raises(PermissionRuleError, match=r"rules\[1\] contradicts rules\[0\]: allow vs deny"):
        parse_rules([rule("*", "x", "allow"), rule("*", "x", "deny", ("store", "link"))], "rules")


@pytest.mark.parametrize(("bad", "message"), [
    ({"agent": "*", "namespace": "x"}, r"rules\[0\]\.action is required"),
    ({**rule("*", "x", "allow"), "action": "maybe"}, r"rules\[0\]\.action must be allow \| deny \| ask"),
    ({**rule("*", "x", "allow"), "operations": ["delete"]}, r"rules\[0\]\.operations: 'delete' is not one of"),
    ({**rule("*", "x", "allow"), "operations": []}, r"rules\[0\]\.operations must be a non-empty list"),
    ({**rule("*", "a//b", "allow")}, r"rules\[0\]\.namespace must be"),
    ({**rule("*", "x", "allow"), "inherit": "no"}, r"rules\[0\]\.inherit must be true or false"),
    ({**rule("*", "x", "allow"), "agnet": "x"}, r"rules\[0\] has unknown key\(s\) \['agnet'\]"),
])
def test_bad_rules_are_refused_naming_the_key(bad: dict, message: str) -> None:
    with pytest.raises(PermissionRuleError, match=message):
        parse_rules([bad], "rules")


def test_rule_summary_is_in_evaluation_order_one_line_each() -> None:
    rules = parse_rules([rule("*", "x", "allow"), rule("ai:a", "y", "ask"),
                         rule("*", "z", "deny", ("*",), inherit=False)], "rules")
    assert rule_summary(rules) == ["deny * on z for * (rules[2], inherit=false)",
                                   "ask store on y for ai:a (rules[1])", "allow store on x for * (rules[0])"]


def test_a_thousand_rules_decide_by_the_request_ancestors_only() -> None:
    rules = [rule(f"ai:agent-{i}", f"ns{i}/sub", "deny") for i in range(1000)]
    ix = index(*rules, rule("ai:agent-7", "ns7", "allow", ("link",)))
    assert isinstance(decide(ix, Request("ai:agent-7", "ns7/sub/deep", STORE))[0], Deny)
    assert decide(ix, Request("ai:agent-8", "ns7/sub", STORE))[0] is ALLOW
    assert len(ix.matching(Request("ai:agent-7", "ns7/sub", STORE))) == 1
