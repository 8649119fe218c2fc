"""The seen-cache: correlation_ids already applied, each kept until its message's expires_at."""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable

# The expiry heap may hold stale entries (ids evicted by size or remembered again for longer); past this
# multiple of maxsize it is rebuilt from the live entries, so its size stays bounded.
HEAP_SLACK = 4


def wall_clock_ms() -> float:
    """Current unix time in milliseconds."""
    return time.time() * 1000.0


# Correlation ids remembered at most (a2a.seen_cache_size's default).
SEEN_CACHE_SIZE = 10_000


class SeenCache:
    """Bounded set of correlation_ids with per-entry expiry at the message's ``expires_at`` (unix ms).

    ``clock`` returns unix ms. Membership tests never reorder or insert; only ``remember`` mutates,
    and the receiver calls it after the apply committed. Entries leave when their expiry passes (swept
    from a heap in expiry order, only when the earliest one is due: no scan per insert) or, least
    recently remembered first, when the size bound needs room.
    """

    def __init__(self, maxsize: int = SEEN_CACHE_SIZE, clock: Callable[[], float] = wall_clock_ms,
                 on_evict: Callable[[str, int], None] | None = None) -> None:
        """``on_evict(correlation_id, expires_at_ms)`` is called for each live entry the size bound pushes out."""
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self.on_evict = on_evict
        self._clock = clock
        self._entries: OrderedDict[str, int] = OrderedDict()  # id -> expires_at, least recently remembered first
        self._expiries: list[tuple[int, str]] = []  # heap of (expires_at, id); stale pairs are skipped
        self._evictions_live = 0
        self._expired_dropped = 0

    def remember(self, correlation_id: str, expires_at_ms: int) -> None:
        """Record an applied message until ``expires_at_ms``; an already expired one is not stored."""
        now = self._clock()
        expiries = self._expiries
        if expiries and expiries[0][0] <= now:
            self._sweep(now)
        entries = self._entries
        previous = entries.get(correlation_id)
        if previous is not None:  # live (the sweep dropped it otherwise)
            entries.move_to_end(correlation_id)
            if previous >= expires_at_ms:
                return  # never shorten a live entry
        elif expires_at_ms <= now:
            return
        entries[correlation_id] = expires_at_ms
        heapq.heappush(expiries, (expires_at_ms, correlation_id))
        if len(entries) > self.maxsize:
            self._evict()
        if len(expiries) > HEAP_SLACK * self.maxsize:
            self._expiries = [(exp, cid) for cid, exp in entries.items()]
            heapq.heapify(self._expiries)

    def _sweep(self, now: float) -> None:
        """Drop every entry whose expiry is at or before ``now``."""
        expiries, entries = self._expiries, self._entries
        while expiries and expiries[0][0] <= now:
            exp, cid = heapq.heappop(expiries)
            if entries.get(cid) == exp:
                del entries[cid]
                self._expired_dropped += 1

    def _evict(self) -> None:
        """Push out least recently remembered live entries until the size bound holds."""
        while len(self._entries) > self.maxsize:
            cid, exp = self._entries.popitem(last=False)
            self._evictions_live += 1
            if self.on_evict is not None:
                self.on_evict(cid, exp)

    def seen(self, correlation_id: str) -> bool:
        """True while ``correlation_id`` is remembered and unexpired."""
        exp = self._entries.get(correlation_id)
        return exp is not None and exp > self._clock()

    def __contains__(self, correlation_id: object) -> bool:
        if not isinstance(correlation_id, str):
            return False
        return self.seen(correlation_id)

    def __len__(self) -> int:
        self._sweep(self._clock())
        return len(self._entries)

    @property
    def evictions_live(self) -> int:
        """Entries pushed out by the size bound before their expiry (a sign maxsize is too small)."""
        return self._evictions_live

    @property
    def expired_dropped(self) -> int:
        """Entries removed because their expires_at passed."""
        return self._expired_dropped

    def expire(self) -> int:
        """Drop expired entries now; returns how many. (They are also dropped lazily.)"""
        before = self._expired_dropped
        self._sweep(self._clock())
        return self._expired_dropped - before
