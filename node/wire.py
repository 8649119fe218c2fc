"""The shapes of memories and links: as tools and the CLI show them, and as they travel (memory.put, link.put)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from node import attest
from storage.links import LinkRow
from storage.memories import MemoryRow

# Every field is immutable, so a shallow copy will do: asdict's deep copy cost ~40 us a row, a quarter
# of a millisecond on each 10-hit recall (PERFORMANCE.md, "Recall at 100k").
_MEMORY_FIELDS = tuple(f.name for f in fields(MemoryRow))
_LINK_FIELDS = tuple(f.name for f in fields(LinkRow))


def memory_dict(row: MemoryRow) -> dict[str, Any]:
    d = {name: getattr(row, name) for name in _MEMORY_FIELDS}
    d["tags"] = list(row.tags)
    d["signature"] = row.signature.hex() if row.signature else None
    d["share_with"] = None if row.share_with is None else list(row.share_with)
    return d


def memory_wire(row: MemoryRow) -> dict[str, Any]:
    """The memory record of a memory.put: exactly the signed fields of this version."""
    return {f: getattr(row, f) for f in attest.MEMORY_SIGNED_FIELDS} | {"tags": list(row.tags)}


def memory_put_body(row: MemoryRow) -> dict[str, Any]:
    """The memory.put body: the version's record, its signature and signer, and who may see it."""
    body: dict[str, Any] = {"memory": memory_wire(row), "signature": row.signature, "signed_by": row.signed_by}
    if row.share_with is not None:
        body["share_with"] = list(row.share_with)
    return body


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
