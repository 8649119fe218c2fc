"""Outbound: each local write enqueues one envelope per peer that may see it, in the write's own transaction;
after the commit the rows go to the ``Delivery`` (the node's outbox sender), and a write with a quorum above one
waits for its peers' ACKs.

The database stays the truth: rows no running sender takes (a write made by the CLI beside the node) wait in
the outbox for the node's poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from a2a.kinds import AGENT_DELEGATE, AGENT_KINDS, AGENT_REVOKE, LINKS_PUT_MAX_BYTES, LINKS_PUT_MAX_ITEMS, MEMORY_PUT_V2
from node.attest import SIGNED_SET_OLD
from node.config import NodeConfig
from node.errors import ServiceError
from node.federation.forms import AgentForms, MemoryForms
from node.federation.policy import Policy
from node.wire import envelope_wires, memory_put_v2_body
from storage import changelog, outbox
from storage.db import Database
from storage.memories import MemoryRow

# The outbox rows a write enqueued, one per peer (node.service.Queued).
Queued = list[outbox.OutboxRow]
# Payload kinds this node reads beyond the ones every node reads, listed in its sync pages (``accepts``) and in its
# sync requests: a peer sends it such a payload only once a page (or, for the pages it serves, the request) said so
# (an older node says nothing: it gets one link per envelope, and memory versions as forms.py says).
ACCEPTS = ("links.put", MEMORY_PUT_V2, AGENT_DELEGATE, AGENT_REVOKE)
# Quorum waits recheck the outbox at least this often (ACKs made by another process wake nobody here).
QUORUM_RECHECK_S = 0.05


class Delivery(Protocol):
    """Takes the rows a write enqueued, once committed (the node's ``OutboxSender``)."""

    def hand_off(self, rows: Sequence[outbox.OutboxRow]) -> None: ...


class NoDelivery:
    """The delivery of a process that runs no sender (the CLI): rows wait in the database for the node's poll."""

    def hand_off(self, rows: Sequence[outbox.OutboxRow]) -> None:
        return None


class LatencyObserver(Protocol):
    """Told how long each ACK took (the node's metrics)."""

    def observe_ack(self, peer: str, seconds: float) -> None: ...


class PeerAccepts:
    """What each peer's last sync page said it accepts beyond the common kinds (``ACCEPTS``); none until then.
    The node records each change in the store (``storage.changelog.set_peer_accepts``), and every process that
    writes reads them from there before its first enqueue (``load``), so the CLI beside a node queues the forms
    the node's peers read."""

    def __init__(self) -> None:
        self._by_peer: dict[str, frozenset[str]] = {}
        self._loaded = False

    def load(self, conn: Any) -> None:
        """Once a process, in a write's transaction: the kinds recorded for the peers this process has not heard
        from itself."""
        if self._loaded:
            return
        self._loaded = True
        for peer, kinds in changelog.peer_accepts(conn).items():
            if peer not in self._by_peer:
                self._by_peer[peer] = frozenset(k for k in kinds if k in ACCEPTS)

    def of(self, peer: str) -> frozenset[str]:
        return self._by_peer.get(peer, frozenset())

    def takes_link_batches(self, peer: str) -> bool:
        """``peer`` said (in its last sync page) that it reads ``links.put``."""
        return "links.put" in self.of(peer)

    def reads_signed_sharing(self, peer: str) -> bool:
        """``peer`` said (in its last sync page) that it reads ``memory.put.v2``."""
        return MEMORY_PUT_V2 in self.of(peer)

    def reads_agents(self, peer: str) -> bool:
        """``peer`` said (in its last sync page) that it reads the agent kinds (and so what agents sign)."""
        return AGENT_DELEGATE in self.of(peer) and MEMORY_PUT_V2 in self.of(peer)

    def note(self, peer: str, accepts: Any) -> bool:
        """What ``peer``'s sync page listed under ``accepts`` (absent on an older node: nothing beyond the
        common kinds); True when that changed what this node knew of it (the caller records it)."""
        listed = accepts if isinstance(accepts, list) else []
        kinds = frozenset(k for k in listed if isinstance(k, str) and k in ACCEPTS)
        changed = self._by_peer.get(peer) != kinds
        self._by_peer[peer] = kinds
        return changed

    def refuses_link_batches(self, peer: str) -> None:
        """``peer`` answered a links.put ``unknown_kind`` (e.g. rolled back to an older version): one link per
        envelope from now on, until its sync pages list ``links.put`` again."""
        self._by_peer[peer] = self.of(peer) - {"links.put"}


class AckSignal:
    """Wakes the quorum waits of this process when ACKs come in."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()

    async def record_ack(self, peer: str, correlation_ids: Sequence[str]) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait(self, timeout_s: float) -> None:
        """Until the next ACK, or ``timeout_s`` seconds."""
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            pass


class DeliveryFeedback:
    """What the outbox sender tells federation (its listener): ACKs wake quorum waits, a peer refusing
    ``links.put`` gets single links, and each ACK's latency goes to ``latency`` (the node's metrics)."""

    def __init__(self, acks: AckSignal, accepts: PeerAccepts, latency: LatencyObserver | None = None) -> None:
        self.acks = acks
        self.accepts = accepts
        self.latency = latency

    async def on_ack(self, peer: str, correlation_ids: Sequence[str]) -> None:
        await self.acks.record_ack(peer, correlation_ids)

    def on_ack_latency(self, peer: str, seconds: float) -> None:
        if self.latency is not None:
            self.latency.observe_ack(peer, seconds)

    def link_batches_refused(self, peer: str) -> None:
        self.accepts.refuses_link_batches(peer)


class Outbound:
    """Queues this node's changes for its peers (the service's ``Replicator``, through ``Federation``)."""

    def __init__(self, cfg: NodeConfig, db: Database, agent_id: str, policy: Policy, delivery: Delivery,
                 accepts: PeerAccepts, acks: AckSignal, forms: MemoryForms, agent_forms: AgentForms) -> None:
        self.cfg = cfg
        self.db = db
        self.agent_id = agent_id
        self.policy = policy
        self.delivery = delivery
        self.accepts = accepts
        self.acks = acks
        self.forms = forms
        # What agents sign (and their delegations) goes only to peers that read it, naming its delegation.
        self.agent_forms = agent_forms
        self.ttl_ms = int(cfg.a2a.ttl_s * 1000)
        self.links_per_envelope = cfg.federation.links_per_envelope
        self.quorum_timeout_s = cfg.federation.quorum_timeout_s

    def enqueue(self, conn: Any, payload: dict[str, Any], scope: Sequence[MemoryRow], ts: int) -> Queued:
        """Inside the write transaction: one outbox row per peer that may see every memory in ``scope``
        (a memory version: itself; a link: both its ends). Returns the rows queued. A delegation record, or an item
        an agent signed (named with its delegation), goes only to the peers that read the agent kinds."""
        self.accepts.load(conn)
        peers = self.policy.audience(scope)
        if payload["kind"] in AGENT_KINDS:
            peers = self.agent_forms.for_peers(peers, self.accepts.reads_agents, payload["kind"])
        elif peers:  # no peer to send to: no delegation to name
            d = self.agent_forms.delegation_of(conn, payload)
            if d is not None:
                payload = {**payload, "delegation": d.delegation_id}
                peers = self.agent_forms.for_peers(peers, self.accepts.reads_agents, d.agent_id)
        return self._enqueue_to(conn, peers, payload, ts)

    def enqueue_memory(self, conn: Any, row: MemoryRow, ts: int) -> Queued:
        """Inside the write transaction: memory version ``row`` queued for each peer that may see it, in the form
        that peer reads (``MemoryForms``: memory.put.v2, memory.put, or nothing yet). Returns the rows queued."""
        self.accepts.load(conn)
        by_kind: dict[str, tuple[dict[str, Any], list[str]]] = {}
        peers = self.policy.audience([row])
        d = None
        if peers and row.signature is not None and row.signed_set != SIGNED_SET_OLD:
            d = self.agent_forms.delegation_of(conn, {"kind": MEMORY_PUT_V2, **memory_put_v2_body(row)})
        if d is not None:  # an agent's version: as memory.put.v2 naming its delegation, to who reads agents
            peers = self.agent_forms.for_peers(peers, self.accepts.reads_agents, row.id)
        for peer in peers:
            payload = self.forms.payload(row, peer, self.accepts.reads_signed_sharing(peer))
            if payload is not None and d is not None:
                payload = {**payload, "delegation": d.delegation_id}
            if payload is not None:
                by_kind.setdefault(payload["kind"], (payload, []))[1].append(peer)
        return [q for payload, peers in by_kind.values() for q in self._enqueue_to(conn, peers, payload, ts)]

    def enqueue_links(self, conn: Any, items: Sequence[tuple[dict[str, Any], Sequence[MemoryRow]]],
                      ts: int) -> list[Queued]:
        """Inside the write transaction: the link.put bodies of one batch of links (each with its scope, both
        ends), queued per peer that may see them; returns each item's rows (a row may carry several items).
        A peer that accepts ``links.put`` gets its links packed into as few envelopes as the bounds allow (one
        outbox row and one ACK for up to ``federation.links_per_envelope`` links); any other peer gets one link.put
        each."""
        self.accepts.load(conn)
        per_item: list[Queued] = [[] for _ in items]
        alone: dict[int, list[str]] = {}  # item -> the peers that get it as a link.put of its own
        packed: dict[str, list[int]] = {}  # peer -> the items it gets in links.put envelopes
        items, audiences = self._agent_links(conn, items)
        for i, audience in enumerate(audiences):
            for peer in audience:
                if self.accepts.takes_link_batches(peer):
                    packed.setdefault(peer, []).append(i)
                else:
                    alone.setdefault(i, []).append(peer)
        groups: dict[tuple[int, ...], list[str]] = {}  # peers that get the same items share their envelopes' encoding
        for peer, taken in packed.items():
            groups.setdefault(tuple(taken), []).append(peer)
        for idx, peers in groups.items():
            for chunk in link_chunks([items[i][0] for i in idx], self.links_per_envelope):
                if len(chunk) == 1:
                    alone.setdefault(idx[chunk[0]], []).extend(peers)
                    continue
                payload = {"kind": "links.put", "links": [items[idx[c]][0] for c in chunk]}
                rows = self._enqueue_to(conn, peers, payload, ts)
                for c in chunk:
                    per_item[idx[c]].extend(rows)
        for i, peers in alone.items():
            per_item[i].extend(self._enqueue_to(conn, peers, {"kind": "link.put", **items[i][0]}, ts))
        return per_item

    def _agent_links(self, conn: Any, items: Sequence[tuple[dict[str, Any], Sequence[MemoryRow]]]
                     ) -> tuple[list[tuple[dict[str, Any], Sequence[MemoryRow]]], list[list[str]]]:
        """The links with their audiences: an agent's link names its delegation and goes only to the peers that
        read agents (one delegation read per signer a batch holds, not per link)."""
        out: list[tuple[dict[str, Any], Sequence[MemoryRow]]] = []
        audiences: list[list[str]] = []
        named: dict[str | None, Any] = {}
        for body, scope in items:
            peers = self.policy.audience(scope)
            signer = body.get("signed_by")
            if signer not in named:
                named[signer] = self.agent_forms.delegation_of(conn, body)
            d = named[signer]
            if d is not None:
                body = {**body, "delegation": d.delegation_id}
                peers = self.agent_forms.for_peers(peers, self.accepts.reads_agents, d.agent_id)
            out.append((body, scope))
            audiences.append(peers)
        return out, audiences

    def _enqueue_to(self, conn: Any, peers: Sequence[str], payload: dict[str, Any], ts: int) -> Queued:
        wires = envelope_wires(self.agent_id, peers, payload, ts, self.ttl_ms)  # validated and encoded once
        queued = []
        for peer, (cid, wire) in zip(peers, wires, strict=True):
            row = outbox.enqueue_row(conn, cid, peer, str(payload["kind"]), wire, ts + self.ttl_ms, ts, ts)
            if row is not None:  # a fresh correlation id: always, unless uuid4 collided
                queued.append(row)
        return queued

    def hand_off(self, queued: Queued) -> None:
        """After the commit: the rows go to the delivery in memory (the database stays the truth: rows it does
        not take are found by the node's poll)."""
        self.delivery.hand_off(queued)

    async def await_quorum(self, queued: Queued, scope: Sequence[MemoryRow]) -> int:
        """Wait until the configured write quorum has ACKed (self counts as one); returns nodes that ACKed.

        A row leaves the outbox only on its peer's ACK, so "gone from the outbox" is the ACK, whichever
        process (this node or a CLI beside it) made the write.
        """
        nodes = 1 + len(self.policy.audience(scope))
        need = self.cfg.quorum_size(nodes)
        if need <= 1:
            return 1
        cids = [q.correlation_id for q in queued]
        timeout = self.quorum_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            acked = 1 + len(cids) - await self.db.read(outbox.undelivered_count, cids)
            if acked >= need:
                return acked
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ServiceError(
                    "quorum_not_reached",
                    f"{acked} of {need} required nodes ({nodes} in the federation for this write) ACKed "
                    f"within {timeout:g} s; the write is committed locally and keeps replicating")
            await self.acks.wait(min(remaining, QUORUM_RECHECK_S))


def link_chunks(bodies: Sequence[dict[str, Any]], most: int = LINKS_PUT_MAX_ITEMS) -> list[list[int]]:
    """Positions of ``bodies`` (link.put bodies) in runs of at most ``most`` links whose encoded size stays
    under LINKS_PUT_MAX_BYTES (each body's size bounded from above: its strings' UTF-8 bytes plus the keys,
    integers and signature of a link.put, which take under 200 bytes)."""
    chunks: list[list[int]] = []
    run: list[int] = []
    size = 0
    for i, body in enumerate(bodies):
        link = body["link"]
        n = 200 + sum(len(v.encode()) for v in (link["src_id"], link["dst_id"], link["relation"],
                                                 link["observed_by"], body["signed_by"] or "",
                                                 body.get("delegation", "")))
        if run and (len(run) == most or size + n > LINKS_PUT_MAX_BYTES):
            chunks.append(run)
            run, size = [], 0
        run.append(i)
        size += n
    if run:
        chunks.append(run)
    return chunks
