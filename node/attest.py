"""Attestation: canonical CBOR payloads, their ids, Ed25519 sign and verify (docs/protocol.md).

Links: the signed payload is canonical CBOR (RFC 8949 section 4.2.1) of exactly the six fields in
``SIGNED_FIELDS``; times are integer unix milliseconds and ``valid_until`` may be None.
``link_id`` is the hex SHA-256 of those bytes. ``shared/vectors/link-signing.json`` is normative.

Memory versions come in two signed field sets (``signed_set``). Set 1, the old one: canonical CBOR of
``{"type": "memory.version"}`` plus the fields in ``MEMORY_SIGNED_FIELDS`` (tags as an array, confidence always
a float). Set 2 (``memory.put.v2`` on the wire): ``{"type": "memory.version.v2"}``, the same fields and
``share_with``, the sharing list: null (unrestricted, stated) or the agents that may see the memory, sorted by
code point and distinct. Either is signed by the version's writer; the ``type`` entry keeps a memory signature
from ever verifying as anything else, or as the other set. ``tests/node/test_attest_vectors.py`` pins a vector
for each.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import cbor2
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from base.errors import ProjectError

# The one enum of attest levels lives with the column it constrains; re-exported for the node room.
from storage.links import AttestLevel as AttestLevel

SIGNED_FIELDS = ("src_id", "dst_id", "relation", "observed_by", "valid_from", "valid_until")
MEMORY_SIGNED_FIELDS = ("id", "namespace", "title", "content", "tags", "priority", "confidence", "source",
                        "origin", "writer", "version", "created_at", "updated_at")
MEMORY_PAYLOAD_TYPE = "memory.version"
# The signed field sets of a memory version: 1 without the sharing list (versions signed before it was signed,
# and what an older peer reads), 2 with it.
SIGNED_SET_OLD = 1
SIGNED_SET_SHARED = 2
MEMORY_SHARED_TYPE = "memory.version.v2"
SIGNATURE_BYTES = 64


class AttestCode(StrEnum):
    """The codes an AttestError carries: which signed field set a value does not fit."""

    BAD_LINK_FIELD = "bad_link_field"
    BAD_MEMORY_FIELD = "bad_memory_field"
    BAD_INVALIDATION_FIELD = "bad_invalidation_field"
    BAD_TRANSCRIPT_FIELD = "bad_transcript_field"
    BAD_DELEGATION_FIELD = "bad_delegation_field"


class AttestError(ProjectError):
    """A value that cannot be part of a signed payload; the message names the field."""


@dataclass(frozen=True, slots=True)
class LinkPayload:
    """The six signed fields of a link; times in unix milliseconds."""

    src_id: str
    dst_id: str
    relation: str
    observed_by: str
    valid_from: int
    valid_until: int | None
    # The canonical bytes, encoded once: a link's id and its signature are both over them (on a sender and on
    # every receiver), and each encoding with its field dict cost ~10 us a link (docs/perf-history.md, issue 16).
    _canonical: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("src_id", "dst_id", "relation", "observed_by"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise AttestError(AttestCode.BAD_LINK_FIELD,
                                  f"link field {name} must be a non-empty string, got {value!r}")
        if not _is_int(self.valid_from) or self.valid_from < 0:
            raise AttestError(AttestCode.BAD_LINK_FIELD,
                              f"valid_from must be an integer >= 0 (unix ms), got {self.valid_from!r}")
        if self.valid_until is not None and (not _is_int(self.valid_until) or self.valid_until < self.valid_from):
            raise AttestError(AttestCode.BAD_LINK_FIELD,
                              "valid_until must be null or an integer >= valid_from (unix ms), "
                              f"got {self.valid_until!r}")
        object.__setattr__(self, "_canonical", cbor2.dumps(self.to_dict(), canonical=True))

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> LinkPayload:
        missing = [f for f in SIGNED_FIELDS if f not in m]
        if missing:
            raise AttestError(AttestCode.BAD_LINK_FIELD, f"link is missing field(s) {', '.join(missing)}")
        return cls(**{f: m[f] for f in SIGNED_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """The six signed fields (all immutable scalars: no deep copy needed)."""
        return {"src_id": self.src_id, "dst_id": self.dst_id, "relation": self.relation,
                "observed_by": self.observed_by, "valid_from": self.valid_from, "valid_until": self.valid_until}

    def canonical_bytes(self) -> bytes:
        return self._canonical

    @property
    def link_id(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


@dataclass(frozen=True, slots=True)
class MemoryPayload:
    """The signed fields of one memory version (from a stored row or a wire record), in signed set
    ``signed_set``: 1 the old fields, 2 with ``share_with``."""

    fields: tuple[tuple[str, Any], ...]
    signed_set: int = SIGNED_SET_OLD
    # The canonical bytes once encoded: a received version's signature check and its audit event's version hash
    # are both over them.
    _canonical: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], signed_set: int = SIGNED_SET_OLD) -> MemoryPayload:
        """Set 2 needs ``share_with`` in ``m``: None, or a non-empty list of agent ids sorted by code point
        without repeats (the one form a list is signed in; anything else is refused, not reordered)."""
        if signed_set not in (SIGNED_SET_OLD, SIGNED_SET_SHARED):
            raise AttestError(AttestCode.BAD_MEMORY_FIELD, f"no signed field set {signed_set!r} (1 or 2)")
        names = MEMORY_SIGNED_FIELDS + (("share_with",) if signed_set == SIGNED_SET_SHARED else ())
        missing = [f for f in names if f not in m]
        if missing:
            raise AttestError(AttestCode.BAD_MEMORY_FIELD, f"memory is missing field(s) {', '.join(missing)}")
        norm = {f: m[f] for f in names}
        norm["tags"] = list(norm["tags"])
        norm["confidence"] = float(norm["confidence"])
        if signed_set == SIGNED_SET_SHARED:
            norm["share_with"] = canonical_share_with(norm["share_with"])
        return cls(tuple(norm.items()), signed_set)

    @classmethod
    def of(cls, obj: Any) -> MemoryPayload:
        """From any object with the signed fields as attributes (a MemoryRow), in the set its ``signed_set``
        names (1 when it has none)."""
        signed_set = getattr(obj, "signed_set", SIGNED_SET_OLD)
        names = MEMORY_SIGNED_FIELDS + (("share_with",) if signed_set == SIGNED_SET_SHARED else ())
        return cls.from_mapping({f: getattr(obj, f) for f in names}, signed_set)

    def canonical_bytes(self) -> bytes:
        if self._canonical is None:
            kind = MEMORY_SHARED_TYPE if self.signed_set == SIGNED_SET_SHARED else MEMORY_PAYLOAD_TYPE
            object.__setattr__(self, "_canonical", cbor2.dumps({"type": kind, **dict(self.fields)}, canonical=True))
        assert self._canonical is not None
        return self._canonical

    @property
    def version_hash(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


def canonical_share_with(value: Any) -> list[str] | None:
    """``value`` as signed set 2 carries it: None, or the list itself when it is non-empty, sorted by code point
    (which is UTF-8 byte order) and without repeats, each a non-empty string; AttestError otherwise."""
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple)) else None
    if not items or not all(isinstance(a, str) and a for a in items) or items != sorted(set(items)):
        raise AttestError(AttestCode.BAD_MEMORY_FIELD,
                          f"share_with must be null or a non-empty list of agent ids, sorted and distinct, "
                          f"got {value!r}")
    return items


# The invalidation record's "type" field: no link payload has it, so the two can never be confused.
INVALIDATION_TYPE = "link.invalidate"
INVALIDATION_FIELDS = ("link_id", "observed_by", "valid_until")


@dataclass(frozen=True, slots=True)
class InvalidationPayload:
    """A signed end of validity for one link: canonical CBOR of ``{type, link_id, observed_by, valid_until}``.

    ``valid_until`` is unix ms: the link is not valid at or after it. ``inval_id`` is the hex SHA-256 of
    the canonical bytes, as ``link_id`` is for links.
    """

    link_id: str
    observed_by: str
    valid_until: int

    def __post_init__(self) -> None:
        for name in ("link_id", "observed_by"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise AttestError(AttestCode.BAD_INVALIDATION_FIELD,
                                  f"invalidation field {name} must be a non-empty string, got {value!r}")
        if not _is_int(self.valid_until) or self.valid_until < 0:
            raise AttestError(AttestCode.BAD_INVALIDATION_FIELD,
                              f"valid_until must be an integer >= 0 (unix ms), got {self.valid_until!r}")

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> InvalidationPayload:
        missing = [f for f in INVALIDATION_FIELDS if f not in m]
        if missing:
            raise AttestError(AttestCode.BAD_INVALIDATION_FIELD,
                              f"invalidation is missing field(s) {', '.join(missing)}")
        return cls(**{f: m[f] for f in INVALIDATION_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def canonical_bytes(self) -> bytes:
        return cbor2.dumps({"type": INVALIDATION_TYPE, **self.to_dict()}, canonical=True)

    @property
    def inval_id(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


# The transcript record's "type" field (and the a2a kind that carries it).
TRANSCRIPT_TYPE = "transcript.put"
TRANSCRIPT_FIELDS = ("id", "namespace", "agent", "created_at", "content_hash", "raw_bytes", "spans")


@dataclass(frozen=True, slots=True)
class TranscriptPayload:
    """A signed transcript: canonical CBOR of ``{type: "transcript.put", id, namespace, agent, created_at,
    content_hash, raw_bytes, spans}``. The text is covered by ``content_hash`` (hex SHA-256 of its UTF-8
    bytes, ``raw_bytes`` long); ``spans`` are ``[memory_id, start, end]`` in Unicode code points, sorted.
    ``record_hash`` (hex SHA-256 of the canonical bytes) is what signed_events records."""

    id: str
    namespace: str
    agent: str
    created_at: int
    content_hash: str
    raw_bytes: int
    spans: tuple[tuple[str, int, int], ...]

    def __post_init__(self) -> None:
        for name in ("id", "namespace", "agent", "content_hash"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise AttestError(AttestCode.BAD_TRANSCRIPT_FIELD,
                                  f"transcript field {name} must be a non-empty string, got {value!r}")
        for name in ("created_at", "raw_bytes"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise AttestError(AttestCode.BAD_TRANSCRIPT_FIELD, f"{name} must be an integer >= 0, got {value!r}")
        for span in self.spans:
            ok = (len(span) == 3 and isinstance(span[0], str) and span[0] and _is_int(span[1]) and _is_int(span[2])
                  and 0 <= span[1] <= span[2])
            if not ok:
                raise AttestError(AttestCode.BAD_TRANSCRIPT_FIELD,
                                  f"a span must be [memory_id, start, end] with 0 <= start <= end, got {span!r}")
        if list(self.spans) != sorted(set(self.spans)):
            raise AttestError(AttestCode.BAD_TRANSCRIPT_FIELD, "spans must be sorted and distinct")

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> TranscriptPayload:
        missing = [f for f in TRANSCRIPT_FIELDS if f not in m]
        if missing:
            raise AttestError(AttestCode.BAD_TRANSCRIPT_FIELD, f"transcript is missing field(s) {', '.join(missing)}")
        spans = m["spans"]
        if not isinstance(spans, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in spans):
            raise AttestError(AttestCode.BAD_TRANSCRIPT_FIELD,
                              f"spans must be a list of [memory_id, start, end], got {spans!r}")
        return cls(**{f: m[f] for f in TRANSCRIPT_FIELDS if f != "spans"}, spans=tuple(tuple(s) for s in spans))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["spans"] = [list(s) for s in self.spans]
        return d

    def canonical_bytes(self) -> bytes:
        return cbor2.dumps({"type": TRANSCRIPT_TYPE, **self.to_dict()}, canonical=True)

    @property
    def record_hash(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


# The delegation and revocation records' "type" fields (docs/protocol.md, "Agents").
DELEGATION_TYPE = "agent.delegation"
DELEGATION_FIELDS = ("agent_id", "agent_key", "issuer", "valid_from", "valid_until")
REVOCATION_TYPE = "agent.revocation"
REVOCATION_FIELDS = ("delegation_id", "agent_id", "issuer", "revoked_at")
AGENT_KEY_BYTES = 32
_HEX_ID_CHARS = 64


@dataclass(frozen=True, slots=True)
class DelegationPayload:
    """A node vouching for one of its agents: canonical CBOR of ``{type: "agent.delegation", agent_id, agent_key,
    issuer, valid_from, valid_until}``, signed by the issuer (the node). ``agent_key`` is the agent's raw 32-byte
    Ed25519 public key; what the agent signs at a time in ``[valid_from, valid_until)`` (unix ms) is vouched for.
    ``delegation_id`` is the hex SHA-256 of the canonical bytes."""

    agent_id: str
    agent_key: bytes
    issuer: str
    valid_from: int
    valid_until: int

    def __post_init__(self) -> None:
        for name in ("agent_id", "issuer"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise AttestError(AttestCode.BAD_DELEGATION_FIELD,
                                  f"delegation field {name} must be a non-empty string, got {value!r}")
        if not isinstance(self.agent_key, bytes) or len(self.agent_key) != AGENT_KEY_BYTES:
            raise AttestError(AttestCode.BAD_DELEGATION_FIELD,
                              f"agent_key must be the agent's raw {AGENT_KEY_BYTES}-byte Ed25519 public key")
        if not _is_int(self.valid_from) or self.valid_from < 0:
            raise AttestError(AttestCode.BAD_DELEGATION_FIELD,
                              f"valid_from must be an integer >= 0 (unix ms), got {self.valid_from!r}")
        if not _is_int(self.valid_until) or self.valid_until <= self.valid_from:
            raise AttestError(AttestCode.BAD_DELEGATION_FIELD,
                              f"valid_until must be an integer > valid_from (unix ms), got {self.valid_until!r}")

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> DelegationPayload:
        missing = [f for f in DELEGATION_FIELDS if f not in m]
        if missing:
            raise AttestError(AttestCode.BAD_DELEGATION_FIELD, f"delegation is missing field(s) {', '.join(missing)}")
        return cls(**{f: m[f] for f in DELEGATION_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "agent_key": self.agent_key, "issuer": self.issuer,
                "valid_from": self.valid_from, "valid_until": self.valid_until}

    def canonical_bytes(self) -> bytes:
        return cbor2.dumps({"type": DELEGATION_TYPE, **self.to_dict()}, canonical=True)

    @property
    def delegation_id(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


@dataclass(frozen=True, slots=True)
class RevocationPayload:
    """The end of a delegation: canonical CBOR of ``{type: "agent.revocation", delegation_id, agent_id, issuer,
    revoked_at}``, signed by the delegation's issuer. What the agent signed at ``revoked_at`` (unix ms) or later
    under that delegation is refused; what it signed before keeps verifying. ``revocation_id``: the hex SHA-256
    of the canonical bytes."""

    delegation_id: str
    agent_id: str
    issuer: str
    revoked_at: int

    def __post_init__(self) -> None:
        for name in ("agent_id", "issuer"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise AttestError(AttestCode.BAD_DELEGATION_FIELD,
                                  f"revocation field {name} must be a non-empty string, got {value!r}")
        if not is_hex_id(self.delegation_id):
            raise AttestError(AttestCode.BAD_DELEGATION_FIELD,
                              f"delegation_id must be 64 lowercase hex characters, got {self.delegation_id!r}")
        if not _is_int(self.revoked_at) or self.revoked_at < 0:
            raise AttestError(AttestCode.BAD_DELEGATION_FIELD,
                              f"revoked_at must be an integer >= 0 (unix ms), got {self.revoked_at!r}")

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> RevocationPayload:
        missing = [f for f in REVOCATION_FIELDS if f not in m]
        if missing:
            raise AttestError(AttestCode.BAD_DELEGATION_FIELD, f"revocation is missing field(s) {', '.join(missing)}")
        return cls(**{f: m[f] for f in REVOCATION_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def canonical_bytes(self) -> bytes:
        return cbor2.dumps({"type": REVOCATION_TYPE, **self.to_dict()}, canonical=True)

    @property
    def revocation_id(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


def is_hex_id(value: object) -> bool:
    """A record id: 64 lowercase hex characters (a SHA-256)."""
    return isinstance(value, str) and len(value) == _HEX_ID_CHARS and all(c in "0123456789abcdef" for c in value)


Signable = (LinkPayload | MemoryPayload | InvalidationPayload | TranscriptPayload | DelegationPayload
            | RevocationPayload)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def sign(private_key: Ed25519PrivateKey, payload: Signable) -> bytes:
    """Ed25519 signature (64 bytes) over the canonical payload."""
    return private_key.sign(payload.canonical_bytes())


def verify_any(keys: Iterable[Ed25519PublicKey], payload: Signable,
               signature: bytes | None) -> bool:
    """True when ``signature`` verifies under one of ``keys`` (a signer's current key, then its retired ones)."""
    return any(verify(k, payload, signature) for k in keys)


def verify(public_key: Ed25519PublicKey, payload: Signable, signature: bytes | None) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of the canonical payload by ``public_key``.

    Checked by libsodium (PyNaCl): half the CPU of OpenSSL's check here (bench/verify_bench.py). libsodium
    refuses what OpenSSL refuses, and also non-canonical or small-order keys and small-order R points, which
    no generated key or honest signature has: under a small-order key OpenSSL takes one (R, S) for a
    signature of every message (tests/node/test_attest_verify.py)."""
    if not isinstance(signature, (bytes, bytearray)) or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        crypto_sign_open(bytes(signature) + payload.canonical_bytes(), public_key.public_bytes_raw())
    except BadSignatureError:
        return False
    return True


def verify_many(items: Iterable[tuple[tuple[Ed25519PublicKey, ...], Signable, bytes | None]]
                ) -> list[bool]:
    """Verify a batch, each against a signer's keyring; run on a worker thread so the event loop keeps
    serving between verifications."""
    return [verify_any(keys, p, s) for keys, p, s in items]


def claimed_at(payload: Signable) -> int:
    """The time a signed payload claims for itself (unix ms)."""
    if isinstance(payload, MemoryPayload):
        updated_at = dict(payload.fields)["updated_at"]
        return updated_at if isinstance(updated_at, int) else 0
    if isinstance(payload, LinkPayload):
        return payload.valid_from
    if isinstance(payload, InvalidationPayload):
        return payload.valid_until
    if isinstance(payload, DelegationPayload):
        return payload.valid_from
    if isinstance(payload, RevocationPayload):
        return payload.revoked_at
    return payload.created_at
