"""Builds a node's service and its federation and wires them in one direction.

The service sees federation only as its ``Replicator``; federation never sees the service. Both
share one ``Keyring`` and one ``Database``. The checks every local write passes are one ``WritePath``,
built here and given to the service (which hands it to its knowledge graph and transcripts); the webhook
subscriptions are the one ``EventSink`` the write path and the approvals publish to. Every writer (the
node, the CLI beside it, an embedded MCP server) builds its service here, so its writes replicate: the
outbox is in the database.
"""

from __future__ import annotations

from node import priority
from node.config import NodeConfig
from node.events.webhooks import Webhooks
from node.federation import Federation
from node.hooks import Hooks
from node.hooks.pipeline import HookPipeline
from node.permissions.approvals import Approvals, signer
from node.permissions.gate import Gate
from node.service import Clock, Service, now_ms
from node.trust import Keyring, load_node_identity
from node.writepath import WritePath
from storage.backend import open_database


async def open_service(cfg: NodeConfig, *, clock: Clock = now_ms, require_identity: bool = False,
                       hooks: Hooks | None = None) -> Service:
    """Open the store with its federation; ``require_identity`` refuses a home without a node key.

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
    federation = Federation(cfg, db, keyring, clock, hooks=hooks, gate=gate)
    webhooks = Webhooks(cfg, db, clock)
    approvals = Approvals(cfg, db, hooks, clock, keyring.agent_id, signer(identity), events=webhooks)
    federation.sinks.append(webhooks.publish)  # peers' memories and links reach subscribers as local ones do
    writes = WritePath(cfg, db, keyring, hooks=hooks, gate=gate, approvals=approvals, replicator=federation,
                       events=webhooks)
    return Service(writes, clock=clock, webhooks=webhooks)


def federation_of(svc: Service) -> Federation:
    """The Federation behind a service built by ``open_service`` (the node runs its inbound side)."""
    fed = svc.replicator
    if not isinstance(fed, Federation):
        raise TypeError("this service was not built by node.assemble.open_service")
    return fed
