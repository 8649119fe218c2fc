"""Inbound: a peer's change checked and committed, then answered (the mesh receiver's ``apply``).

``apply_payload`` validates a payload and hands it to the apply of its kind, found in one table (``routes``):
one module per kind (memory.py for memory.put and memory.put.v2; links.py for link.put and links.put;
invalidation.py; transcript.py; agents.py for agent.delegate and agent.revoke). Each bounds the change as a local
write is bounded, checks who may write what (a memory version by its creator or a named writer, signed; a link where
the sender may see both ends), verifies signatures off the event loop (verify.py; an agent's under the key its
delegation vouches for) and commits; the ACK is sent after the commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from a2a import Ack, Envelope, ProtocolError, validate_payload
from a2a.kinds import AGENT_DELEGATE, AGENT_REVOKE, MEMORY_PUT_V2
from node.federation.codes import RejectCode
from node.federation.inbound.agents import DelegationApply, RevocationApply
from node.federation.inbound.common import OK_UNCHANGED, Applied, ApplyContext
from node.federation.inbound.invalidation import InvalidationApply
from node.federation.inbound.links import LinkApply
from node.federation.inbound.memory import MemoryApply
from node.federation.inbound.transcript import TranscriptApply
from node.ratelimit import RateLimiter

# An apply of one payload kind: (the payload, its sender, pulled from its change log) -> how it went.
Handler = Callable[[dict[str, Any], str, bool], Awaitable[Applied]]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a payload kind goes; ``counts_rejections``: its apply counts its own rejections (a links.put
    counts each link's), else ``apply_payload`` counts the one it returns."""

    apply: Handler
    counts_rejections: bool = False


async def _pong(body: dict[str, Any], sender: str, pulled: bool = False) -> Applied:
    """A ping stores nothing: accepted as it is."""
    return OK_UNCHANGED


class Inbound:
    """Applies peers' payloads to this node's store (``agent_id``), each peer within its request budget
    (``peer_rate``: limits.peer_requests_per_second; None = no limit)."""

    def __init__(self, ctx: ApplyContext, agent_id: str, peer_rate: RateLimiter | None) -> None:
        self.ctx = ctx
        self.agent_id = agent_id
        self.peer_rate = peer_rate
        self.links = LinkApply(ctx)
        memories = MemoryApply(ctx)
        self.routes: dict[str, Route] = {
            "ping": Route(_pong),
            # One apply for both forms of a memory version: memory.put (signed set 1, from an older node) and
            # memory.put.v2 (the sharing list signed with the version).
            "memory.put": Route(memories),
            MEMORY_PUT_V2: Route(memories),
            "link.put": Route(self.links.one),
            "links.put": Route(self.links.many, counts_rejections=True),
            "link.invalidate": Route(InvalidationApply(ctx)),
            "transcript.put": Route(TranscriptApply(ctx)),
            # A node vouching for its agents, and ending that (negotiated: docs/protocol.md, "Agents").
            AGENT_DELEGATE: Route(DelegationApply(ctx)),
            AGENT_REVOKE: Route(RevocationApply(ctx)),
        }

    async def apply(self, env: Envelope, sender: str) -> Ack:
        """The mesh receiver's apply: commit the change, then answer Ack.ok / Ack.rejected(code)."""
        limited = self._rate_limited(env, sender)
        if limited is not None:
            return limited
        applied = await self.apply_payload(env.payload, sender)
        if applied.code is None:
            return Ack.ok(env.correlation_id, self.agent_id)
        return Ack.rejected(env.correlation_id, self.agent_id, applied.code)

    def apply_now(self, env: Envelope, sender: str) -> Ack | None:
        """``apply`` for a ping, without a coroutine (a ping stores nothing and waits for nothing): the same
        rate limit, payload check and ACK, or the same ProtocolError. None for every other kind (``apply``
        then runs)."""
        if env.payload.get("kind") != "ping":
            return None
        limited = self._rate_limited(env, sender)
        if limited is not None:
            return limited
        validate_payload(env.payload)
        return Ack.ok(env.correlation_id, self.agent_id)

    async def apply_payload(self, payload: Any, sender: str, *, pulled: bool = False) -> Applied:
        """Validate and apply one payload from ``sender``, sent live or ``pulled`` from its change log (a known
        signer's signature that does not verify may then be ``unknown_key``); ProtocolError when malformed."""
        validate_payload(payload)
        route = self.routes.get(payload["kind"])
        if route is None:  # validate_payload knows the kind but this node has no apply for it
            applied = Applied(RejectCode.UNSUPPORTED_KIND)
        else:
            applied = await route.apply(payload, sender, pulled)
            if route.counts_rejections:
                return applied
        if applied.code is not None:
            self.ctx.counters[f"rejected:{applied.code}"] += 1
        return applied

    async def apply_links(self, payloads: Sequence[Any], sender: str) -> list[Applied | ProtocolError]:
        """``apply_payload`` for each of a run of link.put payloads pulled from ``sender``'s change log, the run's
        stages shared as a links.put's links share them (one lookup read, one verify hop, one write): each one's
        answer, or the ProtocolError it would raise. What no apply answers (storage trouble, a hook or the event
        sink failing) is raised for the run."""
        answers: list[Applied | ProtocolError | None] = [None] * len(payloads)
        bodies: list[dict[str, Any]] = []
        where: list[int] = []
        for i, payload in enumerate(payloads):
            try:
                validate_payload(payload)
            except ProtocolError as e:
                answers[i] = e
                continue
            if payload["kind"] != "link.put":
                raise ValueError(f"apply_links takes link.put payloads, not {payload['kind']}")
            bodies.append(payload)
            where.append(i)
        got = await self.links.run(bodies, sender, self.links.run_hops, pulled=True) if bodies else []
        for i, answer in zip(where, got, strict=True):
            if isinstance(answer, Applied):
                if answer.code is not None:
                    self.ctx.counters[f"rejected:{answer.code}"] += 1
                answers[i] = answer
            elif isinstance(answer, ProtocolError):
                answers[i] = answer
            else:
                raise answer
        return [a if a is not None else OK_UNCHANGED for a in answers]

    def _rate_limited(self, env: Envelope, sender: str) -> Ack | None:
        """Spend ``sender``'s token for ``env`` (a links.put spends one per link); the rate_limited ACK when
        none is left."""
        if self.peer_rate is None:
            return None
        if self.peer_rate.wait_s(sender):
            self.ctx.counters[f"rejected:{RejectCode.RATE_LIMITED}"] += 1
            return Ack.rejected(env.correlation_id, self.agent_id, RejectCode.RATE_LIMITED)
        packed = env.payload.get("links") if env.payload.get("kind") == "links.put" else None
        if isinstance(packed, list):
            # A links.put is as many messages as it carries links: the envelope got in on one token,
            # the rest is charged now (into debt, so the peer's next messages wait for it).
            self.peer_rate.charge(sender, len(packed) - 1)
        return None
