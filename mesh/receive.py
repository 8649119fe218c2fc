"""The one receive function shared by the WebSocket and the HTTP routes.

decode -> decide (a2a, pure) -> apply (the node's callback, which commits) -> remember -> ACK.
An ACK with ``accepted=true`` is only produced after the apply committed: it means "durably stored".
Each apply is bounded by ``apply_timeout_s``: a stuck storage writer costs one message a timeout (no
ACK, so the sender retries; the apply is idempotent), never the whole receive path.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from a2a import Ack, Envelope, Outcome, ProtocolError, SeenCache, decide, decode_frame
from a2a.decide import Decision, ack_for

log = logging.getLogger("mesh.receive")

# The node's apply: validates the payload, commits it, and answers Ack.ok or Ack.rejected(code).
# Raising means "could not store now": no ACK is sent, so the sender retries.
Apply = Callable[[Envelope, str], Awaitable[Ack]]

# Default bound on one apply, in seconds: above federation.orphan_hold_s (a link waiting for its memory)
# plus a slow group commit, below the 60 s TTL so the sender's retries still land.
APPLY_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Received:
    """What one frame came to: the ACK to send (or None), the decision, or the protocol error."""

    ack: Ack | None
    decision: Decision | None = None
    error: ProtocolError | None = None
    envelope: Envelope | None = None


class Receiver:
    def __init__(self, local_agent_id: str, seen: SeenCache, apply: Apply, *, max_bytes: int,
                 clock_ms: Callable[[], int], apply_timeout_s: float = APPLY_TIMEOUT_S) -> None:
        if not apply_timeout_s > 0:
            raise ValueError(f"apply_timeout_s must be > 0, got {apply_timeout_s!r}")
        self.local_agent_id = local_agent_id
        self.seen = seen
        self.apply = apply
        self.apply_timeout_s = apply_timeout_s
        self.max_bytes = max_bytes
        self.clock_ms = clock_ms
        self.counters: Counter[str] = Counter()
        # Same correlation_id arriving twice at once: the second waits for the first's outcome,
        # so a failed first apply never turns the retry into a false "duplicate". The future is
        # made only when a second copy actually waits (rare), not for every message.
        self._inflight: dict[str, asyncio.Future[bool] | None] = {}

    async def receive(self, frame: bytes, tls_identity: str) -> Received:
        try:
            msg = decode_frame(frame, self.max_bytes)
        except ProtocolError as e:
            self.counters[f"protocol_error:{e.code}"] += 1
            log.warning("protocol_error", extra={"ev": {"peer": tls_identity, "code": e.code, "detail": e.message,
                                                        "correlation_id": e.correlation_id}})
            ack = Ack.rejected(e.correlation_id, self.local_agent_id, e.code) if e.correlation_id else None
            return Received(ack=ack, error=e)
        if isinstance(msg, Ack):
            # ACKs travel back on the socket the envelope came on; one arriving here is a peer's mistake.
            self.counters["protocol_error:bad_type"] += 1
            log.warning("unexpected_ack", extra={"ev": {"peer": tls_identity, "correlation_id": msg.correlation_id}})
            return Received(ack=None, error=ProtocolError("bad_type", "expected a message (type \"msg\"), got an ACK"))
        return await self.receive_envelope(msg, tls_identity)

    async def receive_envelope(self, env: Envelope, tls_identity: str) -> Received:
        cid = env.correlation_id
        while cid in self._inflight:
            waiter = self._inflight[cid]
            if waiter is None:
                waiter = self._inflight[cid] = asyncio.get_running_loop().create_future()
            await asyncio.shield(waiter)
        decision = decide(env, tls_identity, self.local_agent_id, self.clock_ms(), self.seen)
        self.counters[decision.outcome.value if decision.code is None else f"rejected:{decision.code}"] += 1
        if decision.outcome is not Outcome.ACCEPT:
            level = logging.INFO if decision.outcome is Outcome.DUPLICATE else logging.WARNING
            log.log(level, decision.outcome.value, extra={"ev": {
                "peer": tls_identity, "correlation_id": cid, "sender": env.sender, "kind": env.kind,
                "code": decision.code, "expires_at": env.expires_at}})
            return Received(ack=ack_for(decision, env, self.local_agent_id), decision=decision, envelope=env)
        self._inflight[cid] = None
        stored = False
        try:
            async with asyncio.timeout(self.apply_timeout_s):
                ack = await self.apply(env, tls_identity)
            stored = ack.accepted
            if stored:
                self.seen.remember(cid, env.expires_at)
            else:
                self.counters[ack.reason or "rejected"] += 1
            return Received(ack=ack, decision=decision, envelope=env)
        except ProtocolError as e:
            self.counters[f"rejected:{e.code}"] += 1
            log.warning("bad_payload", extra={"ev": {"peer": tls_identity, "correlation_id": cid,
                                                     "code": e.code, "detail": e.message}})
            return Received(ack=Ack.rejected(cid, self.local_agent_id, e.code), decision=decision, envelope=env)
        except TimeoutError:  # a stuck apply (storage writer, verifier): no ACK, the sender retries
            self.counters["apply_timeout"] += 1
            log.warning("apply_timeout", extra={"ev": {"peer": tls_identity, "correlation_id": cid, "kind": env.kind,
                                                       "timeout_s": self.apply_timeout_s}})
            return Received(ack=None, decision=decision, envelope=env)
        except Exception as e:  # storage trouble: no ACK, the sender's retry schedule takes over
            self.counters["apply_failed"] += 1
            log.error("apply_failed", extra={"ev": {"peer": tls_identity, "correlation_id": cid,
                                                    "error": f"{type(e).__name__}: {e}"}})
            return Received(ack=None, decision=decision, envelope=env)
        finally:
            waiter = self._inflight.pop(cid)
            if waiter is not None:
                waiter.set_result(stored)
