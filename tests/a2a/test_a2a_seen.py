from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from a2a import SeenCache


class FakeClock:
    """Unix ms under test control."""

    def __init__(self, now_ms: float = 1_000_000.0) -> None:
        self.now_ms = now_ms

    def __call__(self) -> float:
        return self.now_ms


def cid() -> str:
    return str(uuid.uuid4())


def test_remembered_id_is_seen_until_its_expiry() -> None:
    clock = FakeClock()
    seen = SeenCache(maxsize=10, clock=clock)
    a = cid()
    seen.remember(a, expires_at_ms=clock.now_ms + 60_000)
    assert a in seen and seen.seen(a) and len(seen) == 1
    clock.now_ms += 59_999
    assert a in seen
    clock.now_ms += 1
    assert a not in seen
    assert len(seen) == 0
    assert seen.expired_dropped == 1
    assert seen.evictions_live == 0


def test_unknown_id_is_not_seen() -> None:
    assert not SeenCache(clock=FakeClock()).seen(cid())


def test_already_expired_message_is_not_stored() -> None:
    clock = FakeClock()
    seen = SeenCache(maxsize=10, clock=clock)
    a = cid()
    seen.remember(a, expires_at_ms=clock.now_ms)
    assert a not in seen and len(seen) == 0


def test_entries_expire_each_at_their_own_time() -> None:
    clock = FakeClock(0)
    seen = SeenCache(maxsize=10, clock=clock)
    early, late = cid(), cid()
    seen.remember(late, 2_000)
    seen.remember(early, 1_000)
    clock.now_ms = 1_500
    assert early not in seen and late in seen


def test_size_bound_evicts_live_entries_and_counts_them() -> None:
    clock = FakeClock(0)
    seen = SeenCache(maxsize=3, clock=clock)
    ids = [cid() for _ in range(5)]
    for i in ids:
        seen.remember(i, 60_000)
    assert len(seen) == 3
    assert seen.evictions_live == 2
    assert ids[0] not in seen and ids[1] not in seen  # least recently used go first
    assert all(i in seen for i in ids[2:])


def test_expired_entries_make_room_without_counting_as_live_evictions() -> None:
    clock = FakeClock(0)
    seen = SeenCache(maxsize=2, clock=clock)
    seen.remember(cid(), 100)
    seen.remember(cid(), 100)
    clock.now_ms = 200
    seen.remember(cid(), 1_000)
    seen.remember(cid(), 1_000)
    assert seen.evictions_live == 0
    assert seen.expired_dropped == 2
    assert len(seen) == 2


def test_remembering_again_never_shortens_an_entry() -> None:
    clock = FakeClock(0)
    seen = SeenCache(maxsize=10, clock=clock)
    a = cid()
    seen.remember(a, 10_000)
    seen.remember(a, 500)
    clock.now_ms = 1_000
    assert a in seen and len(seen) == 1


def test_membership_test_does_not_insert() -> None:
    seen = SeenCache(maxsize=10, clock=FakeClock())
    a = cid()
    assert not seen.seen(a)
    assert a not in seen
    assert len(seen) == 0


@settings(max_examples=200)
@given(
    st.integers(min_value=1, max_value=20),
    st.lists(st.tuples(st.integers(min_value=0, max_value=30), st.integers(min_value=1, max_value=500)), max_size=200),
)
def test_size_bound_always_holds(maxsize: int, ops: list[tuple[int, int]]) -> None:
    clock = FakeClock(0)
    seen = SeenCache(maxsize=maxsize, clock=clock)
    ids = [cid() for _ in range(31)]
    for index, ttl in ops:
        seen.remember(ids[index], int(clock.now_ms) + ttl)
        clock.now_ms += 7
        assert len(seen) <= maxsize


def test_live_evictions_are_reported_to_on_evict_and_expiries_are_not() -> None:
    clock = FakeClock(0)
    evicted: list[tuple[str, int]] = []
    seen = SeenCache(maxsize=2, clock=clock, on_evict=lambda key, exp: evicted.append((key, exp)))
    a, b, c = cid(), cid(), cid()
    seen.remember(a, 100)
    seen.remember(b, 60_000)
    seen.remember(c, 60_000)
    assert evicted == [(a, 100)]
    clock.now_ms = 70_000
    seen.remember(cid(), 90_000)
    assert evicted == [(a, 100)]


class ModelSeen:
    """The seen-cache's rules written plainly: expired entries go first, then the least recently remembered."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.entries: dict[str, int] = {}

    def remember(self, key: str, expires_at: int, now: int) -> None:
        self.entries = {k: e for k, e in self.entries.items() if e > now}
        previous = self.entries.pop(key, None)
        expires_at = max(expires_at, previous or 0)
        if expires_at > now:
            self.entries[key] = expires_at
        while len(self.entries) > self.maxsize:
            del self.entries[next(iter(self.entries))]


@settings(max_examples=300)
@given(
    st.integers(min_value=1, max_value=8),
    st.lists(st.tuples(st.integers(min_value=0, max_value=12), st.integers(min_value=-20, max_value=300),
                       st.integers(min_value=0, max_value=40)), max_size=300),
)
def test_agrees_with_the_plain_model_and_its_expiry_heap_stays_bounded(
        maxsize: int, ops: list[tuple[int, int, int]]) -> None:
    clock = FakeClock(0)
    seen, model = SeenCache(maxsize=maxsize, clock=clock), ModelSeen(maxsize)
    ids = [cid() for _ in range(13)]
    for index, ttl, step in ops:
        now = int(clock.now_ms)
        seen.remember(ids[index], now + ttl)
        model.remember(ids[index], now + ttl, now)
        clock.now_ms += step
        live = {k for k, e in model.entries.items() if e > clock.now_ms}
        assert {i for i in ids if i in seen} == live
        assert len(seen) == len(live)
        assert len(seen._expiries) <= 4 * maxsize + 1  # noqa: SLF001
