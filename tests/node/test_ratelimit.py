import pytest

from node.errors import ServiceError
from node.ratelimit import RateLimiter, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_bucket_allows_one_seconds_burst_then_refuses_until_refilled() -> None:
    clock = Clock()
    b = TokenBucket(100, clock)
    assert all(b.take() == 0.0 for _ in range(100))
    assert b.take() == pytest.approx(0.01)
    clock.t += 0.01
    assert b.take() == 0.0


def test_limiter_keeps_one_budget_per_caller() -> None:
    clock = Clock()
    limiter = RateLimiter(2, clock)
    a, b = "session-a", "session-b"
    limiter.check(a)
    limiter.check(a)
    with pytest.raises(ServiceError) as err:
        limiter.check(a)
    assert err.value.code == "rate_limited"
    limiter.check(b)
    assert limiter.refused == 1


def test_bucket_grants_up_to_what_it_holds_and_takes_back_what_was_not_used() -> None:
    clock = Clock()
    b = TokenBucket(10, clock)
    assert b.take_up_to(4) == (4, 0.0)
    assert b.take_up_to(100) == (6, 0.0)  # never more than it holds
    got, wait = b.take_up_to(5)
    assert got == 0 and wait == pytest.approx(0.1)
    b.give_back(3)
    assert b.take_up_to(5) == (3, 0.0)
    b.give_back(1000)
    assert b.take_up_to(100) == (10, 0.0)  # giving back never raises it above one second's worth


def test_limiter_counts_a_grant_of_nothing_as_refused() -> None:
    limiter = RateLimiter(2, Clock())
    assert limiter.take_up_to("peer", 5) == (2, 0.0)
    assert limiter.take_up_to("peer", 5)[0] == 0
    assert limiter.refused == 1
    assert limiter.take_up_to("other", 1) == (1, 0.0)  # one budget per caller


def test_a_charge_may_leave_the_bucket_in_debt_until_time_pays_it() -> None:
    clock = Clock()
    b = TokenBucket(10, clock)
    assert b.take() == 0.0
    b.charge(19)  # 20 spent on a bucket of 10: 10 in debt
    assert b.take() == pytest.approx(1.1)
    clock.t += 1.1
    assert b.take() == 0.0


def test_limiter_forgets_idle_callers_and_keeps_at_most_max_callers(monkeypatch) -> None:
    from node import ratelimit

    monkeypatch.setattr(ratelimit, "MAX_CALLERS", 3)
    clock = Clock()
    limiter = RateLimiter(2, clock)
    for caller in ("a", "b", "c", "d", "e"):
        limiter.check(caller)
        clock.t += 1.0
    assert list(limiter._buckets) == ["c", "d", "e"]  # noqa: SLF001  (least recently used went first)
    limiter.check("c")
    assert list(limiter._buckets) == ["d", "e", "c"]  # noqa: SLF001
    clock.t += ratelimit.IDLE_FORGET_S
    limiter.check("f")
    assert list(limiter._buckets) == ["f"]  # noqa: SLF001  (idle a minute: forgotten, it would be full again)
    limiter.check("f")
    with pytest.raises(ServiceError):
        limiter.check("f")  # a remembered caller's budget still holds


def test_a_caller_in_debt_is_not_forgotten_until_it_has_paid() -> None:
    from node import ratelimit

    clock = Clock()
    limiter = RateLimiter(1, clock)
    limiter.check("peer")
    limiter.charge("peer", 99)  # a links.put of 100 on a budget of 1/s: 99 owed
    clock.t += ratelimit.IDLE_FORGET_S + 1  # idle a minute, 38 still owed
    limiter.check("other")  # forgetting runs here
    assert "peer" in limiter._buckets  # noqa: SLF001
    assert limiter.wait_s("peer") > 30  # the debt still stands
