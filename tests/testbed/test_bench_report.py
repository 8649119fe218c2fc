"""bench.md as a terminal shows it: a main table of eight columns and a details table, every table line within 100
columns, and verdicts that say how many of the rounds (ours, the floor and NATS taking turns) hold them."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.bench.figures import compare_rounds, result_row, rounds_summary
from testbed.bench.report import MAX_WIDTH, markdown

MS = 1e-3


def _round(p95_ms: float, n: int = 40) -> list[float]:
    """``n`` latencies (s) whose nearest-rank p95 is ``p95_ms``."""
    return [p95_ms * MS * 0.5] * (n - 3) + [p95_ms * MS] * 2 + [p95_ms * MS * 2]


def _row(nodes: int, ours: list[float], floor: list[float], nats: list[float]) -> dict[str, Any]:
    o, f, n = [_round(x) for x in ours], [_round(x) for x in floor], [_round(x) for x in nats]
    flat = [s for r in o for s in r]
    row = result_row(nodes, len(flat), 20, 195, (flat, 0.5, [0.02, 0.03], 0.04),
                     ([s for r in f for s in r], 0.2, [0.01, 0.01], 0.02))
    nflat = [s for r in n for s in r]
    row.update({"nats": {**row["floor"], "p50_ms": 0.6, "p95_ms": sorted(nflat)[int(0.95 * len(nflat)) - 1] / MS,
                         "cpu_ms_per_msg_server": 0.2},
                "ratio_p95_nats": 1.0, "p95_le_nats": True})
    row["rounds"] = rounds_summary(o, f, n, row["budget_p95_ms"])
    return row


def _report(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"command": "testbed bench --quick", "generated_at": "2026-12-04T00:00:00Z",
            "host": {"cpus": 2, "python": "3.11.7"}, "payload": "a2a ping", "mode": "default",
            "backend": {"name": "docker", "runs": "docker backend: one host-network container each",
                        "image": "attested-mesh-node:0.1.0-abc"},
            "nats": {"available": True, "version": "v2.9.10", "shape": "nats-server with TLS"},
            "results": [{k: v for k, v in r.items() if k != "_samples"} for r in rows]}


def _tables(md: str) -> list[list[str]]:
    tables: list[list[str]] = [[]]
    for line in md.splitlines():
        if line.startswith("|"):
            tables[-1].append(line)
        elif tables[-1]:
            tables.append([])
    return [t for t in tables if t]


def test_every_verdict_says_how_many_rounds_hold_it() -> None:
    assert compare_rounds([_round(1.0)] * 5, [_round(2.0)] * 5).words() == "yes 5/5"
    assert compare_rounds([_round(3.0)] * 5, [_round(2.0)] * 5).words() == "no 0/5"
    mixed = compare_rounds([_round(x) for x in (1.0, 3.0, 1.0, 3.0, 3.0)], [_round(2.0)] * 5)
    assert (mixed.verdict, mixed.held, mixed.count) == ("mixed", 2, 5)
    assert mixed.ratios == pytest.approx([0.5, 1.5, 0.5, 1.5, 1.5])
    assert compare_rounds([_round(50.0), _round(150.0)], 100.0).words() == "mixed 1/2"


def test_the_tables_fit_a_terminal_and_the_verdict_shows_its_spread() -> None:
    md = markdown(_report(_row(3, [0.3] * 5, [0.1] * 5, [0.9] * 5),
                          _row(10, [1.2, 0.8, 1.3, 0.9, 1.1], [0.2] * 5, [1.0] * 5)))
    main, details = _tables(md)
    assert all(len(line) <= MAX_WIDTH for line in main + details), max(main + details, key=len)
    assert main[0].count("|") - 1 == 8 and main[0].endswith("| ≤ NATS |")
    assert main[2].endswith("| yes 5/5 | yes 5/5 |")  # 3 nodes: every round under NATS and the budget
    assert main[3].endswith("| yes 5/5 | mixed 2/5 |") and "(0.80–1.30)" in main[3]
    assert "5 rounds of 40 messages each" in md and '"mixed" when they do not' in md
    assert [line.split("|")[2].strip() for line in details[2:]] == ["ours", "floor", "NATS"] * 2
    assert "Backend: docker backend: one host-network container each (image attested-mesh-node:0.1.0-abc)." in md


def test_a_row_without_rounds_gives_the_pooled_verdict() -> None:
    row = _row(3, [0.3] * 5, [0.1] * 5, [0.9] * 5)
    del row["rounds"]
    main, _ = _tables(markdown(_report(row)))
    assert main[2].endswith("| yes | yes |")
