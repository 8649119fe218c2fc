"""The hooks room's error family: one base with a stable ``code`` and a human sentence."""

from __future__ import annotations

from enum import StrEnum

from base.errors import ProjectError


class HookCode(StrEnum):
    CONFIG_INVALID = "config_invalid"
    CONFIG_UNKNOWN_KEY = "config_unknown_key"
    CONFIG_MALFORMED = "config_malformed"
    APPROVAL_REQUIRED = "approval_required"
    HOOK_TIMEOUT = "hook_timeout"
    HOOK_CRASHED = "hook_crashed"
    HOOK_MALFORMED = "hook_malformed"
    HOOK_UNAVAILABLE = "hook_unavailable"
    DECISION_INVALID = "decision_invalid"


class HookError(ProjectError):
    """Anything the hook pipeline refuses or cannot do; ``code`` is stable (a HookCode, or the code a hook's
    deny names), ``message`` names the cause."""
