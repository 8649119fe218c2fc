"""This node's own agents: the principal an MCP client names (``principal``), made on first use (a keypair under
``<home>/keys/agents/``, 0600, and a delegation this node signs for it, stored and replicated as any signed change),
renewed before it runs out, and ended (``revoke``: a signed revocation that replicates, and the key destroyed).

Who may name which agent is the door's business (docs/security.md, "Agents: the local trust boundary"); what is
checked here holds whatever the door: the id is a valid agent id, declared when ``mcp.agent_ids = "declared"``, no
node's id, not vouched for by another node here, one of at most ``mcp.max_agents``; a revoked agent stays revoked
until ``ai-memory agents delegate`` gives it a new key.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mesh import agentkeys
from mesh import keys as mesh_keys
from mesh.errors import MeshError
from mesh.keys import Identity
from node import attest
from node.agents.acting import Principal
from node.agents.book import DELEGATE_REF, REVOKE_REF, AgentBook, DelegationState, claimed_by_other
from node.attest import AttestLevel, DelegationPayload, RevocationPayload
from node.config import NodeConfig
from node.errors import ServiceCode, ServiceError
from node.writepath import WritePath
from storage import agents, changelog, events
from storage.agents import DelegationRow, RevocationRow

log = logging.getLogger("node.agents")

DAY_MS = 86_400_000
# The per-agent call count of the calls naming an agent id this node refused to act as (bounded: not the id).
REFUSED_AGENT = "(refused)"
# A delegation is renewed on use once less than this share of its window is left.
RENEW_SHARE = 10


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """One agent of this node as ``agents list``, capabilities and status show it."""

    agent_id: str
    delegation_id: str
    fingerprint: str
    valid_from: int
    valid_until: int
    revoked_at: int | None

    def state(self, now: int) -> str:
        if self.revoked_at is not None and self.revoked_at <= now:
            return "revoked"
        return "live" if self.valid_from <= now < self.valid_until else "expired"

    def to_json(self, now: int) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "delegation_id": self.delegation_id, "fingerprint": self.fingerprint,
                "valid_from": self.valid_from, "valid_until": self.valid_until, "revoked_at": self.revoked_at,
                "state": self.state(now)}


class LocalAgents:
    """This node's agents (``writes``: the store's write path, whose replicator sends the delegations; ``book``:
    the delegations held here, told of each one made)."""

    def __init__(self, writes: WritePath, book: AgentBook, clock: Callable[[], int]) -> None:
        self.writes = writes
        self.book = book
        self.clock = clock
        self._identities: dict[str, Identity] = {}
        # One delegation made at a time in this process (two first calls of one agent make one).
        self._making = asyncio.Lock()
        # (agent, "ok" or the error code) -> MCP calls this process ran (node/mcp/backend.py counts them).
        self.calls: Counter[tuple[str, str]] = Counter()
        # Each agent's newest delegation here as last read, and the delegation records' generation it was read at.
        self._known: dict[str, tuple[int, DelegationState]] = {}

    @property
    def cfg(self) -> NodeConfig:
        return self.writes.cfg

    @property
    def node_id(self) -> str:
        return self.writes.node_id

    async def principal(self, agent_id: str | None) -> Principal | None:
        """The principal a call naming ``agent_id`` runs as: None for no id or this node's own; else the agent,
        its keypair and a live delegation made (or renewed) now when it has none. ServiceError when it may not be
        (``bad_input``, ``agent_not_declared``, ``agent_is_node``, ``no_identity``, ``too_many_agents``,
        ``agent_claimed``, ``delegation_revoked``)."""
        if agent_id is None or agent_id == self.node_id:
            return None
        self._admit(agent_id)
        current = await self._current(agent_id)
        identity = await self._identity(agent_id)
        if current is not None and current.row.agent_key != mesh_keys.raw_public_bytes(identity.public_key):
            # Delegated again by another process (``agents delegate`` beside a running node): its new key.
            self._identities.pop(agent_id, None)
            identity = await self._identity(agent_id)
        if not self._usable(current, identity):
            async with self._making:
                current = await self._current(agent_id)
                if not self._usable(current, identity):
                    current = await self._delegate(agent_id, identity)
        assert current is not None
        return Principal(agent_id, identity, current.row.delegation_id, current.row.valid_from,
                         current.row.valid_until)

    def _admit(self, agent_id: str) -> None:
        try:
            mesh_keys.validate_agent_id(agent_id)
        except MeshError as e:
            raise ServiceError(ServiceCode.BAD_INPUT, f"agent id: {e.message}") from None
        if self.cfg.mcp.agent_ids == "declared" and all(a.id != agent_id for a in self.cfg.mcp.agents):
            raise ServiceError(ServiceCode.AGENT_NOT_DECLARED,
                               f"agent {agent_id!r} is not declared in [[mcp.agents]] and mcp.agent_ids is "
                               "\"declared\": add it there, or connect without --agent-id")
        if self.book.is_node(agent_id):
            raise ServiceError(ServiceCode.AGENT_IS_NODE,
                               f"{agent_id!r} is a node's id (this node's peer); an agent needs an id of its own")
        if self.writes.keyring.identity is None:
            raise ServiceError(ServiceCode.NO_IDENTITY, "this node has no key to vouch for its agents with; run "
                                                        "`ai-memory identity generate` first")

    def _usable(self, current: DelegationState | None, identity: Identity) -> bool:
        """A delegation of this node's that vouches for ``identity``'s key now, with more than a tenth of its
        window left; a revoked one raises (the agent stays revoked until it is delegated again)."""
        if current is None:
            return False
        now = self.clock()
        if current.revoked_at is not None:
            raise ServiceError(ServiceCode.DELEGATION_REVOKED,
                               f"agent {current.row.agent_id!r} was revoked at {current.revoked_at} ms; "
                               f"`ai-memory agents delegate {current.row.agent_id}` gives it a new key")
        row = current.row
        window = row.valid_until - row.valid_from
        return (row.agent_key == mesh_keys.raw_public_bytes(identity.public_key) and row.valid_from <= now
                and now < row.valid_until - window // RENEW_SHARE)

    async def _current(self, agent_id: str) -> DelegationState | None:
        """This node's newest delegation for ``agent_id``, with its revocation (None: it has none). Kept between
        calls while the delegation records stored here stay as they were (``AgentBook.refresh``: a record made in
        this process counts at once, one made by another process, such as ``ai-memory agents revoke`` beside a
        running node, within ``node.agents.book.STAMP_RECHECK_S``)."""
        generation = await self.book.refresh()
        known = self._known.get(agent_id)
        if known is not None and known[0] == generation:
            return known[1]
        me = self.node_id

        def read(conn: Any) -> DelegationState | None:
            own = [d for d in agents.delegations_of(conn, agent_id) if d.issuer == me]
            if not own:
                return None
            newest = own[-1]
            return DelegationState(newest, agents.revoked_at(conn, newest.delegation_id))

        found: DelegationState | None = await self.writes.db.read(read)
        if found is not None:  # only agents this node vouches for (at most mcp.max_agents) are kept
            self._known[agent_id] = (generation, found)
        return found

    async def _identity(self, agent_id: str) -> Identity:
        identity = self._identities.get(agent_id)
        if identity is None:
            try:
                identity = await asyncio.to_thread(agentkeys.ensure_agent_key, self.cfg.keys_dir, agent_id)
            except MeshError as e:
                raise ServiceError(ServiceCode.KEY_INVALID, f"agent {agent_id!r}: {e.message}") from None
            self._identities[agent_id] = identity
        return identity

    async def _delegate(self, agent_id: str, identity: Identity) -> DelegationState:
        """Sign, store and replicate a new delegation of ``identity``'s key, from now for
        ``mcp.agent_delegation_days``."""
        node = self.writes.keyring.identity
        assert node is not None
        now = self.clock()
        payload = DelegationPayload(agent_id=agent_id, agent_key=mesh_keys.raw_public_bytes(identity.public_key),
                                    issuer=node.agent_id, valid_from=now,
                                    valid_until=now + int(self.cfg.mcp.agent_delegation_days * DAY_MS))
        signature = attest.sign(node.private_key, payload)
        row = DelegationRow(delegation_id=payload.delegation_id, **payload.to_dict(), signature=signature,
                            attest_level=str(AttestLevel.SELF_SIGNED), received_from=None, created_at=now)
        body = {"delegation": payload.to_dict(), "signature": signature, "signed_by": node.agent_id}

        def write(conn: Any) -> Any:
            issued = agents.agents_issued_by(conn, node.agent_id)
            if agent_id not in issued and len(issued) >= self.cfg.mcp.max_agents:
                raise ServiceError(ServiceCode.TOO_MANY_AGENTS,
                                   f"this node already vouches for {len(issued)} agents (mcp.max_agents); "
                                   f"{agent_id!r} was not made")
            other = claimed_by_other(conn, agent_id, node.agent_id, now)
            if other is not None:
                raise ServiceError(ServiceCode.AGENT_CLAIMED,
                                   f"agent {agent_id!r} is vouched for by {other!r} now; one node vouches for an "
                                   "agent at a time (revoke it there first)")
            agents.insert_delegation(conn, row)
            events.append(conn, "agent_delegation", row.delegation_id, node.agent_id, row.delegation_id,
                          signature, now)
            changelog.append(conn, "link", DELEGATE_REF + row.delegation_id, 1, now)
            return self.writes.replicate(conn, "agent.delegate", body, [], now)

        self.writes.hand_off(await self.writes.db.write(write))
        await self.book.stored()
        log.info("agent_delegated", extra={"ev": {"agent": agent_id, "delegation_id": row.delegation_id,
                                                  "fingerprint": identity.fingerprint,
                                                  "valid_until": row.valid_until}})
        return DelegationState(row, None)

    async def revoke(self, agent_id: str, *, since_ms: int | None = None) -> list[dict[str, Any]]:
        """End every delegation this node signed for ``agent_id`` from ``since_ms`` (default now: what it signed
        from then on is refused everywhere, what it signed before keeps verifying), replicate the revocations, and
        destroy the agent's key. Returns the revocations made (none when all were revoked already)."""
        node = self.writes.keyring.identity
        if node is None:
            raise ServiceError(ServiceCode.NO_IDENTITY, "this node has no key to sign a revocation with")
        now = self.clock()
        at = now if since_ms is None else since_ms
        if at < 0 or at > now:
            raise ServiceError(ServiceCode.BAD_INPUT, f"--since must be a time up to now (unix ms), got {at}")

        def write(conn: Any) -> tuple[list[RevocationRow], Any]:
            own = [d for d in agents.delegations_of(conn, agent_id) if d.issuer == node.agent_id]
            if not own:
                raise ServiceError(ServiceCode.NOT_FOUND, f"this node vouches for no agent {agent_id!r}")
            revoked = agents.revoked_many(conn, [d.delegation_id for d in own])
            made, queued = [], []
            for d in own:
                if d.delegation_id in revoked and revoked[d.delegation_id] <= at:
                    continue
                payload = RevocationPayload(delegation_id=d.delegation_id, agent_id=agent_id,
                                            issuer=node.agent_id, revoked_at=at)
                signature = attest.sign(node.private_key, payload)
                row = RevocationRow(revocation_id=payload.revocation_id, **payload.to_dict(), signature=signature,
                                    attest_level=str(AttestLevel.SELF_SIGNED), received_from=None, created_at=now)
                agents.insert_revocation(conn, row)
                events.append(conn, "agent_revocation", d.delegation_id, node.agent_id, row.revocation_id,
                              signature, now)
                changelog.append(conn, "link", REVOKE_REF + row.revocation_id, 1, now)
                body = {"revocation": payload.to_dict(), "signature": signature, "signed_by": node.agent_id}
                queued += self.writes.replicate(conn, "agent.revoke", body, [], now)
                made.append(row)
            return made, queued

        made, queued = await self.writes.db.write(write)
        self.writes.hand_off(queued)
        self._identities.pop(agent_id, None)
        await asyncio.to_thread(agentkeys.destroy_agent_key, self.cfg.keys_dir, agent_id)
        await self.book.stored()
        log.warning("agent_revoked", extra={"ev": {"agent": agent_id, "revoked_at": at, "delegations": len(made)}})
        return [{"revocation_id": r.revocation_id, "delegation_id": r.delegation_id, "agent_id": r.agent_id,
                 "revoked_at": r.revoked_at} for r in made]

    async def delegate_again(self, agent_id: str) -> Principal | None:
        """A revoked agent given a new key and a new delegation (``ai-memory agents delegate``)."""
        self._admit(agent_id)
        await asyncio.to_thread(agentkeys.destroy_agent_key, self.cfg.keys_dir, agent_id)
        self._identities.pop(agent_id, None)
        identity = await self._identity(agent_id)
        async with self._making:
            state = await self._delegate(agent_id, identity)
        return Principal(agent_id, identity, state.row.delegation_id, state.row.valid_from, state.row.valid_until)

    async def statuses(self) -> list[AgentStatus]:
        """This node's agents, each with its newest delegation (at most ``mcp.max_agents`` of them)."""
        me = self.node_id

        def read(conn: Any) -> list[AgentStatus]:
            out = []
            for agent_id in agents.agents_issued_by(conn, me)[: self.cfg.mcp.max_agents]:
                newest = [d for d in agents.delegations_of(conn, agent_id) if d.issuer == me][-1]
                out.append(AgentStatus(agent_id, newest.delegation_id, _fingerprint(newest.agent_key),
                                       newest.valid_from, newest.valid_until,
                                       agents.revoked_at(conn, newest.delegation_id)))
            return out

        found: list[AgentStatus] = await self.writes.db.read(read)
        return found


    async def section(self, quota_of: Callable[[str], int]) -> dict[str, Any]:
        """``memory_capabilities``' ``agents`` section (and ``status``'s): how agents are admitted, and each of this
        node's agents and the node itself with its memories, their bytes against its storage quota (``quota_of``),
        its requests per second and this process's MCP calls by outcome."""
        now = self.clock()
        rows = [a.to_json(now) for a in await self.statuses()]
        held = await self.writes.db.read(agents.memories_by_writer, [self.node_id, *(r["agent_id"] for r in rows)])
        calls: dict[str, dict[str, int]] = {}
        for (who, outcome), n in self.calls.items():
            calls.setdefault(who, {})[outcome] = n
        declared = {a.id: a for a in self.cfg.mcp.agents}

        def usage(agent_id: str) -> dict[str, Any]:
            count, used = held.get(agent_id, (0, 0))
            rate = declared[agent_id].requests_per_second if agent_id in declared else None
            return {"memories": count, "bytes": used, "quota_bytes": quota_of(agent_id),
                    "requests_per_second": rate or self.cfg.limits.requests_per_second,
                    "calls": calls.get(agent_id, {})}

        return {"admission": self.cfg.mcp.agent_ids, "max_agents": self.cfg.mcp.max_agents,
                "node": {"agent_id": self.node_id, **usage(self.node_id)},
                "agents": [{**r, **usage(r["agent_id"])} for r in rows],
                "refused_calls": calls.get(REFUSED_AGENT, {})}


def _fingerprint(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[: mesh_keys.FINGERPRINT_LEN]
