"""Builds a node's pieces in one direction: the store first (``open_store``), then its federation and service
(``assemble``), which a running node does with its outbox sender already built as their ``Delivery``.

The service sees federation only as its ``Replicator``; federation never sees the service. Both share one
``Keyring`` and one ``Database``. The checks every local write passes are one ``WritePath``, built here and given
to the service (which hands it to its knowledge graph and transcripts); the webhook subscriptions are the one
``EventSink`` the write path, the approvals and the federation's inbound side publish to. Every writer (the node,
the CLI beside it, an embedded MCP server) builds its service here, so its writes replicate: the outbox is in the
database. ``open_service`` is both steps for a process that runs no sender (the CLI, MCP): its rows wait in the
database for the node's poll.
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.keys import Identity
from node import priority
from node.agents.book import AgentBook
from node.config import NodeConfig
from node.events.webhooks import Webhooks
from node.federation import Delivery, Federation, NoDelivery, peer_rate_of
from node.federation.outbound import AckSignal, PeerAccepts
from node.hooks import Hooks
from node.hooks.pipeline import HookPipeline
from node.permissions.approvals import Approvals, signer
from node.permissions.gate import Gate
from node.ratelimit import RateLimiter
from node.service import Clock, Service, now_ms
from node.trust import Keyring, load_node_identity
from node.writepath import WritePath
from storage.backend import open_database
from storage.db import Database


@dataclass(frozen=True, slots=True)
class Store:
    """A home opened for writing: its identity (None when the home has no node key and none was required), the
    keyring, the operator hooks, the database and the permission gate that local and peer writes share."""

    cfg: NodeConfig
    identity: Identity | None
    keyring: Keyring
    hooks: Hooks
    db: Database
    gate: Gate

    async def close(self) -> None:
        """Close what was opened (for a store whose service was never built: a service's ``close`` does it)."""
        await self.hooks.close()
        await self.db.close()


@dataclass(frozen=True, slots=True)
class Assembled:
    """What ``assemble`` built on a store."""

    service: Service
    federation: Federation
    webhooks: Webhooks


async def open_store(cfg: NodeConfig, *, require_identity: bool = False, hooks: Hooks | None = None) -> Store:
    """Open the home's store; ``require_identity`` refuses a home without a node key.

    ``hooks`` defaults to the pipeline of the home's hooks file (docs/hooks.md): hooks apply whichever
    process writes, as replication does. An invalid hooks file refuses the open (HookError).
    """
    identity = load_node_identity(cfg, required=require_identity)
    keyring = Keyring(cfg, identity)
    if hooks is None:
        hooks = HookPipeline.open(cfg)
    st = cfg.storage
    db = await open_database(backend=st.backend, path=cfg.db_path, dsn=st.dsn, batch_max=st.batch_max,
                             readers=st.readers, synchronous=st.synchronous, age=st.age,
                             fts_merge_pages=st.fts_merge_pages)
    if db.writer_thread_id is not None:
        priority.lower(db.writer_thread_id, cfg.federation.background_nice)
    # One permission gate for local operations and peer writes (docs/permissions.md).
    try:
        gate = await Gate.open(cfg, db)
    except BaseException:
        await db.close()
        raise
    return Store(cfg, identity, keyring, hooks, db, gate)


def assemble(store: Store, *, clock: Clock = now_ms, delivery: Delivery | None = None,
             accepts: PeerAccepts | None = None, acks: AckSignal | None = None,
             peer_rate: RateLimiter | None = None) -> Assembled:
    """The federation and the service on ``store``. ``delivery`` takes each write's rows after its commit (the
    node's sender; none: they wait for the node's poll); ``accepts`` and ``acks`` are the ones the sender's
    listener was given; ``peer_rate`` replaces the budget limits.peer_requests_per_second makes (a test's frozen
    clock)."""
    cfg, db = store.cfg, store.db
    webhooks = Webhooks(cfg, db, clock)
    # The delegations held here: the federation verifies, sends and serves by them; the service makes its agents'.
    agents = AgentBook(db, store.keyring)
    # Peers' memories and links reach subscribers as local ones do.
    federation = Federation(cfg, db, store.keyring, clock, delivery=delivery or NoDelivery(),
                            peer_rate=peer_rate if peer_rate is not None else peer_rate_of(cfg), events=webhooks,
                            hooks=store.hooks, gate=store.gate, accepts=accepts, acks=acks, agents=agents)
    approvals = Approvals(cfg, db, store.hooks, clock, store.keyring.agent_id, signer(store.identity),
                          events=webhooks)
    writes = WritePath(cfg, db, store.keyring, hooks=store.hooks, gate=store.gate, approvals=approvals,
                       replicator=federation, events=webhooks)
    return Assembled(Service(writes, clock=clock, webhooks=webhooks, agents=agents), federation, webhooks)


async def open_service(cfg: NodeConfig, *, clock: Clock = now_ms, require_identity: bool = False,
                       hooks: Hooks | None = None) -> Service:
    """Open the store with its federation, for a process that runs no sender (the CLI, MCP, tests); see
    ``open_store`` for ``require_identity`` and ``hooks``."""
    store = await open_store(cfg, require_identity=require_identity, hooks=hooks)
    try:
        return assemble(store, clock=clock).service
    except BaseException:
        await store.close()
        raise
