"""Permission rules and the decision they make: pure values, no I/O.

A rule names an agent (or ``*``), a namespace (or ``*``), the operations it covers and an action
(allow | deny | ask). Namespaces are a tree (``team/project/sub``): a rule on ``team`` also covers
``team/project`` and below. A rule with ``inherit = false`` breaks the inheritance where it stands: for
the requests it matches at or below its namespace, rules on the ancestors above it (and ``*``) are not
consulted, as an ACL that disables inheritance. ``decide(index, request)`` evaluates deny
first: any matching deny refuses, else any matching ask asks, else any matching allow allows, else the
rule set's default applies. The answer is the hook pipeline's ``Decision`` (Allow | Deny | AskUser).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from base.errors import ProjectError
from node.hooks.decision import ALLOW, AskUser, Decision, Deny

ANY = "*"
SEP = "/"
# Decisions remembered per rule index (agent, namespace, operation); the index is immutable, so they stay true.
DECISION_CACHE_MAX = 4096
PERMISSION_DENIED = "permission_denied"
# The code of a PermissionRuleError (the CLI and the rules file answer it as bad_input / config_invalid).
BAD_RULE = "bad_rule"


class PermissionRuleError(ProjectError, ValueError):
    """A rule or rule file that cannot be used; the message names the key."""

    def __init__(self, message: str) -> None:
        super().__init__(BAD_RULE, message)


class Action(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"
    # An approval remembered forever: answers an ``ask`` for exactly its namespace, never a deny.
    APPROVED = "approved"


class Operation(StrEnum):
    STORE = "store"
    UPDATE = "update"
    LINK = "link"
    RECALL = "recall"
    GET = "get"
    LIST = "list"
    VERIFY = "verify"
    REPLAY = "replay"


class Mode(StrEnum):
    OFF = "off"            # rules are not evaluated
    ADVISORY = "advisory"  # evaluated and logged; nothing is blocked
    ENFORCE = "enforce"    # deny refuses, ask parks for approval


@dataclass(frozen=True, slots=True)
class Rule:
    agent: str
    namespace: str
    operations: frozenset[Operation]
    action: Action
    inherit: bool = True
    # Where the rule came from, for messages: "permissions.toml rules[3]" or "runtime #7".
    origin: str = ""

    def summary(self) -> str:
        ops = ",".join(sorted(self.operations)) if len(self.operations) < len(Operation) else ANY
        barrier = "" if self.inherit else ", inherit=false"
        return f"{self.action} {ops} on {self.namespace} for {self.agent} ({self.origin}{barrier})"


@dataclass(frozen=True, slots=True)
class Request:
    agent: str
    namespace: str
    operation: Operation


def ancestors(namespace: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b", "a/b/c"]`` (the namespace itself last)."""
    parts = namespace.split(SEP)
    return [SEP.join(parts[:i]) for i in range(1, len(parts) + 1)]


class RuleIndex:
    """Rules bucketed by namespace so a decision looks at the request's ancestors only (O(depth))."""

    def __init__(self, rules: Sequence[Rule], default: Action = Action.ALLOW) -> None:
        self.rules = tuple(rules)
        self.default = default
        self._by_ns: dict[str, list[Rule]] = {}
        for r in self.rules:
            self._by_ns.setdefault(r.namespace, []).append(r)
        self.memo: dict[Request, tuple[Decision, Rule | None]] = {}

    def __len__(self) -> int:
        return len(self.rules)

    def matching(self, req: Request) -> list[Rule]:
        """Rules that apply to ``req``, from its own namespace up to ``*``; an ``inherit = false`` rule
        among them ends the walk after its level."""
        found: list[Rule] = []
        for ns in (*reversed(ancestors(req.namespace)), ANY):
            barrier = False
            for r in self._by_ns.get(ns, ()):
                if r.action is Action.APPROVED and ns != req.namespace:
                    continue
                if r.agent in (ANY, req.agent) and req.operation in r.operations:
                    found.append(r)
                    barrier = barrier or not r.inherit
            if barrier:
                break
        return found


def decide(index: RuleIndex, req: Request) -> tuple[Decision, Rule | None]:
    """Deny first, then ask, then allow, else the default; returns the decision and the rule that made it."""
    known = index.memo.get(req)
    if known is None:
        known = decide_uncached(index, req)
        if len(index.memo) >= DECISION_CACHE_MAX:
            index.memo.clear()
        index.memo[req] = known
    return known


def decide_uncached(index: RuleIndex, req: Request) -> tuple[Decision, Rule | None]:
    """``decide`` without the memo: the rule walk itself."""
    asked: Rule | None = None
    allowed: Rule | None = None
    approved: Rule | None = None
    for r in index.matching(req):
        if r.action is Action.DENY:
            return Deny(PERMISSION_DENIED, _refusal(req, r)), r
        if r.action is Action.ASK and asked is None:
            asked = r
        elif r.action is Action.ALLOW and allowed is None:
            allowed = r
        elif r.action is Action.APPROVED and approved is None:
            approved = r
    if asked is not None:
        if approved is not None:
            return ALLOW, approved
        return AskUser(f"{req.agent} wants to {req.operation} in namespace {req.namespace!r} "
                       f"(rule: {asked.summary()})"), asked
    if allowed is not None:
        return ALLOW, allowed
    return _default(index, req), None


def _default(index: RuleIndex, req: Request) -> Decision:
    if index.default is Action.DENY:
        return Deny(PERMISSION_DENIED, f"{req.agent} may not {req.operation} in namespace {req.namespace!r}: "
                                       "no rule allows it and the default is deny")
    if index.default is Action.ASK:
        return AskUser(f"{req.agent} wants to {req.operation} in namespace {req.namespace!r} (no rule; "
                       "the default is ask)")
    return ALLOW


def _refusal(req: Request, r: Rule) -> str:
    return f"{req.agent} may not {req.operation} in namespace {req.namespace!r} (rule: {r.summary()})"


# ---- parsing --------------------------------------------------------------------------------

_RULE_KEYS = {"agent", "namespace", "operations", "action", "inherit"}


def parse_rule(raw: Any, where: str) -> Rule:
    """One rule table; ``where`` names it in errors (``permissions.toml: rules[2]``)."""
    if not isinstance(raw, Mapping):
        raise PermissionRuleError(f"{where} must be a table, got {raw!r}")
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        raise PermissionRuleError(f"{where} has unknown key(s) {unknown}; known: {sorted(_RULE_KEYS)}")
    for key in ("agent", "namespace", "action"):
        if key not in raw:
            raise PermissionRuleError(f"{where}.{key} is required")
    agent = _name(raw["agent"], f"{where}.agent")
    namespace = _namespace(raw["namespace"], f"{where}.namespace")
    try:
        action = Action(raw["action"])
    except (ValueError, TypeError):
        raise PermissionRuleError(f"{where}.action must be allow | deny | ask | approved, "
                                  f"got {raw['action']!r}") from None
    operations = _operations(raw.get("operations", [ANY]), f"{where}.operations")
    inherit = raw.get("inherit", True)
    if not isinstance(inherit, bool):
        raise PermissionRuleError(f"{where}.inherit must be true or false, got {inherit!r}")
    return Rule(agent, namespace, operations, action, inherit, where)


def _operations(ops: Any, key: str) -> frozenset[Operation]:
    if not isinstance(ops, list) or not ops or not all(isinstance(o, str) for o in ops):
        raise PermissionRuleError(f"{key} must be a non-empty list of strings, got {ops!r}")
    if ANY in ops:
        return frozenset(Operation)
    try:
        return frozenset(Operation(o) for o in ops)
    except ValueError:
        bad = next(o for o in ops if o not in set(Operation))
        raise PermissionRuleError(f"{key}: {bad!r} is not one of {', '.join(Operation)} or *") from None


def parse_rules(items: Any, where: str) -> tuple[Rule, ...]:
    """A list of rule tables, refused when two rules give one (agent, namespace, operation) two actions."""
    if not isinstance(items, list):
        raise PermissionRuleError(f"{where} must be an array of tables ([[rules]]), got {items!r}")
    rules = tuple(parse_rule(r, f"{where}[{i}]") for i, r in enumerate(items))
    check_contradictions(rules)
    return rules


def check_contradictions(rules: Iterable[Rule]) -> None:
    seen: dict[tuple[str, str, bool, Operation], Rule] = {}
    for r in rules:
        if r.action is Action.APPROVED:  # answers an ask, so it contradicts nothing
            continue
        for op in r.operations:
            key = (r.agent, r.namespace, r.inherit, op)
            other = seen.get(key)
            if other is not None and other.action is not r.action:
                raise PermissionRuleError(f"{r.origin} contradicts {other.origin}: {other.action} vs {r.action} "
                                          f"for agent {r.agent!r}, {op} on {r.namespace!r}")
            seen.setdefault(key, r)


def _name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise PermissionRuleError(f"{key} must be a non-empty string (at most 256 chars) or '*', got {value!r}")
    return value


def _namespace(value: Any, key: str) -> str:
    ns = _name(value, key)
    if ns != ANY and any(not part for part in ns.split(SEP)):
        raise PermissionRuleError(f"{key} must be '*' or a path like 'team/project' with no empty "
                                  f"segment, got {value!r}")
    return ns


def rule_summary(rules: Sequence[Rule]) -> list[str]:
    """One line per rule, in evaluation order (deny, ask, allow; file order within each)."""
    order = {Action.DENY: 0, Action.ASK: 1, Action.APPROVED: 2, Action.ALLOW: 3}
    return [r.summary() for r in sorted(rules, key=lambda r: order[r.action])]
