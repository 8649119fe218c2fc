"""The receive decision (docs/protocol.md, "Receiving"): accept, duplicate, expired or reject.

Pure: no I/O, no mutation."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from a2a.envelope import Ack, Envelope
from a2a.seen import SeenCache


class Outcome(Enum):
    ACCEPT = "accept"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    REJECT = "reject"


class RejectCode(StrEnum):
    """Codes for REJECT decisions made here (ProtocolError codes cover malformed input)."""

    SENDER_MISMATCH = "sender_mismatch"
    NOT_A_RECIPIENT = "not_a_recipient"


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    code: str | None = None

    def __post_init__(self) -> None:
        if (self.outcome is Outcome.REJECT) != (self.code is not None):
            raise ValueError(f"a REJECT decision needs a code and only it may carry one: {self!r}")


ACCEPT = Decision(Outcome.ACCEPT)
DUPLICATE = Decision(Outcome.DUPLICATE)
EXPIRED = Decision(Outcome.EXPIRED)


def decide(env: Envelope, tls_identity: str, local_agent_id: str, now_ms: int, seen: SeenCache) -> Decision:
    """Decide what to do with a well-formed envelope that arrived over a connection authenticated as
    ``tls_identity``, at ``now_ms`` (unix ms). Never mutates ``seen``: the caller remembers the
    correlation_id only after the apply committed.
    """
    if env.sender != tls_identity:
        return Decision(Outcome.REJECT, RejectCode.SENDER_MISMATCH)
    if local_agent_id not in env.recipients:
        return Decision(Outcome.REJECT, RejectCode.NOT_A_RECIPIENT)
    if env.correlation_id in seen:
        return DUPLICATE
    if env.expires_at <= now_ms:
        return EXPIRED
    return ACCEPT


def ack_for(decision: Decision, env: Envelope, local_agent_id: str) -> Ack | None:
    """The ACK answering ``env`` under ``decision``; None for EXPIRED (expired messages get no ACK).

    For ACCEPT, send it only after the apply committed: an ACK means "durably stored".
    """
    cid = env.correlation_id
    if decision.outcome is Outcome.ACCEPT:
        return Ack.ok(cid, local_agent_id)
    if decision.outcome is Outcome.DUPLICATE:
        return Ack.duplicate(cid, local_agent_id)
    if decision.outcome is Outcome.REJECT:
        assert decision.code is not None  # guaranteed by Decision.__post_init__
        return Ack.rejected(cid, local_agent_id, decision.code)
    return None
