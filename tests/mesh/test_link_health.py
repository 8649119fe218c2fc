"""Outage accounting of a peer link (mesh.link.LinkHealth): plain values, no sockets, no clock."""

from mesh.link import LinkHealth

SETTLE = 10.0


def test_the_first_failed_attempt_starts_outage_one_and_retries_stay_in_it() -> None:
    h = LinkHealth(SETTLE)
    assert h.went_down(0.0) is True
    assert (h.outages, h.failures) == (1, 1)
    assert h.went_down(1.0) is False and h.went_down(3.0) is False
    assert (h.outages, h.failures) == (1, 3)


def test_a_connection_that_stayed_up_resets_the_failures_for_the_next_outage() -> None:
    h = LinkHealth(SETTLE)
    for t in (0.0, 1.0, 3.0, 7.0):
        h.went_down(t)
    assert h.failures == 4
    assert h.went_up(15.0) == 15.0  # down for 15 s
    assert not h.settled(15.0 + SETTLE - 0.001) and h.settled(15.0 + SETTLE)
    assert h.went_down(100.0) is True
    assert (h.outages, h.failures) == (2, 1)


def test_a_flapping_peer_keeps_backing_off_but_every_drop_is_an_outage() -> None:
    h = LinkHealth(SETTLE)
    now = 0.0
    for expected_failures in range(1, 6):
        h.went_up(now)
        now += 0.5  # dropped well before the settle time
        assert h.went_down(now) is True
        assert (h.outages, h.failures) == (expected_failures, expected_failures)
        now += 1.0


def test_the_first_connect_is_not_a_recovery() -> None:
    h = LinkHealth(SETTLE)
    assert h.went_up(5.0) is None
    assert (h.outages, h.failures) == (0, 0)
