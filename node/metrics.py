"""Prometheus metrics of one node: its own ``CollectorRegistry`` (never the process-global one), read live.

Gauges and counters are taken from the node's state at scrape time (``NodeMetrics.render`` reads a
``Scrape`` first, then the collector turns it into families); only the ACK latency histogram is observed as
ACKs arrive. ``/metrics`` on the plain health port (``mesh.health_port``) serves ``render()``.
"""

from __future__ import annotations

import platform
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from node.latency import Latency

PREFIX = "aimem"
# ACK round trips are milliseconds on a LAN and seconds under retries; a2a.ack_timeout_s caps one wait.
ACK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class PeerScrape:
    state: str
    outbox_depth: int
    dead_letters: int
    last_sync_seq: int
    parked: int
    # Of the parked items, those waiting for a key of their signer (unknown_key).
    parked_unknown_key: int
    # When the last pull of the peer's change log completed (unix seconds); None before the first one.
    sync_last_pull_unix_s: float | None
    # Seqs of the peer's change log not pulled yet (its head at its last page minus our cursor); None before a page.
    sync_lag_seqs: int | None = None
    # Items received in the peer's sync pages since start.
    sync_pulled: int = 0


@dataclass(frozen=True)
class StorageScrape:
    """One condition of the store (storage_unavailable, storage_corrupt, storage_full): in force now, and how many
    times it began since start."""
    in_force: bool
    began: int


@dataclass(frozen=True)
class Scrape:
    """What the node is at one instant, as plain values."""
    peers: Mapping[str, PeerScrape]
    rejections: Mapping[str, int]
    hooks: Mapping[tuple[str, str], int]
    mcp_calls: Mapping[tuple[str, str], int]
    ready: bool
    writer_busy_s: float
    delivered: int = 0
    dead_lettered: int = 0
    storage: Mapping[str, StorageScrape] = field(default_factory=dict)
    # Seconds the last integrity check of the store took; None before the first (or on a backend without one).
    integrity_check_s: float | None = None
    # The database's size on disk (SQLite: the file and its WAL; Postgres: pg_database_size); None when unknown.
    storage_bytes: int | None = None
    # Seconds per MCP tool call, by tool.
    mcp_latency: Mapping[str, Latency] = field(default_factory=dict)
    # This build's version (aimem_build_info).
    version: str = ""
    # MCP calls by agent (this node's agents and the node itself) and outcome.
    agent_calls: Mapping[tuple[str, str], int] = field(default_factory=dict)


LINK_STATES = ("connecting", "up", "down", "closed")


class _Collector(Collector):
    def __init__(self, current: Callable[[], Scrape | None]) -> None:
        self._current = current

    def collect(self) -> Iterator[Metric]:
        s = self._current()
        if s is None:
            return
        yield from _peer_families(s)
        rejections = CounterMetricFamily(f"{PREFIX}_rejections", "Inbound messages refused, by code", labels=["code"])
        for code, n in sorted(s.rejections.items()):
            rejections.add_metric([code], n)
        yield rejections
        hooks = CounterMetricFamily(f"{PREFIX}_hook_outcomes", "Hook runs by hook and outcome",
                                    labels=["hook", "outcome"])
        for (hook, outcome), n in sorted(s.hooks.items()):
            hooks.add_metric([hook, outcome], n)
        yield hooks
        yield from _mcp_families(s)
        yield CounterMetricFamily(f"{PREFIX}_delivered", "Outbox messages ACKed since start", value=s.delivered)
        yield CounterMetricFamily(f"{PREFIX}_dead_lettered", "Outbox messages dead-lettered since start",
                                  value=s.dead_lettered)
        yield GaugeMetricFamily(f"{PREFIX}_ready", "1 when /readyz answers 200", value=1.0 if s.ready else 0.0)
        yield GaugeMetricFamily(f"{PREFIX}_storage_writer_busy_seconds",
                                "How long the storage writer has been in its current batch (0 when idle)",
                                value=s.writer_busy_s)
        yield from _storage_families(s)
        info = GaugeMetricFamily(f"{PREFIX}_build_info", "1, labelled with this build's version and its Python's",
                                 labels=["version", "python"])
        info.add_metric([s.version, platform.python_version()], 1.0)
        yield info


def _mcp_families(s: Scrape) -> Iterator[Metric]:
    calls = CounterMetricFamily(f"{PREFIX}_mcp_calls", "MCP tool calls by tool and outcome (ok or the error code)",
                                labels=["tool", "outcome"])
    for (tool, outcome), n in sorted(s.mcp_calls.items()):
        calls.add_metric([tool, outcome], n)
    yield calls
    latency = HistogramMetricFamily(f"{PREFIX}_mcp_call_seconds", "MCP tool calls through the node: seconds "
                                    "from the call to its answer, by tool", labels=["tool"])
    for tool, lat in sorted(s.mcp_latency.items()):
        latency.add_metric([tool], lat.cumulative(), sum_value=lat.sum_s)
    yield latency
    by_agent = CounterMetricFamily(f"{PREFIX}_mcp_agent_calls", "MCP tool calls by agent (this node's agents, "
                                   "the node itself) and outcome", labels=["agent", "outcome"])
    for (agent, outcome), n in sorted(s.agent_calls.items()):
        by_agent.add_metric([agent, outcome], n)
    yield by_agent


def _peer_families(s: Scrape) -> Iterator[Metric]:
    depth = GaugeMetricFamily(f"{PREFIX}_outbox_depth", "Messages waiting in the outbox, per peer", labels=["peer"])
    dead = GaugeMetricFamily(f"{PREFIX}_dead_letters", "Messages that exhausted their retries, per peer",
                             labels=["peer"])
    up = GaugeMetricFamily(f"{PREFIX}_peer_link_up", "1 when the link to the peer is up", labels=["peer"])
    state = GaugeMetricFamily(f"{PREFIX}_peer_link_state", "1 for the link's current state",
                              labels=["peer", "state"])
    cursor = GaugeMetricFamily(f"{PREFIX}_sync_cursor", "Last change-log seq pulled from the peer", labels=["peer"])
    last_pull = GaugeMetricFamily(f"{PREFIX}_sync_last_pull_timestamp_seconds", "When the last pull of the peer's "
                                  "change log completed (unix seconds)", labels=["peer"])
    parked = GaugeMetricFamily(f"{PREFIX}_sync_parked", "Sync items from the peer given up on", labels=["peer"])
    unknown_key = GaugeMetricFamily(f"{PREFIX}_sync_parked_unknown_key", "Sync items from the peer parked until "
                                    "a key of their signer verifies them", labels=["peer"])
    lag_seqs = GaugeMetricFamily(f"{PREFIX}_sync_lag_seqs", "Seqs of the peer's change log not pulled yet (its "
                                 "last seq when it served the last page, minus our cursor)", labels=["peer"])
    pulled = CounterMetricFamily(f"{PREFIX}_sync_pulled_items", "Items received in the peer's sync pages since "
                                 "start", labels=["peer"])
    for peer, p in sorted(s.peers.items()):
        depth.add_metric([peer], p.outbox_depth)
        dead.add_metric([peer], p.dead_letters)
        up.add_metric([peer], 1.0 if p.state == "up" else 0.0)
        for st in LINK_STATES:
            state.add_metric([peer, st], 1.0 if p.state == st else 0.0)
        cursor.add_metric([peer], p.last_sync_seq)
        parked.add_metric([peer], p.parked)
        unknown_key.add_metric([peer], p.parked_unknown_key)
        if p.sync_last_pull_unix_s is not None:
            last_pull.add_metric([peer], p.sync_last_pull_unix_s)
        if p.sync_lag_seqs is not None:
            lag_seqs.add_metric([peer], p.sync_lag_seqs)
        pulled.add_metric([peer], p.sync_pulled)
    yield from (depth, dead, up, state, cursor, last_pull, parked, unknown_key, lag_seqs, pulled)


def _storage_families(s: Scrape) -> Iterator[Metric]:
    condition = GaugeMetricFamily(f"{PREFIX}_storage_condition", "1 while the store has this condition (what "
                                  "/readyz reports: away, damaged, full)", labels=["code"])
    began = CounterMetricFamily(f"{PREFIX}_storage_condition_began", "Times the condition began since start",
                                labels=["code"])
    for code, c in sorted(s.storage.items()):
        condition.add_metric([code], 1.0 if c.in_force else 0.0)
        began.add_metric([code], c.began)
    yield from (condition, began)
    if s.integrity_check_s is not None:
        yield GaugeMetricFamily(f"{PREFIX}_storage_integrity_check_seconds",
                                "How long the last integrity check of the store took", value=s.integrity_check_s)
    if s.storage_bytes is not None:
        yield GaugeMetricFamily(f"{PREFIX}_storage_bytes", "The database's size on disk (SQLite: the file and its "
                                "WAL; Postgres: pg_database_size)", value=s.storage_bytes)


class NodeMetrics:
    """One node's registry. ``observe_ack(peer, seconds)`` as ACKs arrive; ``await render(accept)`` at scrape time.

    Besides the node's own families: the process collector (process_cpu_seconds_total, process_resident_memory_bytes,
    process_open_fds, process_start_time_seconds, ...; Linux). No ``_created`` samples: a counter's start is the
    process's (process_start_time_seconds)."""

    def __init__(self, scrape: Callable[[], Awaitable[Scrape]]) -> None:
        # Process-wide in prometheus_client; the node's process holds no other registry that would want them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self._scrape = scrape
        self._last: Scrape | None = None
        self._ack_latency = Histogram(f"{PREFIX}_ack_latency_seconds", "Send to ACK, per peer", ["peer"],
                                      buckets=ACK_BUCKETS_S, registry=self.registry)
        self.registry.register(_Collector(lambda: self._last))

    def observe_ack(self, peer: str, seconds: float) -> None:
        self._ack_latency.labels(peer=peer).observe(seconds)

    async def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition of the node as it is now, and its content type: OpenMetrics when the request's Accept
        header asks for it (``application/openmetrics-text``), else the Prometheus text format."""
        encoder, content_type = choose_encoder(accept)
        # No await between taking the scrape and rendering it: concurrent scrapes cannot mix.
        scrape = await self._scrape()
        self._last = scrape
        return encoder(self.registry), content_type
