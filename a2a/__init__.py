"""The A2A protocol as pure logic: envelopes and ACKs, their codec, payload kinds, the seen-cache,
the receive decision and retry timing. No sockets, no asyncio."""

from a2a.decide import Decision, Outcome, RejectCode, ack_for, decide
from a2a.envelope import (
                          BATCH_MAX_BYTES,
                          BATCH_SUBPROTOCOL,
                          MAX_BATCH_ITEMS,
                          Ack,
                          Batch,
                          Envelope,
                          accepted_ack,
                          batch_size,
                          decode_frame,
                          decode_wire,
                          encode_batch,
                          new_envelope,
                          plan_batches,
)
from a2a.errors import ErrorCode, ProtocolError
from a2a.kinds import KNOWN_KINDS, SCHEMAS, validate_payload
from a2a.retry import Backoff, RetrySchedule
from a2a.seen import SeenCache

__all__ = [
    "Ack",
    "BATCH_MAX_BYTES",
    "BATCH_SUBPROTOCOL",
    "Batch",
    "MAX_BATCH_ITEMS",
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
    "accepted_ack",
    "ack_for",
    "batch_size",
    "decide",
    "decode_frame",
    "decode_wire",
    "encode_batch",
    "new_envelope",
    "plan_batches",
    "validate_payload",
]
