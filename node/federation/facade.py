"""``Federation``: the room's parts for one node, composed once — outbound (the service's ``Replicator``),
inbound (the mesh receiver's ``apply``), the sync pages served and the pulled pages applied.

It decides nothing itself: each call goes to the part that owns it. ``node.assemble`` builds it and hands it
to the node; nothing here imports the service.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from node.agents.book import AgentBook
from node.config import NodeConfig
from node.events import EventSink
from node.federation.forms import AgentForms, MemoryForms
from node.federation.outbound import ACCEPTS, AckSignal, Delivery, Outbound, PeerAccepts, Queued
from node.federation.policy import Policy
from node.hooks import Hooks
from node.permissions.gate import Gate
from node.ratelimit import RateLimiter
from node.trust import Keyring
from storage.db import Database
from storage.memories import MemoryRow

if TYPE_CHECKING:  # the mesh server (and its HTTP stack) is the node's, not a CLI command's
    from a2a import Ack, Envelope
    from mesh.server import SyncQuery
    from node.federation.inbound import Inbound
    from node.federation.inbound.common import Applied
    from node.federation.pages import SyncPages
    from node.federation.sync import PulledPages, SyncOutcome
    from node.federation.verify import VerifyBatcher

Clock = Callable[[], int]


def peer_rate_of(cfg: NodeConfig) -> RateLimiter | None:
    """The per-peer request budget limits.peer_requests_per_second sets (None: no limit)."""
    rate = cfg.limits.peer_requests_per_second
    return RateLimiter(rate) if rate else None


class Federation:
    """The node's federation: what goes to which peer, how peers' changes are applied, and the catch-up pages.

    ``delivery`` takes the rows a write enqueued once committed (the node's outbox sender; ``NoDelivery`` in
    the CLI). ``events`` is told of each stored inbound memory and link (the webhooks). ``accepts`` and ``acks``
    are shared with the sender's listener (``DeliveryFeedback``), built before the sender. ``peer_rate``: each
    peer's request budget, shared by its live messages and the sync pages it reads (None: no limit). ``agents``:
    the delegations this node holds (shared with the service's local agents).
    """

    def __init__(self, cfg: NodeConfig, db: Database, keyring: Keyring, clock: Clock, *, delivery: Delivery,
                 peer_rate: RateLimiter | None, events: EventSink | None = None, hooks: Hooks | None = None,
                 gate: Gate | None = None, accepts: PeerAccepts | None = None, acks: AckSignal | None = None,
                 agents: AgentBook | None = None) -> None:
        self.agent_id = keyring.agent_id
        # Inbound outcomes by key (rejected:<code>, memory:stored, link:<level>, ...), for /metrics and status.
        self.counters: Counter[str] = Counter()
        self.peer_rate = peer_rate
        self.policy = Policy(cfg.federation, [p.agent_id for p in cfg.mesh.peers])
        self.accepts = accepts if accepts is not None else PeerAccepts()
        # The form each peer gets a memory version in (withheld ones counted with the inbound outcomes).
        self.forms = MemoryForms(keyring.identity, self.counters)
        # The delegations held here: what agents sign is verified, sent and served by them.
        self.agents = agents if agents is not None else AgentBook(db, keyring)
        agent_forms = AgentForms(self.agents, self.forms)
        self.outbound = Outbound(cfg, db, self.agent_id, self.policy, delivery, self.accepts,
                                 acks if acks is not None else AckSignal(), self.forms, agent_forms)
        # The inbound side (verifier thread, apply, sync pages) is built at its first use: a CLI command or an
        # embedded MCP server only enqueues, and importing and building the receive path was most of its start-up.
        self._parts = _InboundParts(cfg, db, keyring, clock, events, hooks, gate, agent_forms)
        self._closed = False

    def close(self) -> None:
        self._closed = True
        if "verifier" in self.__dict__:  # never built: no thread to stop
            self.verifier.close()

    @cached_property
    def verifier(self) -> VerifyBatcher:
        """The one signature-verifying thread's batcher (``federation.background_nice``); after ``close`` one
        already shut (a check then fails as it did on a verifier built at construction and closed)."""
        from node.federation.verify import VerifyBatcher, verify_thread

        batcher = VerifyBatcher(verify_thread(self._parts.cfg.federation.background_nice))
        if self._closed:
            batcher.close()
        return batcher

    @cached_property
    def inbound(self) -> Inbound:
        """Peers' changes applied: verified by the same keys, admitted by the same gate, hooks and events as local
        writes."""
        from node.events import NoEvents
        from node.federation.inbound import Inbound
        from node.federation.inbound.common import ApplyContext, Arrivals, GateChecks
        from node.federation.verify import Attester, SignerKeys
        from node.hooks import NoHooks

        p = self._parts
        orphan_hold_s = p.cfg.federation.orphan_hold_s
        ctx = ApplyContext(cfg=p.cfg, db=p.db, clock=p.clock, policy=self.policy,
                           attester=Attester(SignerKeys(p.keyring), self.verifier, p.db, self.counters, self.agents,
                                             orphan_hold_s),
                           # The same permission gate as local operations: a peer's write is admitted as a local one.
                           gate=GateChecks(p.gate), hooks=p.hooks if p.hooks is not None else NoHooks(),
                           events=p.events if p.events is not None else NoEvents(), counters=self.counters,
                           arrivals=Arrivals(p.db, self.policy, orphan_hold_s))
        return Inbound(ctx, self.agent_id, self.peer_rate)

    @cached_property
    def pages(self) -> SyncPages:
        """The sync pages this node serves its peers."""
        from node.federation.pages import SyncPages

        p = self._parts
        return SyncPages(p.cfg, p.db, self.policy, p.clock, self.peer_rate, self.counters, self.forms, p.agent_forms)

    @cached_property
    def pulled(self) -> PulledPages:
        """The sync pages pulled from peers, applied through ``inbound``."""
        from node.federation.sync import PulledPages

        p = self._parts
        fed = p.cfg.federation
        return PulledPages(self.inbound, p.db, p.clock, fed.sync_park_after, p.keyring, fed.sync_park_max,
                           self.agents)

    def reconfigure(self, cfg: NodeConfig) -> None:
        """Follow a reloaded configuration's peers and namespace policies (what goes to whom, who may write)."""
        self.policy.reconfigure(cfg.federation, [p.agent_id for p in cfg.mesh.peers])

    # ---- outbound: the service's Replicator ---------------------------------------------------

    def enqueue(self, conn: Any, payload: dict[str, Any], scope: Sequence[MemoryRow], ts: int) -> Queued:
        return self.outbound.enqueue(conn, payload, scope, ts)

    def enqueue_memory(self, conn: Any, row: MemoryRow, ts: int) -> Queued:
        return self.outbound.enqueue_memory(conn, row, ts)

    def enqueue_links(self, conn: Any, items: Sequence[tuple[dict[str, Any], Sequence[MemoryRow]]],
                      ts: int) -> list[Queued]:
        return self.outbound.enqueue_links(conn, items, ts)

    def hand_off(self, queued: Queued) -> None:
        self.outbound.hand_off(queued)

    async def await_quorum(self, queued: Queued, scope: Sequence[MemoryRow]) -> int:
        return await self.outbound.await_quorum(queued, scope)

    # ---- inbound: the mesh receiver's apply -------------------------------------------------

    async def apply(self, env: Envelope, sender: str) -> Ack:
        return await self.inbound.apply(env, sender)

    def apply_now(self, env: Envelope, sender: str) -> Ack | None:
        return self.inbound.apply_now(env, sender)

    async def apply_payload(self, payload: Any, sender: str, *, pulled: bool = False) -> Applied:
        return await self.inbound.apply_payload(payload, sender, pulled=pulled)

    # ---- catch-up ---------------------------------------------------------------------------

    async def sync_page(self, peer: str, since: int, limit: int, skip: Sequence[str] = (),
                        mine: bool = False, reads: Sequence[str] = ACCEPTS) -> dict[str, Any]:
        """One page for ``peer`` (``mine``: with its own writes, for its restore); ``reads``: the kinds its request
        said it reads beyond the common ones (what the request listed: nothing from an older node)."""
        return await self.pages.page(peer, since, limit, skip, mine, reads)

    async def serve_sync(self, peer: str, query: SyncQuery) -> dict[str, Any]:
        """The mesh server's sync route: one page for ``peer`` as its request asks."""
        return await self.sync_page(peer, query.since, query.limit, query.skip, query.mine, query.accepts)

    async def apply_sync_items(self, peer: str, items: Iterable[Any]) -> SyncOutcome:
        return await self.pulled.apply(peer, items)

    async def retry_pending(self, peer: str) -> SyncOutcome:
        return await self.pulled.retry_pending(peer)

    def note_accepts(self, peer: str, accepts: Any) -> None:
        self.accepts.note(peer, accepts)


class _InboundParts:
    """What the lazily built inbound side of a ``Federation`` is built from (all given at its construction)."""

    def __init__(self, cfg: NodeConfig, db: Database, keyring: Keyring, clock: Clock, events: EventSink | None,
                 hooks: Hooks | None, gate: Gate | None, agent_forms: AgentForms) -> None:
        self.cfg, self.db, self.keyring, self.clock = cfg, db, keyring, clock
        self.events, self.hooks, self.gate, self.agent_forms = events, hooks, gate, agent_forms
