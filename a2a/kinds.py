"""Per-kind payload schemas, checked at the edge before a payload reaches the node.

Table-driven: a new kind is one more entry in SCHEMAS (a map of field name -> Field),
plus, if it needs one, a cross-field check in CROSS_CHECKS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from a2a.envelope import is_int, is_uuid4
from a2a.errors import ErrorCode, ProtocolError

# A check gets the field's path (for the message) and its value; it raises ProtocolError or returns.
Check = Callable[[str, Any], None]

SIGNATURE_BYTES = 64  # Ed25519


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(path: str, wanted: str, value: Any) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_PAYLOAD, f"{path} must be {wanted}, got {_short(value)}")


@dataclass(frozen=True)
class Field:
    check: Check
    required: bool = True


def string(*, nonempty: bool = False) -> Check:
    def check(path: str, value: Any) -> None:
        if not isinstance(value, str) or (nonempty and not value):
            raise _bad(path, "a non-empty string" if nonempty else "a string", value)

    return check


# Payload integers are stored in SQLite, whose INTEGER is signed 64-bit.
INT64_MAX = 2**63 - 1


def integer(*, minimum: int | None = None) -> Check:
    def check(path: str, value: Any) -> None:
        if not is_int(value) or (minimum is not None and value < minimum) or not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise _bad(path, ("an integer" if minimum is None else f"an integer >= {minimum}") + " (signed 64-bit)",
                       value)

    return check


def number() -> Check:
    """int or finite float (bool excluded)."""

    def check(path: str, value: Any) -> None:
        if not (is_int(value) or (isinstance(value, float) and math.isfinite(value))):
            raise _bad(path, "a finite number", value)

    return check


def uuid4() -> Check:
    def check(path: str, value: Any) -> None:
        if not is_uuid4(value):
            raise _bad(path, "a lowercase UUIDv4 string", value)

    return check


def byte_string(*, length: int) -> Check:
    def check(path: str, value: Any) -> None:
        if not isinstance(value, bytes) or len(value) != length:
            raise _bad(path, f"a byte string of exactly {length} bytes", value)

    return check


def any_bytes() -> Check:
    def check(path: str, value: Any) -> None:
        if not isinstance(value, bytes):
            raise _bad(path, "a byte string", value)

    return check


def span() -> Check:
    """A transcript span: [memory_id, start, end], start and end code points with 0 <= start <= end."""

    def check(path: str, value: Any) -> None:
        ok = (isinstance(value, (list, tuple)) and len(value) == 3 and isinstance(value[0], str) and value[0]
              and is_int(value[1]) and is_int(value[2]) and 0 <= value[1] <= value[2] <= INT64_MAX)
        if not ok:
            raise _bad(path, "[memory_id, start, end] with 0 <= start <= end", value)

    return check


def agent_set() -> Check:
    """A sharing list as a memory.put.v2 signs it: a non-empty array of non-empty strings, sorted by code point
    and without repeats (its one canonical form)."""

    def check(path: str, value: Any) -> None:
        ok = (isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(a, str) and a for a in value)
              and all(a < b for a, b in zip(value, value[1:], strict=False)))
        if not ok:
            raise _bad(path, "a non-empty array of agent ids, sorted and distinct", value)

    return check


def hex_id() -> Check:
    """A record id: 64 lowercase hex characters (a SHA-256)."""

    def check(path: str, value: Any) -> None:
        if not isinstance(value, str) or len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
            raise _bad(path, "64 lowercase hex characters", value)

    return check


def nullable(inner: Check) -> Check:
    def check(path: str, value: Any) -> None:
        if value is not None:
            inner(path, value)

    return check


def list_of(inner: Check) -> Check:
    def check(path: str, value: Any) -> None:
        if not isinstance(value, (list, tuple)):
            raise _bad(path, "an array", value)
        for i, item in enumerate(value):
            inner(f"{path}[{i}]", item)

    return check


def bounded_list_of(inner: Check, *, most: int) -> Check:
    """A non-empty array of at most ``most`` items, each checked by ``inner``."""

    def check(path: str, value: Any) -> None:
        if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= most:
            raise _bad(path, f"an array of 1 to {most} items", value if not isinstance(value, (list, tuple))
                       else f"{len(value)} items")
        list_of(inner)(path, value)

    return check


def record(schema: Mapping[str, Field]) -> Check:
    """A map with exactly the schema's fields (optional ones may be absent); unknown fields are refused."""

    def check(path: str, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise _bad(path, "a map", value)
        for key in value:
            if key not in schema:
                raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"{path} has an unknown field {_short(key)}")
        for name, spec in schema.items():
            if name in value:
                spec.check(f"{path}.{name}", value[name])
            elif spec.required:
                raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"{path}.{name} is missing")

    return check


MEMORY = {
    "id": Field(uuid4()),
    "namespace": Field(string(nonempty=True)),
    "title": Field(string()),
    "content": Field(string()),
    "tags": Field(list_of(string())),
    "priority": Field(integer()),
    "confidence": Field(number()),
    "source": Field(string()),
    "origin": Field(string(nonempty=True)),
    "writer": Field(string(nonempty=True)),
    "version": Field(integer(minimum=1)),
    "created_at": Field(integer(minimum=0)),
    "updated_at": Field(integer(minimum=0)),
}

# The memory record of a memory.put.v2: the same fields and the sharing list, all signed (signed set 2).
MEMORY_V2 = {**MEMORY, "share_with": Field(nullable(agent_set()))}

# The kind that carries signed set 2 (negotiated: sent only to a peer that lists it in its sync pages' "accepts").
MEMORY_PUT_V2 = "memory.put.v2"

LINK = {
    "src_id": Field(string(nonempty=True)),
    "dst_id": Field(string(nonempty=True)),
    "relation": Field(string(nonempty=True)),
    "observed_by": Field(string(nonempty=True)),
    "valid_from": Field(integer(minimum=0)),
    "valid_until": Field(nullable(integer(minimum=0))),
    "confidence": Field(nullable(number()), required=False),
}

# The delegation an agent's item is signed under (outside the signature: it names the record that vouches for the
# agent's key). Only on items an agent signed, and only to peers that list the agent kinds in "accepts".
DELEGATION_HINT = Field(hex_id(), required=False)

# One link as a link.put carries it (without "kind"): the link, its own signature and signer.
LINK_PUT = {
    "link": Field(record(LINK)),
    "signature": Field(nullable(byte_string(length=SIGNATURE_BYTES))),
    "signed_by": Field(nullable(string(nonempty=True))),
    "delegation": DELEGATION_HINT,
}

# Most links in one links.put envelope (a sender packs fewer when their bytes would pass LINKS_PUT_MAX_BYTES).
LINKS_PUT_MAX_ITEMS = 100
# Most bytes a sender packs into one links.put payload (the receiver's envelope limit, 1 MiB by default, is the
# hard bound; this keeps an envelope well inside it and inside one batch frame).
LINKS_PUT_MAX_BYTES = 64 * 1024

# The signed fields of a link invalidation (node/attest.py InvalidationPayload).
INVALIDATION = {
    "link_id": Field(string(nonempty=True)),
    "observed_by": Field(string(nonempty=True)),
    "valid_until": Field(integer(minimum=0)),
}

# The signed fields of a transcript (node/attest.py TranscriptPayload); the text travels as its zstd frame.
TRANSCRIPT = {
    "id": Field(uuid4()),
    "namespace": Field(string(nonempty=True)),
    "agent": Field(string(nonempty=True)),
    "created_at": Field(integer(minimum=0)),
    "content_hash": Field(string(nonempty=True)),
    "raw_bytes": Field(integer(minimum=0)),
    "spans": Field(list_of(span())),
}

# A node vouching for one of its agents (node/attest.py DelegationPayload), and the end of that (RevocationPayload):
# negotiated, sent only to a peer that lists them in "accepts".
AGENT_DELEGATE = "agent.delegate"
AGENT_REVOKE = "agent.revoke"
AGENT_KINDS = (AGENT_DELEGATE, AGENT_REVOKE)
DELEGATION = {
    "agent_id": Field(string(nonempty=True)),
    "agent_key": Field(byte_string(length=32)),
    "issuer": Field(string(nonempty=True)),
    "valid_from": Field(integer(minimum=0)),
    "valid_until": Field(integer(minimum=0)),
}
REVOCATION = {
    "delegation_id": Field(hex_id()),
    "agent_id": Field(string(nonempty=True)),
    "issuer": Field(string(nonempty=True)),
    "revoked_at": Field(integer(minimum=0)),
}

# kind -> fields of the payload other than "kind" itself.
SCHEMAS: dict[str, Mapping[str, Field]] = {
    "ping": {"sent_at": Field(integer(minimum=0), required=False)},
    "memory.put": {
        "memory": Field(record(MEMORY)),
        "signature": Field(nullable(byte_string(length=SIGNATURE_BYTES))),
        "signed_by": Field(nullable(string(nonempty=True))),
        # The origin's namespace peer list when the namespace is restricted: outside the signature (signed set
        # 1), so a node that reads memory.put.v2 refuses a memory.put that carries one (share_with_unsigned).
        "share_with": Field(nullable(list_of(string(nonempty=True))), required=False),
    },
    # A memory version with its sharing list inside the signed record (signed set 2).
    MEMORY_PUT_V2: {
        "memory": Field(record(MEMORY_V2)),
        "signature": Field(nullable(byte_string(length=SIGNATURE_BYTES))),
        "signed_by": Field(nullable(string(nonempty=True))),
        "delegation": DELEGATION_HINT,
    },
    "link.put": LINK_PUT,
    # Several links in one envelope (negotiated: sent only to a peer that lists it in its sync pages' "accepts").
    "links.put": {"links": Field(bounded_list_of(record(LINK_PUT), most=LINKS_PUT_MAX_ITEMS))},
    "link.invalidate": {
        "invalidation": Field(record(INVALIDATION)),
        "signature": Field(nullable(byte_string(length=SIGNATURE_BYTES))),
        "signed_by": Field(nullable(string(nonempty=True))),
        "delegation": DELEGATION_HINT,
    },
    "transcript.put": {
        "transcript": Field(record(TRANSCRIPT)),
        "body": Field(any_bytes()),
        "signature": Field(nullable(byte_string(length=SIGNATURE_BYTES))),
        "signed_by": Field(nullable(string(nonempty=True))),
        "delegation": DELEGATION_HINT,
    },
    # Signed by the issuer (a node), always: an unsigned delegation vouches for nothing.
    AGENT_DELEGATE: {
        "delegation": Field(record(DELEGATION)),
        "signature": Field(byte_string(length=SIGNATURE_BYTES)),
        "signed_by": Field(string(nonempty=True)),
    },
    AGENT_REVOKE: {
        "revocation": Field(record(REVOCATION)),
        "signature": Field(byte_string(length=SIGNATURE_BYTES)),
        "signed_by": Field(string(nonempty=True)),
    },
}


def _signature_pairs_with_signer(payload: Mapping[str, Any]) -> None:
    if (payload["signature"] is None) != (payload["signed_by"] is None):
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD, "payload.signature and payload.signed_by must be both set or both null"
        )


def _each_link_pairs_signature(payload: Mapping[str, Any]) -> None:
    for i, item in enumerate(payload["links"]):
        if (item["signature"] is None) != (item["signed_by"] is None):
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"payload.links[{i}].signature and .signed_by must be both "
                                                       "set or both null")


# kind -> checks across fields, run after every field passed.
CROSS_CHECKS: dict[str, tuple[Callable[[Mapping[str, Any]], None], ...]] = {
    "memory.put": (_signature_pairs_with_signer,),
    MEMORY_PUT_V2: (_signature_pairs_with_signer,),
    "link.put": (_signature_pairs_with_signer,),
    "links.put": (_each_link_pairs_signature,),
    "link.invalidate": (_signature_pairs_with_signer,),
    "transcript.put": (_signature_pairs_with_signer,),
}

KNOWN_KINDS = frozenset(SCHEMAS)
# kind -> the check of a whole payload of that kind, built once rather than per payload.
_PAYLOAD_CHECKS = {kind: record({"kind": Field(string()), **schema}) for kind, schema in SCHEMAS.items()}


def validate_payload(payload: Any) -> Mapping[str, Any]:
    """Check a payload against its kind's schema and return it unchanged.

    Raises ProtocolError ``unknown_kind`` for a kind without a schema, ``bad_payload`` (naming the
    field) for anything else.
    """
    if not isinstance(payload, Mapping):
        raise _bad("payload", "a map", payload)
    kind = payload.get("kind")
    if not isinstance(kind, str):
        raise _bad("payload.kind", "a string", kind)
    check = _PAYLOAD_CHECKS.get(kind)
    if check is None:
        raise ProtocolError(ErrorCode.UNKNOWN_KIND, f"payload.kind {_short(kind)} is not a known kind")
    check("payload", payload)
    for cross in CROSS_CHECKS.get(kind, ()):
        cross(payload)
    return payload


__all__ = ["AGENT_DELEGATE", "AGENT_KINDS", "AGENT_REVOKE", "Field", "KNOWN_KINDS", "MEMORY_PUT_V2", "SCHEMAS",
           "validate_payload"]
