"""A service on another service's store with other hooks or another permission gate: a bench's modes take turns
on one store, each through a service built with its own parts (nothing is swapped on a live service)."""

from __future__ import annotations

from node.hooks import Hooks
from node.permissions.gate import Gate
from node.service import Service
from node.writepath import WritePath


def variant(svc: Service, *, hooks: Hooks | None = None, gate: Gate | None = None) -> Service:
    """``svc``'s store, replication, approvals and events, with ``hooks`` (None: none) and ``gate`` (None: no
    permissions). Close only ``svc``: the variant shares its database."""
    w = svc.writes
    return Service(WritePath(w.cfg, w.db, w.keyring, hooks=hooks, gate=gate, approvals=w.approvals,
                             replicator=w.replicator, events=w.events), clock=svc.clock)
