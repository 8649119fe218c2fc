"""The root of every error the project raises on purpose: a stable code, a sentence for people, an HTTP status.

Each room keeps its codes in a ``StrEnum`` and its exception derives from ``ProjectError`` (h11's
``ProtocolError`` and Synapse's ``SynapseError``/``Codes`` are the models). The edges catch ``ProjectError``
and read ``.code``, ``.message`` and ``.http_status``: the CLI turns them into ``error [code]: sentence`` and an
exit code, MCP into a tool error, HTTP into a status and the body ``{"error": {"code", "message"}}``.

A code may also come from outside a room's enum: a peer's refusal names its own code, an operator's hook denies
with a code of its choosing. Such codes are carried as they are; every code the project spells itself is a
member of its room's enum (tests/test_error_family.py holds every raise to that).

Stdlib only, so that every room may stand on it.
"""

from __future__ import annotations

from typing import NamedTuple

# The one map from a code to the HTTP status it answers. A project error whose code is not here is the caller's
# fault (400); anything that is not a project error is a bug (500, code "internal").
HTTP_STATUS: dict[str, int] = {
    # Who is asking is not known, or may not ask.
    "unauthorized": 401,
    "no_client_certificate": 401,
    "permission_denied": 403,
    "quota_exceeded": 403,
    "agent_not_declared": 403,
    "delegation_expired": 403,
    "delegation_revoked": 403,
    "sender_mismatch": 403,
    "not_a_member": 403,
    "no_peer_cert": 403,
    "cert_invalid": 403,
    "cert_not_from_ca": 403,
    "no_agent_san": 403,
    "ambiguous_agent_san": 403,
    "peer_identity_mismatch": 403,
    "peer_key_mismatch": 403,
    "key_invalid": 403,
    # What the request names is not here.
    "not_found": 404,
    "unknown_memory": 404,
    "unknown_link": 404,
    "unknown_peer": 404,
    "unknown_transcript": 404,
    "unknown_tool": 404,
    "body_timeout": 408,
    # It conflicts with what is stored.
    "duplicate_link": 409,
    "duplicate_memory": 409,
    "duplicate_invalidation": 409,
    "already_decided": 409,
    "already_ended": 409,
    "target_not_empty": 409,
    "source_changed": 409,
    "schema_mismatch": 409,
    "agent_claimed": 409,
    "agent_is_node": 409,
    "approval_expired": 410,
    "expired": 410,
    "too_large": 413,
    "rate_limited": 429,
    # The node cannot do it now; the same request may succeed later.
    "quorum_not_reached": 503,
    "not_stored": 503,
    "storage_full": 503,
    "storage_unavailable": 503,
    "storage_corrupt": 503,
    "busy": 503,
    "closed": 503,
    "read_only": 503,
    "node_unavailable": 503,
    "node_restarted": 503,
    # The node's own storage failed.
    "io_error": 500,
    "transcript_corrupt": 500,
    "commit_failed": 500,
    "transaction_aborted": 500,
    "sql_error": 500,
    "internal": 500,
}
# The status of a project error whose code the map does not name.
DEFAULT_STATUS = 400
INTERNAL = "internal"


def status_of(code: str) -> int:
    """The HTTP status that ``code`` answers."""
    return HTTP_STATUS.get(code, DEFAULT_STATUS)


class ProjectError(Exception):
    """An error with a stable snake_case ``code`` (a member of its room's StrEnum, or a code from outside as
    carried) and a human ``message`` naming what was wrong and, where there is one, the fix."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return status_of(self.code)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.code)!r}, {self.message!r})"


class Described(NamedTuple):
    code: str
    message: str
    http_status: int


def describe(exc: BaseException) -> Described:
    """Code, sentence and HTTP status for any exception: a project error's own, or ``internal`` (500)."""
    if isinstance(exc, ProjectError):
        return Described(str(exc.code), exc.message, exc.http_status)
    return Described(INTERNAL, f"internal error: {type(exc).__name__}: {exc}", status_of(INTERNAL))
