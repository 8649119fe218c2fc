"""The one receive function shared by the WebSocket and the HTTP routes.

decode -> decide (a2a, pure) -> apply (the node's callback, which commits) -> remember -> ACK.
An ACK with ``accepted=true`` is only produced after the apply committed: it means "durably stored".
Each apply is bounded by ``apply_timeout_s``: a stuck storage writer costs one message a timeout (no
ACK, so the sender retries; the apply is idempotent), never the whole receive path.

Duplicates, rejections and protocol errors never reach the apply and are answered at once. A node also
gives an ``apply_now``, a plain function that settles what needs no waiting (a ping) with no coroutine at
all, so such a message costs no task and no timer. Every other message's apply runs from its start inside
the task that awaits it (hooks and storage use task-bound timeouts).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, NamedTuple

from a2a import Ack, Batch, Envelope, Outcome, ProtocolError, SeenCache, decide, decode_frame, decode_wire
from a2a.decide import Decision, ack_for

log = logging.getLogger("mesh.receive")

# The node's apply: validates the payload, commits it, and answers Ack.ok or Ack.rejected(code).
# Raising means "could not store now": no ACK is sent, so the sender retries. It runs wholly inside the task
# that awaits it.
Apply = Callable[[Envelope, str], Coroutine[Any, Any, Ack]]
# The same apply as a plain function for what it can settle without waiting: the ACK ``Apply`` would answer
# (or the exception it would raise), or None to run ``Apply``.
ApplyNow = Callable[[Envelope, str], Ack | None]

# Default bound on one apply, in seconds: above federation.orphan_hold_s (a link waiting for its memory)
# plus a slow group commit, below the 60 s TTL so the sender's retries still land.
APPLY_TIMEOUT_S = 10.0


class Received(NamedTuple):
    """What one frame came to: the ACK to send (or None), the decision, or the protocol error. (A NamedTuple:
    one is made per message, at a third of a frozen dataclass's cost.)"""

    ack: Ack | None
    decision: Decision | None = None
    error: ProtocolError | None = None
    envelope: Envelope | None = None


# An apply that has to wait: await it (in a task) for its Received; it is bounded by apply_timeout_s.
Pending = Coroutine[Any, Any, Received]


class Resumed:
    """Awaitable continuing a coroutine that was already stepped once and yielded ``yielded`` (what a Task
    does with an eagerly started coroutine; asyncio's own eager tasks arrive in Python 3.12)."""

    __slots__ = ("coro", "yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self.coro, self.yielded = coro, yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self.coro, self.yielded
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:  # a cancellation or timeout thrown into the task: pass it down
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


class Receiver:
    def __init__(self, local_agent_id: str, seen: SeenCache, apply: Apply, *, max_bytes: int,
                 clock_ms: Callable[[], int], apply_timeout_s: float = APPLY_TIMEOUT_S,
                 apply_now: ApplyNow | None = None) -> None:
        if not apply_timeout_s > 0:
            raise ValueError(f"apply_timeout_s must be > 0, got {apply_timeout_s!r}")
        self.local_agent_id = local_agent_id
        self.seen = seen
        self.apply = apply
        self.apply_now = apply_now
        self.apply_timeout_s = apply_timeout_s
        self.max_bytes = max_bytes
        self.clock_ms = clock_ms
        self.counters: Counter[str] = Counter()
        # Same correlation_id arriving twice at once: the second waits for the first's outcome,
        # so a failed first apply never turns the retry into a false "duplicate". The future is
        # made only when a second copy actually waits (rare), not for every message.
        self._inflight: dict[str, asyncio.Future[bool] | None] = {}

    async def receive(self, frame: bytes, tls_identity: str) -> Received:
        """Decode, decide and apply one frame (one envelope; a batch is refused as ``bad_type``)."""
        msg = self.decode(frame, tls_identity)
        if isinstance(msg, Received):
            return msg
        return await self.receive_envelope(msg, tls_identity)

    async def receive_envelope(self, env: Envelope, tls_identity: str) -> Received:
        result = self.receive_now(env, tls_identity)
        return result if isinstance(result, Received) else await result

    def decode(self, frame: bytes, tls_identity: str) -> Envelope | Received:
        """One frame's envelope, or what a bad frame comes to (a rejection ACK when its correlation_id
        could be read)."""
        try:
            msg = decode_frame(frame, self.max_bytes)
        except ProtocolError as e:
            return self._protocol_error(e, tls_identity)
        return self._envelope_or_refusal(msg, tls_identity)

    def units(self, frame: bytes, tls_identity: str) -> list[Envelope | Received]:
        """A WebSocket frame's envelopes, in order: one, or each item of a batch frame on its own (a bad
        item comes to its own Received and does not touch the others)."""
        try:
            msg = decode_wire(frame, self.max_bytes)
        except ProtocolError as e:
            return [self._protocol_error(e, tls_identity)]
        if isinstance(msg, Batch):
            self.counters["batch_frames"] += 1
            return [self.decode(item, tls_identity) for item in msg.items]
        return [self._envelope_or_refusal(msg, tls_identity)]

    def _protocol_error(self, e: ProtocolError, tls_identity: str) -> Received:
        self.counters[f"protocol_error:{e.code}"] += 1
        log.warning("protocol_error", extra={"ev": {"peer": tls_identity, "code": e.code, "detail": e.message,
                                                    "correlation_id": e.correlation_id}})
        ack = Ack.rejected(e.correlation_id, self.local_agent_id, e.code) if e.correlation_id else None
        return Received(ack=ack, error=e)

    def _envelope_or_refusal(self, msg: Envelope | Ack, tls_identity: str) -> Envelope | Received:
        if isinstance(msg, Ack):
            # ACKs travel back on the socket the envelope came on; one arriving here is a peer's mistake.
            self.counters["protocol_error:bad_type"] += 1
            log.warning("unexpected_ack", extra={"ev": {"peer": tls_identity, "correlation_id": msg.correlation_id}})
            return Received(ack=None, error=ProtocolError("bad_type", "expected a message (type \"msg\"), got an ACK"))
        return msg

    def receive_now(self, env: Envelope, tls_identity: str) -> Received | Pending:
        """Decide ``env`` and, when ``apply_now`` settles it, answer it at once.

        Returns the Received when that settles it (no task, no timer), else a coroutine that applies it,
        bounded by ``apply_timeout_s``: the caller awaits it (in a task of its own to keep reading).
        """
        cid = env.correlation_id
        if cid in self._inflight:
            return self._after_inflight(env, tls_identity)
        decision = decide(env, tls_identity, self.local_agent_id, self.clock_ms(), self.seen)
        if decision.outcome is not Outcome.ACCEPT:
            self.counters[decision.outcome.value if decision.code is None else f"rejected:{decision.code}"] += 1
            level = logging.INFO if decision.outcome is Outcome.DUPLICATE else logging.WARNING
            log.log(level, decision.outcome.value, extra={"ev": {
                "peer": tls_identity, "correlation_id": cid, "sender": env.sender, "kind": env.kind,
                "code": decision.code, "expires_at": env.expires_at}})
            return Received(ack=ack_for(decision, env, self.local_agent_id), decision=decision, envelope=env)
        self.counters["accept"] += 1
        self._inflight[cid] = None
        if self.apply_now is not None:
            try:
                ack = self.apply_now(env, tls_identity)
            except Exception as e:
                return self._settle(env, decision, tls_identity, None, e)
            if ack is not None:
                return self._settle(env, decision, tls_identity, ack, None)
        return self._finish(env, decision, tls_identity, self.apply(env, tls_identity))

    async def _after_inflight(self, env: Envelope, tls_identity: str) -> Received:
        cid = env.correlation_id
        while cid in self._inflight:
            waiter = self._inflight[cid]
            if waiter is None:
                waiter = self._inflight[cid] = asyncio.get_running_loop().create_future()
            await asyncio.shield(waiter)
        return await self.receive_envelope(env, tls_identity)

    async def _finish(self, env: Envelope, decision: Decision, tls_identity: str,
                      applying: Awaitable[Ack]) -> Received:
        try:
            async with asyncio.timeout(self.apply_timeout_s):
                ack = await applying
        except TimeoutError as e:
            return self._settle(env, decision, tls_identity, None, e)
        except Exception as e:
            return self._settle(env, decision, tls_identity, None, e)
        except BaseException:  # cancelled (the socket or the node closing): release a waiting copy
            self._release(env.correlation_id, False)
            raise
        return self._settle(env, decision, tls_identity, ack, None)

    def _settle(self, env: Envelope, decision: Decision, tls_identity: str, ack: Ack | None,
                error: Exception | None) -> Received:
        """The apply's outcome (its ACK, or the exception it raised) as the Received to answer with."""
        cid = env.correlation_id
        stored = False
        try:
            if error is None:
                assert ack is not None
                stored = ack.accepted
                if stored:
                    self.seen.remember(cid, env.expires_at)
                else:
                    self.counters[ack.reason or "rejected"] += 1
                return Received(ack=ack, decision=decision, envelope=env)
            if isinstance(error, ProtocolError):
                self.counters[f"rejected:{error.code}"] += 1
                log.warning("bad_payload", extra={"ev": {"peer": tls_identity, "correlation_id": cid,
                                                         "code": error.code, "detail": error.message}})
                return Received(ack=Ack.rejected(cid, self.local_agent_id, error.code), decision=decision,
                                envelope=env)
            if isinstance(error, TimeoutError):  # a stuck apply (storage writer, verifier): no ACK, the sender retries
                self.counters["apply_timeout"] += 1
                log.warning("apply_timeout", extra={"ev": {"peer": tls_identity, "correlation_id": cid,
                                                           "kind": env.kind, "timeout_s": self.apply_timeout_s}})
                return Received(ack=None, decision=decision, envelope=env)
            # storage trouble: no ACK, the sender's retry schedule takes over
            self.counters["apply_failed"] += 1
            log.error("apply_failed", extra={"ev": {"peer": tls_identity, "correlation_id": cid,
                                                    "error": f"{type(error).__name__}: {error}"}})
            return Received(ack=None, decision=decision, envelope=env)
        finally:
            self._release(cid, stored)

    def _release(self, cid: str, stored: bool) -> None:
        waiter = self._inflight.pop(cid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(stored)
