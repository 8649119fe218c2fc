"""Webhook subscriptions: events (approval requested/decided, memory stored, link made) queued for
subscribed URLs in the database, POSTed by the node (``node.events.delivery``: the HTTP client lives there, so
a process that only queues, the CLI, never imports it), each delivery HMAC-signed, retried on
``subscriptions.retry_delays_s``, then dead-lettered; a dead delivery can be replayed.

A delivery is ``POST url`` with the JSON body ``{"event", "data", "delivery_id", "created_at"}`` and the
headers ``X-Webhook-Event``, ``X-Webhook-Delivery``, ``X-Webhook-Timestamp`` (unix ms) and
``X-Webhook-Signature``: hex HMAC-SHA256 under the subscription's secret over ``TIMESTAMP.BODY``.
Any 2xx is delivered; anything else (refused connection, timeout, other status) is a failed attempt.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from node.config import NodeConfig
from node.errors import ServiceError
from node.pause import StoragePause
from storage import subscriptions as subs
from storage.db import Database
from storage.errors import StorageError
from storage.subscriptions import Delivery

log = logging.getLogger("node.webhooks")

EVENTS = ("approval.requested", "approval.decided", "memory.stored", "link.attested")
DUE_MAX = 64
# Most deliveries one listing shows (as approvals.LIST_MAX for pending actions).
LIST_MAX = 1000
INT64_MAX = 2**63 - 1
# How long "are there subscribers at all" is remembered: publishing costs nothing without any.
SUBSCRIBERS_CHECK_S = 1.0


def signature(secret: str, timestamp_ms: int, body: bytes) -> str:
    """The ``X-Webhook-Signature`` of a delivery (receivers recompute it with their copy of the secret)."""
    return hmac.new(bytes.fromhex(secret), str(timestamp_ms).encode() + b"." + body, hashlib.sha256).hexdigest()


def next_attempt(attempts: int, delays_s: tuple[float, ...], now_ms: int) -> int | None:
    """After ``attempts`` failed attempts: when to try again (unix ms), or None to dead-letter."""
    if attempts > len(delays_s):
        return None
    return now_ms + int(delays_s[attempts - 1] * 1000)


class Webhooks:
    """Queues events for subscribers (in any process) and, in the node, delivers them."""

    def __init__(self, cfg: NodeConfig, db: Database, clock: Callable[[], int]) -> None:
        self.cfg = cfg
        self.db = db
        self.clock = clock
        self._wake = asyncio.Event()
        self._subscribed: tuple[float, bool] = (0.0, False)
        # The subscriber check in progress: every publish that finds the answer stale awaits this one read
        # (the links of one batch publish in one turn: each used to make its own reader-thread hop).
        self._checking: asyncio.Future[bool] | None = None
        self._subscribed_changes = 0
        # The database refusing an event's queueing: logged once while it lasts.
        self._publish_pause = StoragePause("webhooks:publish", log)

    async def subscribe(self, url: str, events: list[str]) -> dict[str, Any]:
        """Add a subscription; returns it with its secret (shown once)."""
        if not url.startswith(("http://", "https://")) or len(url) > 2048:
            raise ServiceError("bad_input", f"url must be an http(s) URL of at most 2048 chars, got {url!r}")
        unknown = sorted(set(events) - {*EVENTS, "*"})
        if not events or unknown:
            raise ServiceError("bad_input", f"events must be some of {', '.join(EVENTS)} or *; got {events!r}")
        secret = secrets.token_hex(32)
        sid = await self.db.write(subs.add, url, events, secret, self.clock())
        self._subscribed = (0.0, True)
        self._subscribed_changes += 1  # a check already in flight may predate this subscription
        return {"id": sid, "url": url, "events": sorted(events), "secret": secret}

    async def publish(self, event: str, data: dict[str, Any]) -> None:
        """Queue ``event`` for every subscriber to it (durably; delivered by the running node). The write it tells
        of is committed already: when the database refuses the queueing (away, full) the event is not queued
        (logged once while that lasts) and the write's caller still hears that it was stored."""
        try:
            if not await self._any_subscribers():
                return
            now = self.clock()
            body = json.dumps({"event": event, "data": data, "created_at": now}, sort_keys=True, default=str).encode()
            queued = await self.db.write(subs.enqueue, event, body, now)
        except StorageError as e:
            self._publish_pause.failed(e, f"queueing {event}")
            return
        self._publish_pause.ok()
        if queued:
            self._wake.set()

    async def _any_subscribers(self) -> bool:
        """Whether anyone subscribes, read again at most every SUBSCRIBERS_CHECK_S (one read shared by all
        the publishes that find the answer stale at once)."""
        checked_at, any_ = self._subscribed
        if time.monotonic() - checked_at <= SUBSCRIBERS_CHECK_S:
            return any_
        if self._checking is None:
            self._checking = asyncio.ensure_future(self._check_subscribers())
        return await asyncio.shield(self._checking)

    async def _check_subscribers(self) -> bool:
        changes = self._subscribed_changes
        try:
            any_ = bool(await self.db.read(subs.list_))
        finally:
            self._checking = None
        if changes != self._subscribed_changes:
            return True  # subscribed meanwhile: the next publish reads again
        self._subscribed = (time.monotonic(), any_)
        return any_

    async def deliveries(self, status: str | None, limit: int) -> list[Delivery]:
        """Deliveries (of one status, or all), oldest first; ``limit`` 1..LIST_MAX."""
        if not 1 <= limit <= LIST_MAX:
            raise ServiceError("bad_input", f"limit must be 1..{LIST_MAX}, got {limit}")
        return await self.db.read(subs.deliveries, status, limit)

    async def replay(self, delivery_id: int) -> None:
        # Ids are positive int64: anything else names no delivery (and would not fit the column).
        if not 0 < delivery_id <= INT64_MAX or not await self.db.write(subs.replay, delivery_id, self.clock()):
            raise ServiceError("not_found", f"no dead delivery with id {delivery_id}")
        self._wake.set()

    async def due(self) -> list[Delivery]:
        """The deliveries due now (at most DUE_MAX), for the node's delivery loop."""
        return await self.db.read(subs.due, self.clock(), DUE_MAX)

    async def settle(self, d: Delivery, error: str | None) -> bool:
        """Record one attempt at ``d`` (``error`` None: delivered); whether it was dead-lettered."""
        attempts = d.attempts + 1
        if error is None:
            await self.db.write(subs.delivered, d.id, attempts, self.clock())
            return False
        nxt = next_attempt(attempts, self.cfg.subscriptions.retry_delays_s, self.clock())
        await self.db.write(subs.failed, d.id, attempts, nxt, error)
        return nxt is None

    async def wait_queued(self, timeout_s: float) -> None:
        """Until an event is queued or replayed, or ``timeout_s`` passes."""
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        except TimeoutError:
            pass
