"""The node's webhook delivery loop: POSTs the rows ``node.events.webhooks.Webhooks`` queued, one attempt a
due row, each bounded by ``subscriptions.timeout_s``. Apart from the queue because it holds the HTTP client,
which only a running node needs (a CLI command that queues an event never imports it)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp

from node.events.webhooks import Webhooks, signature
from node.pause import StoragePause
from storage.errors import StorageError
from storage.subscriptions import Delivery

log = logging.getLogger("node.webhooks")


class WebhookDelivery:
    """Delivers ``webhooks``' due rows until stopped; counts what it delivered and dead-lettered."""

    def __init__(self, webhooks: Webhooks) -> None:
        self.webhooks = webhooks
        self.delivered = 0
        self.dead = 0
        # The database refusing the delivery loop: logged once while it lasts.
        self.pause = StoragePause("webhooks", log)

    async def run(self, stopping: Callable[[], bool]) -> None:
        """Deliver due rows until ``stopping()``; each POST bounded by ``subscriptions.timeout_s``."""
        cfg = self.webhooks.cfg.subscriptions
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as http:
            while not stopping():
                wait_s = cfg.poll_s
                try:
                    for d in await self.webhooks.due():
                        await self._attempt(http, d)
                except StorageError as e:  # the database away, full or damaged: the deliveries stay due
                    wait_s = self.pause.failed(e, "deliveries")
                else:
                    self.pause.ok()
                await self.webhooks.wait_queued(wait_s)

    async def _attempt(self, http: aiohttp.ClientSession, d: Delivery) -> None:
        ts = self.webhooks.clock()
        headers = {"Content-Type": "application/json", "X-Webhook-Event": d.event,
                   "X-Webhook-Delivery": str(d.id), "X-Webhook-Timestamp": str(ts),
                   "X-Webhook-Signature": signature(d.secret, ts, d.body)}
        try:
            async with http.post(d.url, data=d.body, headers=headers) as r:
                error = None if 200 <= r.status < 300 else f"HTTP {r.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            error = f"{type(e).__name__}: {e}"
        if error is None:
            await self.webhooks.settle(d, None)
            self.delivered += 1
        elif await self.webhooks.settle(d, error):
            self.dead += 1
            log.warning("webhook_dead_letter", extra={"ev": {"delivery": d.id, "url": d.url, "error": error}})
