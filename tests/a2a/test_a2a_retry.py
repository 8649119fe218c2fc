from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from a2a import Backoff, RetrySchedule

T0 = 1_700_000_000_000
TTL = 60_000


def test_default_schedule_retries_after_1_5_25_seconds_then_gives_up() -> None:
    s = RetrySchedule()
    assert s.delays_s == (1.0, 5.0, 25.0)
    assert s.next_attempt_at(1, T0, T0 + TTL) == T0 + 1_000
    assert s.next_attempt_at(2, T0, T0 + TTL) == T0 + 5_000
    assert s.next_attempt_at(3, T0, T0 + TTL) == T0 + 25_000
    assert s.next_attempt_at(4, T0, T0 + TTL) is None
    assert s.max_attempts == 4


def test_retry_due_after_expiry_is_not_scheduled() -> None:
    s = RetrySchedule()
    assert s.next_attempt_at(3, T0, T0 + 10_000) is None
    assert s.next_attempt_at(1, T0, T0 + 1_000) is None  # due exactly at expiry: the receiver would drop it
    assert s.next_attempt_at(1, T0, T0 + 1_001) == T0 + 1_000


def test_default_schedule_fits_in_the_default_ttl() -> None:
    # Worst case: each attempt waits the full 2 s ACK timeout before failing.
    s, t, sent_at = RetrySchedule(), T0, T0
    for attempts in range(1, s.max_attempts):
        t = s.next_attempt_at(attempts, t + 2_000, sent_at + TTL)
        assert t is not None


def test_schedule_rejects_bad_delays_and_attempt_counts() -> None:
    with pytest.raises(ValueError):
        RetrySchedule((1.0, -1.0))
    with pytest.raises(ValueError):
        RetrySchedule().next_attempt_at(0, T0, T0 + TTL)


def test_empty_schedule_never_retries() -> None:
    assert RetrySchedule(()).next_attempt_at(1, T0, T0 + TTL) is None


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=2**32))
def test_backoff_stays_within_bounds(failures: int, seed: int) -> None:
    b = Backoff(0.2, 30.0, random.Random(seed))
    d = b.next_delay(failures)
    assert 0.2 <= d <= 30.0


def test_backoff_ceiling_grows_exponentially_then_caps() -> None:
    class Top(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    b = Backoff(0.5, 10.0, Top())
    assert [b.next_delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_backoff_is_jittered() -> None:
    b = Backoff(1.0, 60.0, random.Random(7))
    assert len({b.next_delay(5) for _ in range(20)}) > 1


def test_backoff_rejects_inverted_bounds() -> None:
    with pytest.raises(ValueError):
        Backoff(5.0, 1.0, random.Random(0))
