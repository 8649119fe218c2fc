"""Builds a node's service and its federation and wires them in one direction.

The service sees federation only as its ``Replicator``; federation never sees the service. Both
share one ``Keyring`` and one ``Database``. Every writer (the node, the CLI beside it, an embedded
MCP server) builds its service here, so its writes replicate: the outbox is in the database.
"""

from __future__ import annotations

from node.config import NodeConfig
from node.federation import Federation
from node.service import Clock, Service, now_ms
from node.trust import Keyring, load_node_identity
from storage.db import Database


async def open_service(cfg: NodeConfig, *, clock: Clock = now_ms, require_identity: bool = False) -> Service:
    """Open the store with its federation; ``require_identity`` refuses a home without a node key."""
    identity = load_node_identity(cfg, required=require_identity)
    keyring = Keyring(cfg, identity)
    db = await Database.open(cfg.db_path, batch_max=cfg.storage.batch_max, readers=cfg.storage.readers,
                             synchronous=cfg.storage.synchronous)
    federation = Federation(cfg, db, keyring, clock)
    return Service(cfg, db, keyring, clock=clock, replicator=federation)


def federation_of(svc: Service) -> Federation:
    """The Federation behind a service built by ``open_service`` (the node runs its inbound side)."""
    fed = svc.replicator
    if not isinstance(fed, Federation):
        raise TypeError("this service was not built by node.assemble.open_service")
    return fed
