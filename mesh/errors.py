"""The mesh room's exception family: a stable code plus a human sentence."""

from __future__ import annotations

from enum import StrEnum

from base.errors import ProjectError


class MeshCode(StrEnum):
    """The codes a MeshError carries. A peer's refusal of this node keeps the peer's own code."""

    # Key files and identities (mesh/keys.py).
    BAD_AGENT_ID = "bad_agent_id"
    BAD_KEY_FILE_NAME = "bad_key_file_name"
    KEY_INVALID = "key_invalid"
    KEY_MISSING = "key_missing"
    KEY_FILE_MODE = "key_file_mode"
    KEY_PAIR_MISMATCH = "key_pair_mismatch"
    FILE_EXISTS = "file_exists"
    IDENTITY_EXISTS = "identity_exists"
    NO_IDENTITY = "no_identity"
    AMBIGUOUS_IDENTITY = "ambiguous_identity"
    PEER_KEY_CONFLICT = "peer_key_conflict"
    # Key history bundles (mesh/keyhistory.py).
    KEY_BUNDLE_INVALID = "key_bundle_invalid"
    KEY_HISTORY_CONFLICT = "key_history_conflict"
    # The mesh CA and certificates (mesh/ca.py, mesh/tls.py).
    CA_EXISTS = "ca_exists"
    CA_MISSING = "ca_missing"
    CERT_MISSING = "cert_missing"
    CERT_INVALID = "cert_invalid"
    CERT_KEY_MISMATCH = "cert_key_mismatch"
    CERT_NOT_FROM_CA = "cert_not_from_ca"
    BAD_SAN = "bad_san"
    BAD_VALIDITY = "bad_validity"
    NO_AGENT_SAN = "no_agent_san"
    AMBIGUOUS_AGENT_SAN = "ambiguous_agent_san"
    NO_PEER_CERT = "no_peer_cert"
    PEER_IDENTITY_MISMATCH = "peer_identity_mismatch"
    PEER_KEY_MISMATCH = "peer_key_mismatch"
    TLS_CONFIG = "tls_config"
    # Sockets and links (mesh/server.py, mesh/link.py).
    PORT_IN_USE = "port_in_use"
    CANNOT_LISTEN = "cannot_listen"
    NOT_A_MEMBER = "not_a_member"
    CONNECT_FAILED = "connect_failed"
    REFUSED = "refused"
    LINK_DOWN = "link_down"
    LINK_CLOSED = "link_closed"
    WS_ERROR = "ws_error"
    HTTP_ERROR = "http_error"
    ACK_TIMEOUT = "ack_timeout"
    RATE_LIMITED = "rate_limited"
    BAD_SYNC_PAGE = "bad_sync_page"


class MeshError(ProjectError):
    """A trust-fabric or wire failure.

    ``code`` is stable snake_case (callers and HTTP map on it); ``message`` is
    a sentence for humans, naming the file or peer involved and what to do.
    """

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
