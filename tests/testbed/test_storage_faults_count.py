"""testbed/bench/storage_faults.py's counting, on writes it is given: a write missing on one node, or stored twice
on one, is counted against the fault it was acknowledged in, and a write whose call overlapped a fault is kept out
of the baseline. (The run itself, with its real faults, is a benchmark, not a test.)"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from testbed.bench.pg_faults import Writers
from testbed.bench.storage_faults import NODES, FaultResult, Window, fault_tallies, latency_rows


def _writers(acked: dict[int, list[tuple[str, float, float]]]) -> dict[int, Writers]:
    """Writers that never ran, holding (content, sent, answered) acknowledged writes per node."""
    out = {}
    for node in NODES:
        w = Writers(Path("unused.sock"), 1, f"node-{node}")
        for content, sent, answered in acked.get(node, []):
            w.acked.append(content)
            w.acked_at.append(answered)
            w.latencies_s.append(answered - sent)
        out[node] = w
    return out


def test_a_write_missing_or_doubled_on_one_node_counts_against_its_fault() -> None:
    writers = _writers({1: [("a", 0.0, 1.0), ("b", 1.0, 2.0), ("c", 10.0, 11.0)],
                        2: [("d", 1.0, 1.5), ("e", 20.0, 20.1)]})
    windows = [Window("pg restart", 1, began=0.5, ended=3.0, spans={1: (1, 2), 2: (0, 1), 3: (0, 0)},
                      refused={"storage_unavailable": 4}),
               Window("disk full", 1, began=9.0, ended=12.0, spans={1: (2, 3), 2: (1, 1), 3: (0, 0)},
                      refused={"storage_full": 2})]
    everywhere = Counter({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1})
    stored = {1: everywhere.copy(), 2: everywhere - Counter({"c": 1}), 3: everywhere + Counter({"d": 1})}

    pg, full = fault_tallies(windows, writers, stored)

    assert (pg.fault, pg.acked, pg.lost, pg.duplicated, pg.refused) == (
        "pg restart", 2, 0, 1, {"storage_unavailable": 4})  # b and d; d stored twice on node-3
    assert (full.fault, full.acked, full.lost, full.duplicated) == ("disk full", 1, 1, 0)  # c, missing on node-2


def test_a_write_whose_call_overlapped_a_fault_is_not_in_the_baseline() -> None:
    writers = _writers({1: [("a", 0.0, 1.0), ("b", 2.0, 7.0), ("c", 8.0, 8.01), ("d", 9.0, 9.02)]})
    windows = [Window("pg restart", 1, began=3.0, ended=4.0, spans={1: (1, 1), 2: (0, 0), 3: (0, 0)}, refused={})]
    result = FaultResult("pg restart", 1, 1, "storage_unavailable", 0.1, 1.0, True, 0, {})

    (row,) = latency_rows([result], windows, writers)

    assert (row.fault, row.node, row.during.samples, row.during.p50_ms) == ("pg restart", 1, 1, 5000.0)
    assert (row.healthy.samples, row.healthy.p99_ms) == (3, 1000.0)
