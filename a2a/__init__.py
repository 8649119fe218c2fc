"""The A2A protocol as pure logic: envelopes and ACKs, their codec, payload kinds, the seen-cache,
the receive decision and retry timing. No sockets, no asyncio."""

from a2a.decide import Decision, Outcome, RejectCode, ack_for, decide
from a2a.envelope import Ack, Envelope, decode_frame, new_envelope
from a2a.errors import ErrorCode, ProtocolError
from a2a.kinds import KNOWN_KINDS, SCHEMAS, validate_payload
from a2a.retry import Backoff, RetrySchedule
from a2a.seen import SeenCache

__all__ = [
    "Ack",
    "Backoff",
    "Decision",
    "Envelope",
    "ErrorCode",
    "KNOWN_KINDS",
    "Outcome",
    "ProtocolError",
    "RejectCode",
    "RetrySchedule",
    "SCHEMAS",
    "SeenCache",
    "ack_for",
    "decide",
    "decode_frame",
    "new_envelope",
    "validate_payload",
]
