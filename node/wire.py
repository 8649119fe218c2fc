"""The shapes of memories and links: as tools and the CLI show them, and as they travel (memory.put, link.put)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import cbor2

from a2a import ErrorCode, ProtocolError, validate_payload
from a2a.envelope import Envelope, decode_frame, new_envelope
from node import attest
from storage.links import LinkRow
from storage.memories import MemoryRow

# Every field is immutable, so a shallow copy will do: asdict's deep copy cost ~40 us a row, a quarter
# of a millisecond on each 10-hit recall (docs/perf-history.md, "Recall at 100k").
_MEMORY_FIELDS = tuple(f.name for f in fields(MemoryRow))
_LINK_FIELDS = tuple(f.name for f in fields(LinkRow))


def memory_dict(row: MemoryRow) -> dict[str, Any]:
    d = {name: getattr(row, name) for name in _MEMORY_FIELDS}
    d["tags"] = list(row.tags)
    d["signature"] = row.signature.hex() if row.signature else None
    d["share_with"] = None if row.share_with is None else list(row.share_with)
    return d


def memory_wire(row: MemoryRow) -> dict[str, Any]:
    """The memory record of a memory.put: exactly the fields of signed set 1."""
    return {f: getattr(row, f) for f in attest.MEMORY_SIGNED_FIELDS} | {"tags": list(row.tags)}


def memory_put_body(row: MemoryRow, signature: bytes | None = None) -> dict[str, Any]:
    """The memory.put body (signed set 1, what an older peer reads): the version's record, its signature and
    signer, and who may see it outside the signature. ``signature``: a set-1 signature made for this body
    when the stored one covers set 2 (``row.signed_set``)."""
    sig = row.signature if signature is None else signature
    body: dict[str, Any] = {"memory": memory_wire(row), "signature": sig, "signed_by": row.signed_by}
    if row.share_with is not None:
        body["share_with"] = list(row.share_with)
    return body


def memory_put_v2_body(row: MemoryRow) -> dict[str, Any]:
    """The memory.put.v2 body (signed set 2): the record with its sharing list inside, signature and signer."""
    memory = memory_wire(row) | {"share_with": None if row.share_with is None else list(row.share_with)}
    return {"memory": memory, "signature": row.signature, "signed_by": row.signed_by}


def link_dict(row: LinkRow) -> dict[str, Any]:
    d = {name: getattr(row, name) for name in _LINK_FIELDS}  # as memory_dict: no deep copy
    d["signature"] = row.signature.hex() if row.signature else None
    return d


def link_wire(row: LinkRow) -> dict[str, Any]:
    """The link.put body: the six signed fields, the raw 64-byte signature and the signer."""
    link = {f: getattr(row, f) for f in attest.SIGNED_FIELDS}
    if row.confidence is not None:
        link["confidence"] = row.confidence
    return {"link": link, "signature": row.signature, "signed_by": row.signed_by}


# An envelope's fields that differ between the copies of one change sent to several peers.
_PER_PEER = ("recipients", "correlation_id")


# An envelope map's keys in canonical CBOR order, with their encodings, per key set (there is one).
_KEY_ORDERS: dict[tuple[str, ...], list[tuple[str, bytes]]] = {}


def _key_order(keys: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """Canonical CBOR map order (RFC 7049 3.9, as ``cbor2.dumps(canonical=True)``): shorter encoded key first,
    then bytewise."""
    order = _KEY_ORDERS.get(keys)
    if order is None:
        encoded = sorted((len(k), k, key) for key in keys for k in [cbor2.dumps(key)])
        order = _KEY_ORDERS[keys] = [(key, k) for _, k, key in encoded]
    return order


def envelope_wires(sender: str, peers: Sequence[str], payload: Mapping[str, Any], now_ms: int,
                   ttl_ms: int) -> list[tuple[str, bytes]]:
    """One envelope of ``payload`` per peer (recipients ``[peer]``, a fresh correlation id each), as
    ``(correlation_id, bytes)``, each byte for byte what ``Envelope.to_wire`` encodes. The payload is
    validated and encoded once, not once per peer: a canonical map is its entries' encodings in key order,
    so only the two per-peer entries are encoded per copy (a link.put cost ~25 us a peer to build and
    encode whole, in the writer's transaction; docs/perf-history.md, issue 16). ``peers`` are configured peer
    ids (the first is checked as an envelope recipient; the config checks them all)."""
    if not peers:
        return []
    first = new_envelope(sender, [peers[0]], payload, now_ms, ttl_ms)  # validates payload, sender, times
    m = first.to_map()
    order = _key_order(tuple(m))
    head = bytes([0xA0 | len(m)])  # a map of 7 entries: its head is one byte (major type 5, count < 24)
    fixed = {key: k + cbor2.dumps(m[key], canonical=True) for key, k in order if key not in _PER_PEER}
    out = []
    for i, peer in enumerate(peers):
        cid = first.correlation_id if i == 0 else str(uuid.uuid4())
        own = {"recipients": [peer], "correlation_id": cid}
        out.append((cid, head + b"".join(fixed[key] if key in fixed else k + cbor2.dumps(own[key])
                                         for key, k in order)))
    return out


def split_links_put(envelope: bytes) -> list[tuple[str, bytes]]:
    """A queued links.put envelope as one link.put envelope per link (same sender, recipients and expiry, a
    fresh correlation id each), as ``(correlation_id, bytes)``: what the outbox sends instead when the peer
    refused the packed envelope. Raises ProtocolError when ``envelope`` is not a links.put this node queued."""
    env = decode_frame(envelope, len(envelope))
    if not isinstance(env, Envelope) or env.kind != "links.put":
        raise ProtocolError(ErrorCode.BAD_TYPE, "not a links.put envelope")
    validate_payload(env.payload)
    out = []
    for item in env.payload["links"]:
        one = Envelope(correlation_id=str(uuid.uuid4()), sender=env.sender, recipients=env.recipients,
                       payload={"kind": "link.put", **item}, expires_at=env.expires_at)
        out.append((one.correlation_id, one.to_wire()))
    return out
