"""Operator hooks: programs attached to node events that Allow, Modify, Deny or AskUser (docs/hooks.md).

The service sees only ``Hooks`` (a Protocol) and ``HookEvent``; ``node.hooks.pipeline.HookPipeline`` is
the implementation a node opens from ``hooks.toml``, ``NoHooks`` the stand-in where none is wanted.
"""

from __future__ import annotations

from typing import Any, Protocol

from node.hooks.decision import Allow, ApprovalRequired, AskUser, Decision, Deny, HookRefused, Modify
from node.hooks.errors import HookCode, HookError
from node.hooks.events import SPECS, EventClass, HookEvent

__all__ = ["Allow", "ApprovalRequired", "AskUser", "Decision", "Deny", "EventClass", "HookCode", "HookError",
           "HookEvent", "HookRefused", "Hooks", "Modify", "NoHooks", "SPECS"]


class Hooks(Protocol):
    async def fire(self, event: HookEvent, payload: dict[str, Any]) -> dict[str, Any]:
        """Run the event's hooks; the payload to go ahead with, or HookRefused / ApprovalRequired."""
        ...

    def notify(self, event: HookEvent, payload: dict[str, Any]) -> None:
        """Fire from synchronous code without waiting (on_* events)."""
        ...

    def attached(self, event: HookEvent) -> bool:
        """True when ``event`` has hooks to run (a fire may then wait on them): a caller with many payloads
        fires them concurrently then, and one after another (no task each) otherwise."""
        ...

    def snapshot(self) -> dict[str, Any]:
        ...

    async def close(self) -> None:
        ...


class NoHooks:
    """No hooks at all: every fire goes ahead unchanged."""

    async def fire(self, event: HookEvent, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def notify(self, event: HookEvent, payload: dict[str, Any]) -> None:
        return None

    def attached(self, event: HookEvent) -> bool:
        return False

    def snapshot(self) -> dict[str, Any]:
        return {"config": None, "by_event": {}, "hooks": []}

    async def close(self) -> None:
        return None
