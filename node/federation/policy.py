"""Who sees what: which peers a memory, link or transcript may go to, and who may write a memory's versions.

Pure answers from this node's ``[federation]`` policy and the ``share_with`` list a memory carries; only
``link_visible`` reads (a link's two ends, inside the caller's transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from node.config import FederationConfig
from storage import memories
from storage.links import LinkRow
from storage.memories import MemoryRow, Reach


class Policy:
    """This node's sharing policy towards its configured peers (``peers``, in configuration order)."""

    def __init__(self, federation: FederationConfig, peers: Sequence[str]) -> None:
        self.federation = federation
        self.peers = tuple(peers)

    def reconfigure(self, federation: FederationConfig, peers: Sequence[str]) -> None:
        """The policy and peers a configuration reload (SIGHUP) put in force; every later answer follows them."""
        self.federation = federation
        self.peers = tuple(peers)

    def shares(self, peer: str, namespace: str) -> bool:
        """This node's own policy lets ``peer`` see ``namespace``."""
        policy = self.federation.namespaces.get(namespace)
        return policy is None or peer in policy.peers

    def visible_to(self, peer: str, m: MemoryRow | Reach) -> bool:
        """``peer`` may see memory ``m``: by this node's policy and by the list that travelled with it."""
        return self.shares(peer, m.namespace) and (m.share_with is None or peer in m.share_with)

    def may_write(self, writer: str, origin: str, namespace: str) -> bool:
        """A version of a memory created by ``origin`` may be written by ``writer``."""
        policy = self.federation.namespaces.get(namespace)
        return writer == origin or (policy is not None and writer in policy.writers)

    def audience(self, scope: Sequence[MemoryRow]) -> list[str]:
        """Configured peers that may see every memory in ``scope`` (by policy and by ``share_with``)."""
        return [p for p in self.peers if all(self.visible_to(p, m) for m in scope)]

    def all_visible(self, peer: str, ids: set[str], found: dict[str, Reach]) -> bool:
        """Every id in ``ids`` is in ``found`` (as read) and ``peer`` may see it."""
        return {i for i, m in found.items() if self.visible_to(peer, m)} == ids

    def link_visible(self, conn: Any, peer: str, link: LinkRow) -> bool:
        """``peer`` may see both memories ``link`` joins (read in the caller's transaction)."""
        ends = memories.get_many(conn, {link.src_id, link.dst_id})
        return len(ends) == len({link.src_id, link.dst_id}) and all(self.visible_to(peer, m) for m in ends.values())
