"""Retry timing as data: the per-message resend schedule and the reconnect backoff. Pure, no sleeping."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

# Seconds before each resend of an un-ACKed message: the default of a2a.retry_delays_s (node/config.py).
DEFAULT_RETRY_DELAYS_S: tuple[float, ...] = (1.0, 5.0, 25.0)


@dataclass(frozen=True)
class RetrySchedule:
    """Delays (seconds) before each resend of an un-ACKed message (DEFAULT_RETRY_DELAYS_S unless given)."""

    delays_s: tuple[float, ...] = DEFAULT_RETRY_DELAYS_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "delays_s", tuple(self.delays_s))
        for d in self.delays_s:
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0:
                raise ValueError(f"retry delays must be finite non-negative seconds, got {d!r}")

    @property
    def max_attempts(self) -> int:
        """First attempt plus one per delay."""
        return len(self.delays_s) + 1

    def next_attempt_at(self, attempts_made: int, failed_at_ms: int, expires_at_ms: int) -> int | None:
        """Unix ms at which to make the next attempt after ``attempts_made`` attempts (>= 1) have failed,
        the last at ``failed_at_ms``. None when the schedule is exhausted or the attempt would not be
        due before ``expires_at_ms`` (the receiver would drop it): the caller dead-letters.
        """
        if attempts_made < 1:
            raise ValueError(f"attempts_made counts failed attempts and must be >= 1, got {attempts_made}")
        if attempts_made > len(self.delays_s):
            return None
        due = failed_at_ms + round(self.delays_s[attempts_made - 1] * 1000)
        # A message is expired at expires_at itself (receiver: expires_at <= now), so "due == expires_at" is too late.
        if due >= expires_at_ms:
            return None
        return due


@dataclass(frozen=True)
class Backoff:
    """Jittered exponential reconnect delay: after n consecutive failures, uniform in
    [min_s, min(max_s, min_s * 2**n)] seconds. Always within [min_s, max_s].
    """

    min_s: float
    max_s: float
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (0 < self.min_s <= self.max_s) or not math.isfinite(self.max_s):
            raise ValueError(f"need 0 < min_s <= max_s (finite), got min_s={self.min_s!r} max_s={self.max_s!r}")

    def next_delay(self, failures: int) -> float:
        """Seconds to wait before the next reconnect after ``failures`` consecutive failures."""
        # Cap the exponent: beyond it the ceiling is max_s anyway, and 2**huge would overflow a float.
        exponent = min(max(failures, 0), 1000)
        ceiling = min(self.max_s, self.min_s * 2.0**exponent)
        return min(self.max_s, max(self.min_s, self.rng.uniform(self.min_s, ceiling)))
