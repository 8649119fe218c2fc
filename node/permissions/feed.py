"""Approval events from every process that shares the store, for the approval API's event stream.

An ask is parked, and decided, in whichever process runs the call: the node, an ``ai-memory mcp`` of its own,
or a CLI command (``ai-memory store`` that a rule parks, ``ai-memory approvals approve``). Hooks and webhooks
hear it there (webhook deliveries are rows the node sends), but an SSE stream lives in the node's memory. So
the node reads the news from the store itself: ``ApprovalFeed.poll`` lists the actions whose expiry is recent
(an index range on ``pending_actions``: every pending action and every one decided lately, as a decision comes
before the expiry and the sweeper's within its interval after it) and announces each action's
``approval.requested`` once and its ``approval.decided`` once, remembering which it announced for as long as
the action can still show up in that range.

Why this way: the rows are already the truth and the only shared thing (no new daemon, table or migration, and
nothing for the other processes to do); each action has exactly one request and one decision, so an event is
named by (action, kind) and announced once, whichever process, clock or commit order made it. The node's own
decisions take the same path (they wake the poll at once), so the stream has one source and never doubles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from node.permissions.approvals import action_dict
from storage import approvals as rows
from storage.approvals import ActionRow, Mark
from storage.db import Database

# How often a followed feed reads the store (the node's own decisions wake it at once).
FEED_POLL_S = 0.5
# Most actions one poll reads (recent ones first): more than that expiring within the window is a flood.
FEED_ROWS_MAX = 10_000
# An approved action's row is claimed in its write and given its result just after: the decided event waits this
# long for the result before it goes out without one (the approving process died in between).
RESULT_WAIT_MS = 2_000
# The window is at least this, and twice the sweeper's interval: an expiry is announced once it is swept.
LOOKBACK_MIN_MS = 60_000

Event = tuple[str, dict[str, Any]]

log = logging.getLogger("node.approvals.feed")


class ApprovalFeed:
    """The approval events of every process, read from the store; ``rebase`` when it starts being followed (what
    is there then is old news), then ``poll`` for what is new since."""

    def __init__(self, db: Database, clock: Callable[[], int], sweep_interval_s: float) -> None:
        self.db = db
        self.clock = clock
        self.lookback_ms = max(LOOKBACK_MIN_MS, int(2 * sweep_interval_s * 1000))
        # Announced actions -> their expiry (forgotten once the range no longer reaches them).
        self._requested: dict[str, int] = {}
        self._decided: dict[str, int] = {}
        self._flooded = False

    async def rebase(self) -> None:
        """Take everything in the store now as announced."""
        marks = await self.db.read(rows.recent, self.clock() - self.lookback_ms, FEED_ROWS_MAX)
        self._requested = {m.id: m.expires_at for m in marks}
        self._decided = {m.id: m.expires_at for m in marks if m.status != "pending"}

    async def poll(self) -> list[Event]:
        """The events since the last poll (or rebase), oldest first: each action's request once, its decision once."""
        now = self.clock()
        since = now - self.lookback_ms
        marks = await self.db.read(rows.recent, since, FEED_ROWS_MAX)
        flooded = len(marks) >= FEED_ROWS_MAX
        if flooded and not self._flooded:  # once per flood: the actions expiring first are left out of the read
            log.warning("approval_feed_flooded", extra={"ev": {"rows": FEED_ROWS_MAX, "window_ms": self.lookback_ms}})
        self._flooded = flooded
        asked = [m for m in marks if m.id not in self._requested]
        decided = [m for m in marks if m.status != "pending" and m.id not in self._decided and _settled(m, now)]
        ids = sorted({m.id for m in asked} | {m.id for m in decided})
        actions = {a.id: a for a in await self.db.read(rows.get_many, ids)} if ids else {}
        timed: list[tuple[int, int, Event]] = []
        for m in asked:
            if (a := actions.get(m.id)) is not None:
                timed.append((a.created_at, 0, ("approval.requested", _as_requested(a))))
                self._requested[a.id] = a.expires_at
        for m in decided:
            if (a := actions.get(m.id)) is not None and a.status != "pending":
                timed.append((a.decided_at or now, 1, ("approval.decided", action_dict(a))))
                self._decided[a.id] = a.expires_at
        self._forget(since)
        return [event for _, _, event in sorted(timed, key=lambda t: (t[0], t[1]))]

    def _forget(self, since: int) -> None:
        for seen in (self._requested, self._decided):
            for action_id in [i for i, expires_at in seen.items() if expires_at < since]:
                del seen[action_id]


def _settled(m: Mark, now: int) -> bool:
    """Decided for the stream's purpose: an applied action once its result is there (or it waited long enough)."""
    if m.status != "applied" or m.has_result:
        return True
    return m.decided_at is None or now - m.decided_at >= RESULT_WAIT_MS


def _as_requested(a: ActionRow) -> dict[str, Any]:
    """The action as it was when it was parked (it may have been decided before this poll saw it)."""
    return {**action_dict(a), "status": "pending", "decided_at": None, "decided_by": None, "result": None}
