"""Hook decisions and the chain that folds them: pure values, no I/O.

A hook answers ``Allow``, ``Modify(delta)``, ``Deny(code, reason)`` or ``AskUser(prompt, options, default)``.
``parse_decision`` turns a hook's JSON answer into one of them or raises ``DecisionError`` (malformed);
``Chain`` folds the answers of the hooks registered for one event, in priority order: deltas apply in
order, the first Deny ends the chain, an AskUser is kept and loses to any later Deny.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from node.hooks.errors import HookCode, HookError
from node.hooks.events import EventSpec, FieldKind, Phase

# Deny codes travel as error codes (MCP "[code] ...", CLI, A2A "rejected:<code>"): snake_case, short.
CODE_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_REASON_CHARS = 1_000
MAX_PROMPT_CHARS = 2_000
MAX_OPTIONS = 16
MAX_OPTION_CHARS = 64
# Most links one pre_store hook may propose for the new memory.
MAX_PROPOSED_LINKS = 32
# Most memories one pre_transcript_store Modify may propose.
MAX_PROPOSED_MEMORIES = 32
DEFAULT_OPTIONS = ("approve", "deny")


class DecisionError(HookError, ValueError):
    """A hook's answer that is not a valid decision; the message says what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(HookCode.DECISION_INVALID, message)


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Modify:
    """Set fields of the operation (a shallow merge into the payload; ``links`` accumulate)."""

    delta: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Deny:
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class AskUser:
    prompt: str
    options: tuple[str, ...] = DEFAULT_OPTIONS
    default: str = "deny"


Decision = Allow | Modify | Deny | AskUser
ALLOW = Allow()


class FailMode(StrEnum):
    OPEN = "open"      # a hook that fails is taken as Allow
    CLOSED = "closed"  # a hook that fails refuses the operation


class Failure(StrEnum):
    """How a hook failed to answer."""

    TIMEOUT = "timeout"
    CRASHED = "crashed"
    MALFORMED = "malformed"
    UNAVAILABLE = "unavailable"


# The Deny code that stands in for a failed fail-closed hook.
FAIL_CLOSED_CODE = {Failure.TIMEOUT: HookCode.HOOK_TIMEOUT, Failure.CRASHED: HookCode.HOOK_CRASHED,
                    Failure.MALFORMED: HookCode.HOOK_MALFORMED, Failure.UNAVAILABLE: HookCode.HOOK_UNAVAILABLE}


def on_failure(hook: str, fail_mode: FailMode, failure: Failure, detail: str) -> Decision:
    """The decision standing in for a hook that did not answer properly."""
    if fail_mode is FailMode.OPEN:
        return ALLOW
    return Deny(FAIL_CLOSED_CODE[failure], f"hook {hook!r} {detail} and its fail_mode is closed")


# ---- parsing --------------------------------------------------------------------------------

def parse_decision(obj: Any, spec: EventSpec) -> Decision:
    """Strictly parse a hook's answer (decoded JSON) for an event; raises DecisionError."""
    if not isinstance(obj, dict):
        raise DecisionError(f"a decision must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("decision")
    match kind:
        case "allow":
            _exact(obj, {"decision"})
            return ALLOW
        case "modify":
            return _parse_modify(obj, spec)
        case "deny":
            return _parse_deny(obj)
        case "ask_user":
            return _parse_ask(obj)
    raise DecisionError(f"'decision' must be allow | modify | deny | ask_user, got {kind!r}")


def _parse_modify(obj: dict[str, Any], spec: EventSpec) -> Modify:
    _exact(obj, {"decision", "delta"})
    delta = obj.get("delta")
    if not isinstance(delta, dict) or not delta:
        raise DecisionError("modify needs a non-empty object 'delta'")
    # A Modify where none is accepted is well-formed; the chain ignores it with a warning.
    if spec.phase is Phase.PRE and spec.modifiable:
        _check_delta(delta, spec)
    return Modify(MappingProxyType(dict(delta)))


def _parse_deny(obj: dict[str, Any]) -> Deny:
    _exact(obj, {"decision", "code", "reason"}, optional=frozenset({"reason"}))
    code = obj.get("code")
    if not isinstance(code, str) or not CODE_RE.match(code):
        raise DecisionError(f"deny 'code' must be snake_case (a-z, 0-9, _; at most 64), got {code!r}")
    reason = _text(obj.get("reason", ""), "reason", MAX_REASON_CHARS, allow_empty=True)
    return Deny(code, reason or "no reason given")


def _parse_ask(obj: dict[str, Any]) -> AskUser:
    _exact(obj, {"decision", "prompt", "options", "default"}, optional=frozenset({"options", "default"}))
    prompt = _text(obj.get("prompt"), "prompt", MAX_PROMPT_CHARS, allow_empty=False)
    raw = obj.get("options", list(DEFAULT_OPTIONS))
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_OPTIONS:
        raise DecisionError(f"ask_user 'options' must be a list of 1..{MAX_OPTIONS} strings")
    options = tuple(_text(o, "option", MAX_OPTION_CHARS, allow_empty=False) for o in raw)
    if len(set(options)) != len(options):
        raise DecisionError("ask_user 'options' must not repeat")
    default = obj.get("default", "deny" if "deny" in options else options[0])
    if default not in options:
        raise DecisionError(f"ask_user 'default' {default!r} is not one of the options")
    return AskUser(prompt, options, default)


def decision_to_wire(d: Decision) -> dict[str, Any]:
    """The JSON form ``parse_decision`` reads (what a hook prints)."""
    match d:
        case Allow():
            return {"decision": "allow"}
        case Modify(delta):
            return {"decision": "modify", "delta": dict(delta)}
        case Deny(code, reason):
            return {"decision": "deny", "code": code, "reason": reason}
        case AskUser(prompt, options, default):
            return {"decision": "ask_user", "prompt": prompt, "options": list(options), "default": default}


def _exact(obj: dict[str, Any], allowed: set[str], optional: frozenset[str] = frozenset()) -> None:
    extra = set(obj) - allowed
    if extra:
        raise DecisionError(f"unknown key(s) in a {obj.get('decision')} decision: {sorted(extra)}")
    missing = allowed - optional - set(obj)
    if missing:
        raise DecisionError(f"{obj.get('decision')} decision lacks {sorted(missing)}")


def _text(value: Any, name: str, max_chars: int, *, allow_empty: bool) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise DecisionError(f"{name} must be a {'' if allow_empty else 'non-empty '}string, got {value!r}")
    if len(value) > max_chars:
        raise DecisionError(f"{name} is {len(value)} chars, the limit is {max_chars}")
    return value


def _check_delta(delta: dict[str, Any], spec: EventSpec) -> None:
    for key, value in delta.items():
        kind = spec.modifiable.get(key)
        if kind is None:
            raise DecisionError(f"{spec.event} cannot modify {key!r}; it may modify {sorted(spec.modifiable)}")
        if not _fits(kind, value):
            raise DecisionError(f"modify {key!r}: {value!r} is not a valid {kind}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fits(kind: FieldKind, v: Any) -> bool:
    match kind:
        case FieldKind.TEXT:
            return isinstance(v, str)
        case FieldKind.TEXT_OR_NULL:
            return v is None or isinstance(v, str)
        case FieldKind.TAGS:
            return v is None or (isinstance(v, list) and all(isinstance(t, str) for t in v))
        case FieldKind.INT:
            return v is None or _is_int(v)
        case FieldKind.NUMBER:
            return v is None or _is_number(v)
        case FieldKind.LINKS:
            return isinstance(v, list) and len(v) <= MAX_PROPOSED_LINKS and all(map(_is_link_proposal, v))
        case FieldKind.MEMORIES:
            return isinstance(v, list) and len(v) <= MAX_PROPOSED_MEMORIES and all(map(_is_memory_proposal, v))


def _is_link_proposal(p: Any) -> bool:
    if not isinstance(p, dict) or not {"dst_id", "relation"} <= set(p) <= {"dst_id", "relation", "confidence"}:
        return False
    conf = p.get("confidence", 1.0)
    return (isinstance(p["dst_id"], str) and bool(p["dst_id"]) and isinstance(p["relation"], str)
            and bool(p["relation"].strip()) and _is_number(conf) and 0.0 <= conf <= 1.0)


def _is_memory_proposal(p: Any) -> bool:
    """{content, start, end[, title]}: a memory drawn from code points [start, end) of the transcript."""
    if not isinstance(p, dict) or not {"content", "start", "end"} <= set(p) <= {"content", "start", "end", "title"}:
        return False
    return (isinstance(p["content"], str) and bool(p["content"].strip()) and isinstance(p.get("title", ""), str)
            and _is_int(p["start"]) and _is_int(p["end"]) and 0 <= p["start"] < p["end"])


# ---- the chain ------------------------------------------------------------------------------

class Ranked(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> int: ...


H = TypeVar("H", bound=Ranked)


def ordered(hooks: Iterable[H]) -> tuple[H, ...]:
    """Chain order: priority descending; equal priorities keep their order in the config file."""
    return tuple(sorted(hooks, key=lambda h: -h.priority))


@dataclass(frozen=True, slots=True)
class Proceed:
    """Go ahead with ``payload`` (deltas applied); ``modified_by`` names the hooks whose Modify applied."""

    payload: Mapping[str, Any]
    modified_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refuse:
    hook: str
    deny: Deny


@dataclass(frozen=True, slots=True)
class Ask:
    hook: str
    ask: AskUser
    payload: Mapping[str, Any]


Outcome = Proceed | Refuse | Ask


@dataclass(frozen=True, slots=True)
class Chain:
    """The fold of one event's hook answers so far. Start with ``Chain.start``; feed ``step``."""

    spec: EventSpec
    payload: Mapping[str, Any]
    modified_by: tuple[str, ...] = ()
    denied: Refuse | None = None
    asked: Ask | None = None
    # Answers that were not acted upon, one sentence each (the pipeline logs them as warnings).
    warnings: tuple[str, ...] = field(default=())

    @classmethod
    def start(cls, spec: EventSpec, payload: Mapping[str, Any]) -> Chain:
        return cls(spec, MappingProxyType(dict(payload)))

    @property
    def done(self) -> bool:
        """True once a Deny stops the chain: later hooks are not run."""
        return self.denied is not None

    def step(self, hook: str, decision: Decision) -> Chain:
        """Fold one hook's answer."""
        spec = self.spec
        match decision:
            case Allow():
                return self
            case Modify(delta):
                if spec.phase is not Phase.PRE or not spec.modifiable:
                    return self._warn(f"hook {hook!r} answered modify on {spec.event}, which accepts no "
                                      "modify; ignored")
                return replace(self, payload=MappingProxyType(_merge(self.payload, delta)),
                               modified_by=(*self.modified_by, hook))
            case Deny():
                if not spec.refusable:
                    return self._warn(f"hook {hook!r} denied {spec.event} ({decision.code}); the event "
                                      "cannot be refused, recorded only")
                return replace(self, denied=Refuse(hook, decision))
            case AskUser():
                if not spec.refusable:
                    return self._warn(f"hook {hook!r} asked the user on {spec.event}, which cannot wait "
                                      "for approval; recorded only")
                if self.asked is not None:
                    return self
                return replace(self, asked=Ask(hook, decision, self.payload))

    def outcome(self) -> Outcome:
        """Deny beats AskUser beats Allow; the payload carries every applied delta."""
        if self.denied is not None:
            return self.denied
        if self.asked is not None:
            return replace(self.asked, payload=self.payload)
        return Proceed(self.payload, self.modified_by)

    def _warn(self, sentence: str) -> Chain:
        return replace(self, warnings=(*self.warnings, sentence))


def _merge(payload: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(payload)
    for key, value in delta.items():
        if key == "links":
            # Proposals from several hooks add up; the same (dst, relation) is proposed once.
            links = list(merged.get("links", ()))
            seen = {(p["dst_id"], p["relation"]) for p in links}
            for p in value:
                if (p["dst_id"], p["relation"]) not in seen:
                    seen.add((p["dst_id"], p["relation"]))
                    links.append(p)
            merged["links"] = links
        else:
            merged[key] = value
    return merged


class HookRefused(HookError):
    """A hook chain refused the operation: ``code`` is the denying hook's own code."""

    def __init__(self, hook: str, event: str, deny: Deny) -> None:
        super().__init__(deny.code, f"hook {hook!r} denied {event}: {deny.reason}")
        self.hook = hook
        self.event = event
        self.deny = deny


class ApprovalRequired(HookError):
    """A hook asked for a person's decision. Until approvals are routed, the operation is refused."""

    def __init__(self, hook: str, event: str, ask: AskUser, payload: dict[str, Any]) -> None:
        super().__init__(HookCode.APPROVAL_REQUIRED,
                         f"hook {hook!r} asks for approval of {event}: {ask.prompt} "
                         f"(options: {', '.join(ask.options)}; default: {ask.default})")
        self.hook = hook
        self.event = event
        self.ask = ask
        # The operation as it would run once approved (Modify deltas of earlier hooks applied).
        self.payload = payload
