"""The fan-out bench's figures: exact nearest-rank percentiles of the all-ACK latencies, throughput, CPU per
message, and the result row `testbed bench` reports for one node count (on loopback or under netem)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# Design budgets for the all-ACK p95 (DESIGN.md section 7), ms by node count.
BUDGET_P95_MS = {3: 100.0, 5: 250.0, 10: 500.0}

# One side's measurement: (latencies s, wall s, each receiver's CPU s, the sender's CPU s).
Measured = tuple[list[float], float, list[float], float]


@dataclass(frozen=True)
class Figures:
    """One side (ours or floor) of one N: latencies in ms, throughput in messages/s, CPU in ms."""

    samples: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    throughput_msg_s: float
    cpu_ms_per_msg_per_receiver: float  # mean over the N-1 receiver processes
    cpu_ms_per_msg_receivers: list[float]
    cpu_ms_per_msg_sender: float  # this (bench) process


def percentile(sorted_s: list[float], p: float) -> float:
    """Nearest-rank percentile of exact sorted samples (no interpolation)."""
    rank = max(1, math.ceil(p / 100.0 * len(sorted_s)))
    return sorted_s[rank - 1]


def figures(samples_s: list[float], wall_s: float, receiver_cpu_s: list[float], sender_cpu_s: float) -> Figures:
    s = sorted(samples_s)
    n = len(s)
    per_rx = [c / n * 1e3 for c in receiver_cpu_s]
    return Figures(samples=n, p50_ms=percentile(s, 50) * 1e3, p95_ms=percentile(s, 95) * 1e3,
                   p99_ms=percentile(s, 99) * 1e3, max_ms=s[-1] * 1e3, mean_ms=sum(s) / n * 1e3,
                   throughput_msg_s=n / wall_s, cpu_ms_per_msg_per_receiver=sum(per_rx) / len(per_rx),
                   cpu_ms_per_msg_receivers=per_rx, cpu_ms_per_msg_sender=sender_cpu_s / n * 1e3)


def result_row(nodes: int, messages: int, warmup: int, frame_bytes: int, ours: Measured, floor: Measured,
               **before_nats_ratios: Any) -> dict[str, Any]:
    """One node count's row: our figures against the floor's and the budget; the NATS keys empty (the caller
    fills them when NATS ran); ``before_nats_ratios`` keys go after ``nats``; ``_samples`` for the CDFs."""
    o, f = figures(*ours), figures(*floor)
    budget = BUDGET_P95_MS.get(nodes)
    return {"nodes": nodes, "messages": messages, "warmup": warmup, "frame_bytes": frame_bytes,
            "budget_p95_ms": budget, "within_budget": None if budget is None else o.p95_ms <= budget,
            "ratio_p95": o.p95_ms / f.p95_ms, "ratio_p50": o.p50_ms / f.p50_ms,
            "ours": asdict(o), "floor": asdict(f), "nats": None, **before_nats_ratios,
            "ratio_p95_nats": None, "ratio_p50_nats": None, "p95_le_nats": None,
            "_samples": {"ours": sorted(ours[0]), "floor": sorted(floor[0])}}
