"""The service room's errors, and the node's one door to the project's error root (``base.errors``).

Every room raises its own ``ProjectError`` subclass with a stable ``code`` from its StrEnum and a human
``message`` (ConfigError, StorageError, MeshError, ProtocolError, AttestError, HookError, ServiceError); the
edges (CLI, MCP, HTTP) turn any of them into exit codes, tool errors and JSON bodies through ``describe``.
"""

from __future__ import annotations

from enum import StrEnum

from base.errors import Described, ProjectError, describe

__all__ = ["Described", "ServiceCode", "ServiceError", "describe", "is_project_error"]


class ServiceCode(StrEnum):
    """The codes a ServiceError carries. A permission rule's or a hook's deny keeps the code it names."""

    BAD_INPUT = "bad_input"
    TOO_LARGE = "too_large"
    CONTENT_EMPTY = "content_empty"
    NOT_FOUND = "not_found"
    UNKNOWN_MEMORY = "unknown_memory"
    UNKNOWN_LINK = "unknown_link"
    UNKNOWN_PEER = "unknown_peer"
    UNKNOWN_TOOL = "unknown_tool"
    DUPLICATE_LINK = "duplicate_link"
    ALREADY_ENDED = "already_ended"
    SPAN_OUT_OF_RANGE = "span_out_of_range"
    WRITER_NOT_ALLOWED = "writer_not_allowed"
    VERSION_EXHAUSTED = "version_exhausted"
    TRANSCRIPTS_DISABLED = "transcripts_disabled"
    PERMISSION_DENIED = "permission_denied"
    APPROVAL_REQUIRED = "approval_required"
    QUOTA_EXCEEDED = "quota_exceeded"
    APPROVALS_UNAVAILABLE = "approvals_unavailable"
    ALREADY_DECIDED = "already_decided"
    APPROVAL_EXPIRED = "approval_expired"
    UNAUTHORIZED = "unauthorized"
    RATE_LIMITED = "rate_limited"
    STORAGE_FULL = "storage_full"
    QUORUM_NOT_REACHED = "quorum_not_reached"
    # The local doors: the node's socket and home.
    BAD_FRAME = "bad_frame"
    NODE_UNAVAILABLE = "node_unavailable"
    NODE_RESTARTED = "node_restarted"
    SOCKET_IN_USE = "socket_in_use"
    SOCKET_PATH_TAKEN = "socket_path_taken"
    PORT_IN_USE = "port_in_use"
    CANNOT_LISTEN = "cannot_listen"
    HOME_NOT_FOUND = "home_not_found"
    HOME_EMPTY = "home_empty"
    # A file of the home this process's user may not read or write (node/files.py).
    FILE_UNREADABLE = "file_unreadable"
    FILE_UNWRITABLE = "file_unwritable"
    KEY_INVALID = "key_invalid"
    KEY_FILE_MODE = "key_file_mode"
    # A restore from the mesh (node/federation/restore.py).
    STORE_NOT_EMPTY = "store_not_empty"
    RESTORE_MARKER_INVALID = "restore_marker_invalid"
    # Agents as principals (node/agents/).
    AGENT_IS_NODE = "agent_is_node"
    AGENT_CLAIMED = "agent_claimed"
    AGENT_NOT_DECLARED = "agent_not_declared"
    TOO_MANY_AGENTS = "too_many_agents"
    NO_IDENTITY = "no_identity"
    DELEGATION_EXPIRED = "delegation_expired"
    DELEGATION_REVOKED = "delegation_revoked"
    NODE_TOO_OLD = "node_too_old"


class ServiceError(ProjectError):
    """An operation the service refuses or cannot do: ``code`` (a ServiceCode, or the code a permission rule
    or hook denied with) and a sentence."""


def is_project_error(exc: BaseException) -> bool:
    """True for an error the project raised on purpose (it has a code and a sentence), False for a bug."""
    return isinstance(exc, ProjectError)
