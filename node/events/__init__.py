"""Event delivery: what a node tells the world after a write (approval requested/decided, memory stored,
link attested). The writers see only ``EventSink``; ``node.events.webhooks.Webhooks`` is the one that
queues events for subscribers, ``NoEvents`` the one that drops them (a store built without subscriptions).
"""

from __future__ import annotations

from typing import Any, Protocol


class EventSink(Protocol):
    """Takes one event after its write committed; ``data`` is the event's JSON-ready body."""

    async def publish(self, event: str, data: dict[str, Any]) -> None: ...


class NoEvents:
    """The sink that publishes nothing."""

    async def publish(self, event: str, data: dict[str, Any]) -> None:
        return None
