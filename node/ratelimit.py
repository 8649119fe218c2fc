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

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self) -> float:
        """Spend one token; returns 0.0 when allowed, else the seconds until one is available."""
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def take_up_to(self, n: int) -> tuple[int, float]:
        """Spend up to ``n`` whole tokens at once: (how many, 0.0), or (0, seconds until one is available)."""
        self._refill()
        got = min(n, int(self.tokens))
        if got < 1:
            return 0, (1.0 - self.tokens) / self.rate
        self.tokens -= got
        return got, 0.0

    def give_back(self, n: int) -> None:
        """Return ``n`` tokens taken and not used (never above one second's worth)."""
        self.tokens = min(self.capacity, self.tokens + n)

    def charge(self, n: int) -> None:
        """Spend ``n`` more tokens for work already admitted, into debt if need be: the caller's next
        requests wait until the budget has paid for it."""
        self._refill()
        self.tokens -= n


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
        bucket = self._bucket(caller)
        wait = bucket.take()
        self._forget_idle(bucket.stamp)
        if wait:
            self.refused += 1
        return wait

    def take_up_to(self, caller: str, n: int) -> tuple[int, float]:
        """Spend up to ``n`` of ``caller``'s tokens: (how many, 0.0), or (0, seconds until one is available)."""
        got, wait = self._bucket(caller).take_up_to(n)
        if not got:
            self.refused += 1
        return got, wait

    def give_back(self, caller: str, n: int) -> None:
        """Return ``n`` of ``caller``'s tokens that ``take_up_to`` granted and the work did not use."""
        if n > 0:
            self._bucket(caller).give_back(n)

    def charge(self, caller: str, n: int) -> None:
        """Spend ``n`` more of ``caller``'s tokens for a request admitted on one (may leave it in debt)."""
        if n > 0:
            self._bucket(caller).charge(n)

    def _bucket(self, caller: str) -> TokenBucket:
        """``caller``'s bucket (a new one when it has none), moved to the back: the most recently used."""
        buckets = self._buckets
        bucket = buckets.get(caller)
        if bucket is None:
            bucket = buckets[caller] = TokenBucket(self.rate, self.clock)
        else:
            buckets.move_to_end(caller)
        return bucket

    def _forget_idle(self, now: float) -> None:
        """Drop buckets unused for ``IDLE_FORGET_S`` (from the front: by last use) and any past ``MAX_CALLERS``."""
        buckets = self._buckets
        while len(buckets) > MAX_CALLERS:
            buckets.popitem(last=False)
        while buckets:
            oldest = next(iter(buckets.values()))
            if now - oldest.stamp < IDLE_FORGET_S or oldest.tokens + (now - oldest.stamp) * oldest.rate < 0:
                break  # used lately, or still in debt (a charge): forgetting it would wipe what is owed
            buckets.popitem(last=False)

    def check(self, caller: str) -> None:
        """Raise ServiceError ``rate_limited`` when ``caller`` is past its budget."""
        wait = self.wait_s(caller)
        if wait:
            raise ServiceError("rate_limited", f"more than {self.rate:g} requests/s from this agent "
                                               f"(limits.requests_per_second); retry in {wait * 1000:.0f} ms")
