"""The a2a room's one exception family: every bad input becomes a ProtocolError."""

from __future__ import annotations

from enum import StrEnum

from base.errors import ProjectError


class ErrorCode(StrEnum):
    """Stable codes carried by ProtocolError.code (also used in ACK reasons as ``rejected:<code>``)."""

    MALFORMED = "malformed"
    TOO_LARGE = "too_large"
    BAD_VERSION = "bad_version"
    BAD_TYPE = "bad_type"
    BAD_CORRELATION_ID = "bad_correlation_id"
    BAD_FIELD = "bad_field"
    UNKNOWN_KIND = "unknown_kind"
    BAD_PAYLOAD = "bad_payload"


class ProtocolError(ProjectError):
    """An A2A frame or payload that cannot be accepted.

    ``code`` is a stable snake_case string (an ErrorCode member), ``message`` a human sentence
    naming the field and value. ``correlation_id`` is set when the error was found after the
    frame's correlation_id had been validated, so a receiver may still answer
    ``Ack.rejected(correlation_id, me, code)`` instead of silently dropping the frame.
    """

    def __init__(self, code: str, message: str, *, correlation_id: str | None = None) -> None:
        super().__init__(str(code), message)
        self.correlation_id = correlation_id
