"""``Federation``: the room's parts for one node, composed once — outbound (the service's ``Replicator``),
inbound (the mesh receiver's ``apply``), the sync pages served and the pulled pages applied.

It decides nothing itself: each call goes to the part that owns it. ``node.assemble`` builds it and hands it
to the node; nothing here imports the service.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from a2a import Ack, Envelope
from mesh.server import SyncQuery
from node.agents.book import AgentBook
from node.config import NodeConfig
from node.events import EventSink, NoEvents
from node.federation.forms import AgentForms, MemoryForms
from node.federation.inbound import Inbound
from node.federation.inbound.common import Applied, ApplyContext, Arrivals, Clock, GateChecks
from node.federation.outbound import ACCEPTS, AckSignal, Delivery, Outbound, PeerAccepts, Queued
from node.federation.policy import Policy
from node.federation.sync import PulledPages, SyncOutcome, SyncPages
from node.federation.verify import Attester, SignerKeys, VerifyBatcher, verify_thread
from node.hooks import Hooks, NoHooks
from node.permissions.gate import Gate
from node.ratelimit import RateLimiter
from node.trust import Keyring
from storage.db import Database
from storage.memories import MemoryRow


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
        self.verifier = VerifyBatcher(verify_thread(cfg.federation.background_nice))
        ctx = ApplyContext(cfg=cfg, db=db, clock=clock, policy=self.policy,
                           attester=Attester(SignerKeys(keyring), self.verifier, db, self.counters, self.agents,
                                             cfg.federation.orphan_hold_s),
                           # The same permission gate as local operations: a peer's write is admitted as a local one.
                           gate=GateChecks(gate), hooks=hooks if hooks is not None else NoHooks(),
                           events=events if events is not None else NoEvents(), counters=self.counters,
                           arrivals=Arrivals(db, self.policy, cfg.federation.orphan_hold_s))
        self.inbound = Inbound(ctx, self.agent_id, peer_rate)
        self.pages = SyncPages(cfg, db, self.policy, clock, peer_rate, self.counters, self.forms, agent_forms)
        self.pulled = PulledPages(self.inbound, db, clock, cfg.federation.sync_park_after, keyring,
                                  cfg.federation.sync_park_max, self.agents)

    def close(self) -> None:
        self.verifier.close()

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
