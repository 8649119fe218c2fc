"""Call latencies as plain counts per key, for a histogram read at scrape time (``aimem_mcp_call_seconds``).

Kept apart from ``node.metrics`` so that what observes (the MCP backend, also in an embedded ``ai-memory mcp``)
does not load prometheus_client. Times are seconds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# A tool call is milliseconds for a read and up to seconds for a write under load or a hook's deadline.
CALL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Latency:
    """One key's observations: per-bucket counts (the last one past every bound), their sum in seconds."""
    counts: list[int] = field(default_factory=lambda: [0] * (len(CALL_BUCKETS_S) + 1))
    sum_s: float = 0.0

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, observations <= le)`` per bound and ``+Inf``, as a Prometheus histogram's buckets."""
        out, total = [], 0
        for bound, n in zip((*(repr(b) for b in CALL_BUCKETS_S), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class LatencyTally:
    """Latencies by key (a tool name): ``observe(key, seconds)``; ``by_key`` is read at scrape time."""

    def __init__(self) -> None:
        self.by_key: dict[str, Latency] = {}

    def observe(self, key: str, seconds: float) -> None:
        one = self.by_key.setdefault(key, Latency())
        one.counts[bisect.bisect_left(CALL_BUCKETS_S, seconds)] += 1
        one.sum_s += seconds
