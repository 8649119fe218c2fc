"""One format for every line: times as ISO 8601 everywhere, a warning repeated from one source written once per
window with its count, and a CLI command's warnings as readable lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mesh import keys
from node.cli import main
from node.log import STATE_CHANGE, CliLines, JsonLines, RepeatLimit, TextLines, flush_repeats

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def record(event: str, level: int = logging.WARNING, at: float = T0, **ev: object) -> logging.LogRecord:
    r = logging.LogRecord("mesh.server", level, __file__, 1, event, None, None)
    r.created = at
    r.ev = ev
    return r


def test_fields_that_hold_unix_ms_times_are_written_as_the_line_time_is() -> None:
    r = record("retry_scheduled", logging.INFO, next_attempt_at=1_767_225_601_500, attempt=2, created_at=5)
    line = json.loads(JsonLines("ai:n@lab").format(r))
    assert line["ts"] == "2026-01-01T00:00:00.000Z" and line["next_attempt_at"] == "2026-01-01T00:00:01.500Z"
    assert line["attempt"] == 2 and line["created_at"] == 5  # not a unix-ms time: left as it is
    assert "next_attempt_at=2026-01-01T00:00:01.500Z" in TextLines().format(r)


def test_a_warning_repeated_from_one_source_is_written_once_per_window_with_its_count() -> None:
    limit = RepeatLimit(window_s=10.0)
    first = [limit.filter(record("not_a_member", at=T0 + i * 0.5, remote="10.0.0.9")) for i in range(14)]
    assert first == [True] + [False] * 13
    assert limit.filter(record("not_a_member", at=T0 + 1, remote="10.0.0.7"))  # another source: its own line
    assert limit.filter(record("peer_key_mismatch", at=T0 + 1, remote="10.0.0.9"))  # another event
    assert limit.filter(record("not_a_member", level=logging.ERROR, at=T0 + 2, remote="10.0.0.9"))  # not a warning
    assert all(limit.filter(record("expired", at=T0 + 2, peer="ai:b", correlation_id=str(i))) for i in range(3))
    later = record("not_a_member", at=T0 + 10, remote="10.0.0.9")
    assert limit.filter(later) and later.ev == {"remote": "10.0.0.9", "repeated": 13}
    again = record("not_a_member", at=T0 + 21, remote="10.0.0.9")
    assert limit.filter(again) and "repeated" not in again.ev


def test_a_burst_that_ends_is_told_with_its_count_once_its_window_is_over() -> None:
    """No later warning from the source: the last one held back is written by the flush, with the count."""
    limit = RepeatLimit(window_s=10.0)
    assert [limit.filter(record("not_a_member", at=T0 + i, remote="10.0.0.9")) for i in range(4)] \
        == [True, False, False, False]
    assert limit.due(T0 + 9.9) == []  # the window is not over yet
    [told] = limit.due(T0 + 10)
    assert told.created == T0 + 3 and told.ev == {"remote": "10.0.0.9", "repeated": 3}
    assert limit.due(T0 + 30) == []  # told once
    later = record("not_a_member", at=T0 + 31, remote="10.0.0.9")
    assert limit.filter(later) and "repeated" not in later.ev  # not counted twice


def test_flush_repeats_writes_through_the_root_handler_that_held_them(capsys: pytest.CaptureFixture[str]) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines("ai:n@lab"))
    handler.addFilter(RepeatLimit(window_s=10.0))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        for i in range(3):
            handler.handle(record("not_a_member", at=T0 + i, remote="10.0.0.9"))
        assert flush_repeats(T0 + 10) == 1 and flush_repeats(T0 + 20) == 0
    finally:
        root.removeHandler(handler)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(x["event"], x.get("repeated")) for x in lines] == [("not_a_member", None), ("not_a_member", 2)]


def test_a_state_change_is_never_held_back() -> None:
    """Two outages in one window: each begins with its own line (the source logs it once per change)."""
    limit = RepeatLimit(window_s=10.0)
    for i in range(3):
        r = record("storage_unavailable", at=T0 + i, dsn="host=/x")
        setattr(r, STATE_CHANGE, True)
        assert limit.filter(r)


def test_the_sources_remembered_are_bounded() -> None:
    limit = RepeatLimit(window_s=10.0, max_sources=3)
    for i in range(5):
        assert limit.filter(record("not_a_member", remote=f"10.0.0.{i}"))
    assert limit.filter(record("not_a_member", remote="10.0.0.0"))  # forgotten: written again


def test_a_cli_warning_is_a_readable_line() -> None:
    line = CliLines("ai-memory").format(record("storage_unavailable", dsn="host=/x password=***", error="no"))
    assert line == 'ai-memory: warning storage_unavailable dsn="host=/x password=***" error=no'


def test_a_cli_command_writes_its_warnings_through_the_cli_format(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    home = tmp_path / "n1"
    keys.generate_identity(home / "keys", "ai:node-1@lab")
    (home / "peers").mkdir()
    (home / "peers" / "ai:b@lab.pub").write_text("not a key", encoding="utf-8")
    rc = main(["--home", str(home), "store", "hello"])
    err = capsys.readouterr().err
    assert rc == 0 and [ln for ln in err.splitlines() if ln.startswith("ai-memory: warning skipping peer key file")]
