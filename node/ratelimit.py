"""Per-agent request budgets: a token bucket per MCP session or connection (limits.requests_per_second) and
per peer (limits.peer_requests_per_second)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from node.errors import ServiceError

# Callers tracked at once; an idle caller's bucket refills within a second, so forgetting it is harmless.
MAX_CALLERS = 10_000
IDLE_FORGET_S = 60.0


class TokenBucket:
    """``rate`` requests per second on average, bursts up to ``rate`` (one second's worth)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate)
        self.capacity = float(rate)
        self.tokens = float(rate)
        self.clock = clock
        self.stamp = clock()

    def take(self) -> float:
        """Spend one token; returns 0.0 when allowed, else the seconds until one is available."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RateLimiter:
    """One bucket per caller (an MCP session id), forgotten after a minute without calls, at most
    ``MAX_CALLERS`` (the least recently used go first)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        # caller -> its bucket, least recently used first (so the idle ones are at the front)
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.refused = 0

    def wait_s(self, caller: str) -> float:
        """Spend one of ``caller``'s tokens: 0.0 when allowed, else the seconds until one is available."""
        buckets = self._buckets
        bucket = buckets.get(caller)
        if bucket is None:
            bucket = buckets[caller] = TokenBucket(self.rate, self.clock)
        else:
            buckets.move_to_end(caller)
        wait = bucket.take()
        self._forget_idle(bucket.stamp)
        if wait:
            self.refused += 1
        return wait

    def _forget_idle(self, now: float) -> None:
        """Drop buckets unused for ``IDLE_FORGET_S`` (from the front: by last use) and any past ``MAX_CALLERS``."""
        buckets = self._buckets
        while len(buckets) > MAX_CALLERS:
            buckets.popitem(last=False)
        while buckets:
            oldest = next(iter(buckets.values()))
            if now - oldest.stamp < IDLE_FORGET_S:
                break
            buckets.popitem(last=False)

    def check(self, caller: str) -> None:
        """Raise ServiceError ``rate_limited`` when ``caller`` is past its budget."""
        wait = self.wait_s(caller)
        if wait:
            raise ServiceError("rate_limited", f"more than {self.rate:g} requests/s from this agent "
                                               f"(limits.requests_per_second); retry in {wait * 1000:.0f} ms")
