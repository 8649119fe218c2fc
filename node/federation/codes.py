"""The reject codes federation answers a peer with (the ACK's ``rejected:<code>``), each spelled once.

Members are ``str``: they compare equal to the strings peers have always received, so an ACK's reason is
unchanged. An inbound change may also be refused with a code from elsewhere (the limits, the permission gate,
a hook, storage); those travel as the plain strings their rooms give them.
"""

from __future__ import annotations

from enum import StrEnum


class RejectCode(StrEnum):
    BAD_PAYLOAD = "bad_payload"                    # the payload's signed part does not parse
    BAD_SIGNATURE = "bad_signature"                # signed, and the signature does not verify
    UNKNOWN_KEY = "unknown_key"                    # pulled history a key of its signer not known here may have signed
    UNVERIFIED_RELAY = "unverified_relay"          # relayed by another than its signer, without a signature
    SIGNER_MISMATCH = "signer_mismatch"            # signed by another agent than the one it names
    NAMESPACE_NOT_ALLOWED = "namespace_not_allowed"  # this node does not share the namespace with the sender
    WRITER_NOT_ALLOWED = "writer_not_allowed"      # the writer may not write versions of that memory
    ORIGIN_MISMATCH = "origin_mismatch"            # a version that changes the memory's origin
    NAMESPACE_MISMATCH = "namespace_mismatch"      # a version that changes the memory's namespace
    VERSION_OUT_OF_RANGE = "version_out_of_range"  # further ahead of the stored version than allowed
    CLOCK_SKEW = "clock_skew"                      # times too far ahead of this node's clock
    EXPIRED_LINK = "expired_link"                  # a link whose validity already ended
    UNKNOWN_MEMORY = "unknown_memory"              # cites a memory not here (or hidden): retryable
    UNKNOWN_LINK = "unknown_link"                  # ends a link not here (or hidden): retryable
    TRANSCRIPTS_DISABLED = "transcripts_disabled"  # the namespace keeps or replicates no transcripts
    UNSUPPORTED_KIND = "unsupported_kind"          # a kind the wire knows and this node does not apply
    RATE_LIMITED = "rate_limited"                  # past limits.peer_requests_per_second: retryable
    # The sharing list is signed with the version (memory.put.v2): a memory.put (signed set 1) that carries a list,
    # or is a version of a memory held restricted here, is refused; its sender must upgrade to send memory.put.v2.
    SHARE_WITH_UNSIGNED = "share_with_unsigned"
    SHARE_WITH_CHANGED = "share_with_changed"      # another writer than the origin changed the stored list
    SHARE_WITH_WITHOUT_ORIGIN = "share_with_without_origin"  # a list that leaves out the memory's origin
    # Agents (docs/security.md, "Agents"): the delegation records and the items their agents sign.
    BAD_DELEGATION = "bad_delegation"              # a delegation or revocation its issuer's key does not verify
    UNKNOWN_ISSUER = "unknown_issuer"              # a delegation or revocation by a node this node does not trust
    AGENT_IS_NODE = "agent_is_node"                # a delegation naming a node (or an agent item signed as one)
    AGENT_CLAIMED = "agent_claimed"                # another node holds a live delegation for that agent here
    REVOCATION_MISMATCH = "revocation_mismatch"    # a revocation not by the delegation's issuer, or of another agent
    UNKNOWN_DELEGATION = "unknown_delegation"      # an agent's item whose delegation is not here yet: retryable
    DELEGATION_MISMATCH = "delegation_mismatch"    # an item naming another agent's delegation (its key signs for it)
    DELEGATION_EXPIRED = "delegation_expired"      # an agent's item dated outside its delegation's window
    DELEGATION_REVOKED = "delegation_revoked"      # an agent's item dated at or after its delegation's revocation
