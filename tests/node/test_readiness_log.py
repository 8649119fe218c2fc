"""Each switch of /readyz is logged once, both ways (node/readiness.py), from plain values."""

from __future__ import annotations

from node.readiness import ReadyLog

AWAY = [{"code": "storage_unavailable", "message": "postgres at ... is not answering"}]
NO_LINK = [{"code": "no_peer_link", "message": "none of the 2 configured peer links is up"}]


def test_the_first_look_says_where_the_node_stands_and_then_only_switches_are_logged() -> None:
    seen = ReadyLog()
    first = seen.observe(True, [], 0.0)
    assert first is not None and (first.event, first.level, first.fields) == ("ready", "info", {"not_ready_s": None})
    assert seen.observe(True, [], 1.0) is None
    down = seen.observe(False, AWAY, 2.0)
    assert down is not None and (down.event, down.level) == ("not_ready", "warning")
    assert down.fields == {"reasons": ["storage_unavailable"], "messages": [AWAY[0]["message"]]}
    assert seen.observe(False, AWAY, 3.0) is None
    up = seen.observe(True, [], 7.5)
    assert up is not None and up.event == "ready" and up.fields == {"not_ready_s": 5.5}


def test_other_reasons_while_not_ready_are_logged_and_the_time_runs_from_the_first() -> None:
    seen = ReadyLog()
    assert seen.observe(False, NO_LINK, 0.0) is not None
    again = seen.observe(False, [*NO_LINK, *AWAY], 1.0)
    assert again is not None and again.fields["reasons"] == ["no_peer_link", "storage_unavailable"]
    up = seen.observe(True, [], 4.0)
    assert up is not None and up.fields == {"not_ready_s": 4.0}
