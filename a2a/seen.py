"""The seen-cache: correlation_ids already applied, each kept until its message's expires_at."""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import TLRUCache


def wall_clock_ms() -> float:
    """Current unix time in milliseconds."""
    return time.time() * 1000.0


def _until_expires_at(_key: str, expires_at_ms: int, _now: float) -> int:
    return expires_at_ms


class _CountingTLRU(TLRUCache[str, int]):
    """TLRUCache that counts why entries left: pushed out by size while live, or expired."""

    def __init__(self, maxsize: int, timer: Callable[[], float],
                 on_evict: Callable[[str, int], None] | None = None) -> None:
        super().__init__(maxsize=maxsize, ttu=_until_expires_at, timer=timer)
        self.evictions_live = 0
        self.on_evict = on_evict
        self.expired_dropped = 0

    def popitem(self) -> tuple[str, int]:
        # TLRUCache.popitem first drops expired entries, so what it returns was still live.
        item = super().popitem()
        self.evictions_live += 1
        if self.on_evict is not None:
            self.on_evict(item[0], item[1])
        return item

    def expire(self, time: float | None = None) -> list[tuple[str, int]]:
        expired = super().expire(time)
        self.expired_dropped += len(expired)
        return expired


class SeenCache:
    """Bounded set of correlation_ids with per-entry expiry at the message's ``expires_at`` (unix ms).

    ``clock`` returns unix ms. Membership tests never reorder or insert; only ``remember`` mutates,
    and the receiver calls it after the apply committed.
    """

    def __init__(self, maxsize: int = 10_000, clock: Callable[[], float] = wall_clock_ms,
                 on_evict: Callable[[str, int], None] | None = None) -> None:
        """``on_evict(correlation_id, expires_at_ms)`` is called for each live entry the size bound pushes out."""
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self._cache = _CountingTLRU(maxsize, clock, on_evict)
        self.maxsize = maxsize

    def remember(self, correlation_id: str, expires_at_ms: int) -> None:
        """Record an applied message until ``expires_at_ms``; an already expired one is not stored."""
        previous = self._cache.get(correlation_id)
        if previous is not None and previous > expires_at_ms:
            expires_at_ms = previous  # never shorten a live entry
        self._cache[correlation_id] = expires_at_ms

    def seen(self, correlation_id: str) -> bool:
        """True while ``correlation_id`` is remembered and unexpired."""
        return correlation_id in self._cache

    def __contains__(self, correlation_id: object) -> bool:
        return correlation_id in self._cache

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def evictions_live(self) -> int:
        """Entries pushed out by the size bound before their expiry (a sign maxsize is too small)."""
        return self._cache.evictions_live

    @property
    def expired_dropped(self) -> int:
        """Entries removed because their expires_at passed."""
        return self._cache.expired_dropped

    def expire(self) -> int:
        """Drop expired entries now; returns how many. (They are also dropped lazily.)"""
        return len(self._cache.expire())
