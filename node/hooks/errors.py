"""The hooks room's error family: one base with a stable ``code`` and a human sentence."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.hooks.decision import AskUser, Deny


class HookCode(StrEnum):
    CONFIG_INVALID = "config_invalid"
    CONFIG_UNKNOWN_KEY = "config_unknown_key"
    CONFIG_MALFORMED = "config_malformed"
    APPROVAL_REQUIRED = "approval_required"
    HOOK_TIMEOUT = "hook_timeout"
    HOOK_CRASHED = "hook_crashed"
    HOOK_MALFORMED = "hook_malformed"
    HOOK_UNAVAILABLE = "hook_unavailable"


class HookError(Exception):
    """Anything the hook pipeline refuses or cannot do; ``code`` is stable, ``message`` names the cause."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
