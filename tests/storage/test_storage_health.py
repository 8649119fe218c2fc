"""The store's conditions (storage/health.py): set where found, cleared where over, oldest first."""

from __future__ import annotations

from storage.errors import StorageCode
from storage.health import Health


def test_a_condition_is_in_force_from_its_set_until_its_clear() -> None:
    h = Health()
    assert h.set(StorageCode.STORAGE_UNAVAILABLE, "postgres at host=/x is not answering") is True
    assert h.set(StorageCode.STORAGE_UNAVAILABLE, "still not answering") is False  # the same outage goes on
    assert StorageCode.STORAGE_UNAVAILABLE in h
    [c] = h.conditions()
    assert c.code == "storage_unavailable" and c.message == "still not answering"
    ended = h.clear(StorageCode.STORAGE_UNAVAILABLE)
    assert ended is not None and ended.since == c.since
    assert h.conditions() == [] and h.clear(StorageCode.STORAGE_UNAVAILABLE) is None
    assert h.began == {StorageCode.STORAGE_UNAVAILABLE: 1}


def test_conditions_come_oldest_first() -> None:
    h = Health()
    h.set(StorageCode.STORAGE_FULL, "disk full")
    h.set(StorageCode.STORAGE_CORRUPT, "page 7 damaged")
    assert [c.code for c in h.conditions()] == ["storage_full", "storage_corrupt"]
