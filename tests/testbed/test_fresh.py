"""`testbed fresh-check`'s report: the skip/failure lines and the final counts of the suite run in the chroot."""

from __future__ import annotations

from pathlib import Path

from testbed.env.fresh import pytest_summary

LOG = """\
$ scripts/test
....s...
=========================== short test summary info ============================
SKIPPED [1] tests/testbed/test_faults.py:55: iptables not installed (apt-get install -y iptables)
FAILED tests/x.py::test_y - AssertionError
============= 1 failed, 495 passed, 1 skipped in 300.03s (0:05:00) =============

$ scripts/run
bench: floor for 3 nodes
"""


def test_summary_keeps_skip_and_failure_lines_and_the_counts(tmp_path: Path) -> None:
    log = tmp_path / "fresh.log"
    log.write_text(LOG)
    assert pytest_summary(log) == [
        "SKIPPED [1] tests/testbed/test_faults.py:55: iptables not installed (apt-get install -y iptables)",
        "FAILED tests/x.py::test_y - AssertionError",
        "============= 1 failed, 495 passed, 1 skipped in 300.03s (0:05:00) =============",
    ]


def test_summary_of_a_run_that_failed_before_pytest_shows_the_error(tmp_path: Path) -> None:
    log = tmp_path / "fresh.log"
    log.write_text("$ scripts/test\nWARNING: ignored\nERROR: Could not install packages due to an OSError\n")
    assert pytest_summary(log) == ["ERROR: Could not install packages due to an OSError"]
