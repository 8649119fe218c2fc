"""The node's error family, and the one mapping from any room's error to (code, message, HTTP status).

Every room raises its own exception type carrying a stable ``code`` and a human ``message``
(ConfigError, StorageError, MeshError, ProtocolError, AttestError, ServiceError); the edges
(CLI, MCP, HTTP) turn them into exit codes, tool errors and JSON bodies through ``describe``.
"""

from __future__ import annotations

from typing import NamedTuple


class ServiceError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Described(NamedTuple):
    code: str
    message: str
    http_status: int


# Codes that are the caller's fault map to 4xx; anything unknown is a 500.
_STATUS = {
    "not_found": 404,
    "unknown_memory": 404,
    "unknown_link": 404,
    "unknown_peer": 404,
    "too_large": 413,
    "rate_limited": 429,
    "sender_mismatch": 403,
    "quorum_not_reached": 503,
    "duplicate_link": 409,
    "permission_denied": 403,
    "quota_exceeded": 403,
    "already_decided": 409,
    "approval_expired": 410,
}


def describe(exc: BaseException) -> Described:
    """Stable code, sentence and HTTP status for any project error (duck-typed on .code/.message)."""
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None)
    if not isinstance(code, str) or not isinstance(message, str):
        return Described("internal", f"internal error: {type(exc).__name__}: {exc}", 500)
    return Described(code, message, _STATUS.get(code, 400))


def is_project_error(exc: BaseException) -> bool:
    return isinstance(getattr(exc, "code", None), str) and isinstance(getattr(exc, "message", None), str)
