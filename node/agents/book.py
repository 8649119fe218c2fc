"""The delegations a node holds, as the federation reads them: which delegation an agent's item names (and whether
it is here yet), the agent's key it vouches for, and, when an item is sent or served, which delegation to name.

Delegations are immutable once stored (their keys are cached); revocations are read from the store each time, so
one made by another process (``ai-memory agents revoke`` beside a running node) counts at once. ``generation``
moves whenever the store holds more delegation records than this process last saw, so the sync loop verifies again
the items it parked waiting for one (``unknown_delegation``), as it does for keys (node/federation/sync.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from node import attest
from node.attest import Signable
from node.trust import Keyring
from storage import agents
from storage.agents import DelegationRow
from storage.db import Database

# Agent keys kept decoded (a delegation is immutable: its key never changes under its id).
KEY_CACHE = 4096
# The store's delegation tables are looked at for other processes' records at most this often (seconds).
STAMP_RECHECK_S = 1.0
# The change log's ref_id of a delegation or revocation: the record's kind, a colon, its id (its rows ride the
# 'link' change kind, as transcripts do, and the prefix tells them apart without a lookup).
DELEGATE_REF = "agent.delegate:"
REVOKE_REF = "agent.revoke:"


@dataclass(frozen=True, slots=True)
class DelegationState:
    """A stored delegation and the earliest revocation of it here (unix ms; None: not revoked)."""

    row: DelegationRow
    revoked_at: int | None

    def live_at(self, t: int) -> bool:
        """It vouches for what its agent signs at ``t`` (unix ms)."""
        return (self.row.valid_from <= t < self.row.valid_until
                and (self.revoked_at is None or t < self.revoked_at))


class AgentBook:
    """What this node knows of agents: the delegations it holds (its own and its peers'), read through ``db``;
    ``keyring`` says which ids are nodes (this node, its trusted peers), never agents."""

    def __init__(self, db: Database, keyring: Keyring) -> None:
        self.db = db
        self.keyring = keyring
        self._keys: LRUCache[str, Ed25519PublicKey] = LRUCache(KEY_CACHE)
        # Woken whenever this process stores a delegation or revocation (an item held for its delegation looks).
        self.arrived = asyncio.Condition()
        self.generation = 0
        self._stamp: tuple[int, int] | None = None
        self._stamp_read_at = float("-inf")

    def is_node(self, agent_id: str) -> bool:
        """``agent_id`` is this node or a peer it trusts (a node's id is never an agent's here)."""
        # As of the keyring's last read (no stat per item served): the verify path reads it again each second.
        return bool(self.keyring.keys_for(agent_id, reload=False)) \
            or any(p.agent_id == agent_id for p in self.keyring.cfg.mesh.peers)

    def may_be_agent(self, signer: str | None) -> bool:
        """``signer`` signed something and is no node here: it may be an agent (cheap; no read)."""
        return signer is not None and not self.is_node(signer)

    def key_of(self, row: DelegationRow) -> Ed25519PublicKey | None:
        """The agent key ``row`` vouches for; None when it is no key an agent could sign with."""
        key = self._keys.get(row.delegation_id)
        if key is None:
            try:
                key = Ed25519PublicKey.from_public_bytes(row.agent_key)
            except ValueError:
                return None
            self._keys[row.delegation_id] = key
        return key

    async def states(self, delegation_ids: Iterable[str]) -> dict[str, DelegationState]:
        """The delegations among ``delegation_ids`` stored here, each with its revocation (one read)."""
        wanted = sorted(set(delegation_ids))
        if not wanted:
            return {}

        def read(conn: Any) -> dict[str, DelegationState]:
            revoked = agents.revoked_many(conn, wanted)
            return {d: DelegationState(row, revoked.get(d)) for d in wanted
                    if (row := agents.get_delegation(conn, d)) is not None}

        found: dict[str, DelegationState] = await self.db.read(read)
        return found

    async def stored(self) -> None:
        """This process stored a delegation or revocation: held items look again, parked ones at the next check."""
        self.generation += 1
        async with self.arrived:
            self.arrived.notify_all()

    async def wait_for(self, delegation_id: str, hold_s: float) -> DelegationState | None:
        """``delegation_id`` once it is stored here, waiting up to ``hold_s`` seconds for one in flight."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold_s
        while True:
            found = (await self.states([delegation_id])).get(delegation_id)
            remaining = deadline - loop.time()
            if found is not None or remaining <= 0:
                return found
            try:
                async with self.arrived:
                    await asyncio.wait_for(self.arrived.wait(), min(remaining, 0.1))
            except TimeoutError:
                pass

    async def refresh(self) -> int:
        """``generation``, moved on when the store holds delegation records this process did not see arrive (from
        another process); the tables are looked at most every STAMP_RECHECK_S."""
        now = time.monotonic()
        if now - self._stamp_read_at >= STAMP_RECHECK_S:
            self._stamp_read_at = now
            stamp = await self.db.read(agents.stamp)
            if stamp != self._stamp:
                if self._stamp is not None:
                    self.generation += 1
                self._stamp = stamp
        return self.generation

    def vouched_keys(self, conn: Any, agent_id: str) -> list[tuple[DelegationRow, Ed25519PublicKey]]:
        """Inside a read: the keys of ``agent_id`` that a delegation by a node trusted here (this one or a pinned
        peer) vouches for, each with its delegation (``memory_verify`` of an agent's item)."""
        me = self.keyring.identity.agent_id if self.keyring.identity is not None else None
        out = []
        for row in agents.delegations_of(conn, agent_id):
            if row.issuer != me and not self.keyring.keys_for(row.issuer, reload=False):
                continue
            key = self.key_of(row)
            if key is not None:
                out.append((row, key))
        return out

    def hint(self, conn: Any, signer: str | None, claimed_at: int, payload: Signable,
             signature: bytes | None) -> DelegationRow | None:
        """Inside a read or write: the delegation an item signed by ``signer`` is to name when sent or served, or
        None when ``signer`` is no agent here (a node, unsigned, or no delegation stored). Of several delegations of
        the agent, the one whose window holds ``claimed_at`` and whose key verifies the signature."""
        if signer is None or signature is None or self.is_node(signer):
            return None
        rows = agents.delegations_of(conn, signer)
        if len(rows) > 1:
            rows = [r for r in rows if r.valid_from <= claimed_at < r.valid_until] or rows
        if len(rows) > 1:
            rows = [r for r in rows if (k := self.key_of(r)) is not None and attest.verify(k, payload, signature)] \
                or rows
        return rows[-1] if rows else None


def claimed_by_other(conn: Any, agent_id: str, issuer: str, now: int) -> str | None:
    """Inside a read or write: the other node that holds a live delegation for ``agent_id`` here at ``now`` (one
    agent id is vouched for by one node at a time: docs/security.md, "Agents"), or None."""
    others = [d for d in agents.delegations_of(conn, agent_id) if d.issuer != issuer
              and d.valid_from <= now < d.valid_until]
    revoked = agents.revoked_many(conn, [d.delegation_id for d in others])
    live = [d for d in others if d.delegation_id not in revoked or now < revoked[d.delegation_id]]
    return live[0].issuer if live else None


def ref_kind(ref_id: str) -> str | None:
    """``agent.delegate`` or ``agent.revoke`` for a change-log ref naming a delegation record, else None."""
    if ref_id.startswith(DELEGATE_REF):
        return "agent.delegate"
    if ref_id.startswith(REVOKE_REF):
        return "agent.revoke"
    return None
