"""The benches' shared figures (one percentile, the machine a run was on, its JSON written) and the fan-out
bench's: exact nearest-rank percentiles of the all-ACK latencies, throughput, CPU per message, and the result row
`testbed bench` reports for one node count (on loopback or under netem)."""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Design budgets for the all-ACK p95 (the first design's, ../shared/DESIGN.md section 7), ms by node count.
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


def machine() -> dict[str, Any]:
    """What a bench ran on, for its JSON."""
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}


def save(res: dict[str, Any], out: Path) -> Path:
    """``res`` with ``machine()`` as JSON at ``out`` (its folder made)."""
    res["machine"] = machine()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    return out


def pct(samples: list[float], p: float) -> float:
    """The ``p``-th percentile (0-100) of samples in any order: the sorted sample whose index is nearest p% of the
    way through them (no interpolation). Every bench reports its p50/p95/p99 through this one."""
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def ms_stats(xs: list[float]) -> dict[str, float]:
    """Count and p50/p95/p99 of samples in ms (``pct``)."""
    return {"n": len(xs), "p50_ms": pct(xs, 50), "p95_ms": pct(xs, 95), "p99_ms": pct(xs, 99)}


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


@dataclass(frozen=True)
class Rounds:
    """One comparison (ours against another side, or against the budget) over the bench's rounds: each round's
    p95 ratio ours/other and how many rounds kept ours at or under the other."""

    count: int
    ratios: list[float]
    held: int  # rounds whose p95 ratio is <= 1

    @property
    def verdict(self) -> str:
        """"yes" (every round holds), "no" (none does) or "mixed" (the rounds disagree: within this run's noise)."""
        return "yes" if self.held == self.count else "no" if self.held == 0 else "mixed"

    def words(self) -> str:
        """The verdict with the rounds that hold, e.g. "yes 5/5" or "mixed 3/5"."""
        return f"{self.verdict} {self.held}/{self.count}"


def compare_rounds(ours: list[list[float]], other: list[list[float]] | float) -> Rounds:
    """Round by round: ours' p95 against the other side's p95 in the same round (``other`` rounds of samples in
    seconds), or against a fixed budget (``other`` in ms)."""
    ratios = []
    for i, mine in enumerate(ours):
        theirs = other if isinstance(other, float) else percentile(sorted(other[i]), 95) * 1e3
        ratios.append(percentile(sorted(mine), 95) * 1e3 / theirs)
    return Rounds(count=len(ratios), ratios=ratios, held=sum(r <= 1.0 for r in ratios))


def rounds_summary(ours: list[list[float]], floor: list[list[float]], nats: list[list[float]] | None,
                   budget_ms: float | None) -> dict[str, Any]:
    """bench.json's ``rounds``: per comparison, each round's p95 ratio and the verdict with its spread."""
    out: dict[str, Any] = {"count": len(ours), "messages": [len(r) for r in ours]}
    pairs: dict[str, list[list[float]] | float | None] = {"floor": floor, "nats": nats, "budget": budget_ms}
    for name, other in pairs.items():
        if other is not None:
            r = compare_rounds(ours, other)
            out[name] = {"p95_ratios": r.ratios, "held": r.held, "verdict": r.verdict, "words": r.words()}
    return out
