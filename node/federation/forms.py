"""Which form of a memory version each peer gets (docs/protocol.md, "The version step").

A version signed over set 2 (its sharing list inside the signature) travels as ``memory.put.v2`` to a peer that
reads it: one whose sync pages list the kind in ``accepts`` (live sends), or whose sync request does (pages
served to it). An older peer reads ``memory.put`` only, whose list is outside the signature, where any relay can
drop it. So:

- A restricted memory never goes to an older peer: it is withheld until the peer upgrades, and then reaches it
  through its catch-up (an upgraded node pulls every peer's change log once more from the start).
- An unrestricted version goes to an older peer as ``memory.put``: as stored when its signature covers set 1;
  with a set-1 signature made for it when this node wrote it (the writer's key signs either set); another
  writer's set-2 version has no set-1 signature here and is withheld (the older peer gets it from its writer).
- A peer that reads ``memory.put.v2`` gets set-2 versions as such, and a set-1 version only when it is
  unrestricted: a set-1 version with a list is refused by every upgraded node (``share_with_unsigned``).

Each version withheld is counted (``withheld:<reason>``, in the federation counters) and logged once per peer and
reason (``memory_withheld``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from enum import StrEnum
from typing import Any

from a2a.kinds import MEMORY_PUT_V2
from mesh.keys import Identity
from node import attest
from node.agents.book import AgentBook
from node.attest import (
    SIGNED_SET_OLD,
    SIGNED_SET_SHARED,
    InvalidationPayload,
    LinkPayload,
    MemoryPayload,
    Signable,
    TranscriptPayload,
    claimed_at,
)
from node.wire import memory_put_body, memory_put_v2_body
from storage.agents import DelegationRow
from storage.memories import MemoryRow

log = logging.getLogger("node.federation")


class Withheld(StrEnum):
    """Why a memory version is not sent to a peer."""

    PEER_MUST_UPGRADE = "peer_must_upgrade"  # restricted, and the peer reads no memory.put.v2
    UNSIGNED_LIST = "unsigned_list"          # restricted, signed before the list was (set 1): refused everywhere now
    NO_OLD_FORM = "no_old_form"              # unrestricted, another writer's set-2 signature: no set 1 to give
    AGENTS_UNREAD = "agents_unread"          # signed by an agent (or a delegation), and the peer reads no agent kinds


_WHY = {
    Withheld.PEER_MUST_UPGRADE: "the peer reads no memory.put.v2: restricted memories wait until it upgrades",
    Withheld.UNSIGNED_LIST: "a restricted version signed before its sharing list was: it waits for the origin's "
                            "next version",
    Withheld.NO_OLD_FORM: "the peer reads no memory.put.v2 and only the version's writer can sign the old form: "
                          "it gets the version from its writer",
    Withheld.AGENTS_UNREAD: "the peer reads no agent.delegate (it is older than agents): what agents sign, and the "
                            "delegations that vouch for them, wait until it upgrades",
}


class MemoryForms:
    """The payload each peer gets for a memory version (``payload``); ``identity``: this node's key, which signs
    set 1 for the unrestricted versions this node wrote when an older peer is to get them."""

    def __init__(self, identity: Identity | None, counters: Counter[str]) -> None:
        self.identity = identity
        self.counters = counters
        self._told: set[tuple[str, Withheld]] = set()

    def payload(self, row: MemoryRow, peer: str, reads_v2: bool) -> dict[str, Any] | None:
        """The ``memory.put.v2`` or ``memory.put`` payload of ``row`` for ``peer`` (``reads_v2``: it said it reads
        memory.put.v2), or None when the version is withheld from it."""
        restricted = row.share_with is not None
        # Unsigned: neither form vouches for the list (a receiver takes it from its writer only).
        if row.signature is None:
            if reads_v2:
                return {"kind": MEMORY_PUT_V2, **memory_put_v2_body(row)}
            if restricted:
                self._withheld(row, peer, Withheld.PEER_MUST_UPGRADE)
                return None
            return self._old(row)
        if row.signed_set == SIGNED_SET_OLD:
            if restricted:
                self._withheld(row, peer, Withheld.UNSIGNED_LIST if reads_v2 else Withheld.PEER_MUST_UPGRADE)
                return None
            return self._old(row)
        if reads_v2:
            return {"kind": MEMORY_PUT_V2, **memory_put_v2_body(row)}
        if restricted:
            self._withheld(row, peer, Withheld.PEER_MUST_UPGRADE)
            return None
        old = self._old_form_signature(row)
        if old is None:
            self._withheld(row, peer, Withheld.NO_OLD_FORM)
            return None
        return self._old(row, old)

    @staticmethod
    def _old(row: MemoryRow, signature: bytes | None = None) -> dict[str, Any]:
        return {"kind": "memory.put", **memory_put_body(row, signature)}

    def _old_form_signature(self, row: MemoryRow) -> bytes | None:
        """A set-1 signature of ``row`` by this node's key, when this node wrote it; else None."""
        if self.identity is None or row.signed_by != self.identity.agent_id:
            return None
        return attest.sign(self.identity.private_key, MemoryPayload.of(replace(row, signed_set=SIGNED_SET_OLD)))

    def _withheld(self, row: MemoryRow, peer: str, why: Withheld) -> None:
        self.withheld(row.id, peer, why)

    def withheld(self, ref: str, peer: str, why: Withheld) -> None:
        """Count a change ``ref`` not sent to ``peer`` and log it, once per peer and reason."""
        self.counters[f"withheld:{why}"] += 1
        if (peer, why) not in self._told:
            self._told.add((peer, why))
            log.warning("memory_withheld", extra={"ev": {"peer": peer, "reason": str(why), "memory_id": ref,
                                                         "detail": _WHY[why], "once": "per peer and reason"}})


class AgentForms:
    """What agents sign goes only to peers that read the agent kinds, naming the delegation it is signed under
    (docs/protocol.md, "Agents"): an older peer could not verify it, and is never sent what it would refuse or
    take as unsigned. ``book`` finds the delegation; ``forms`` counts and logs what is withheld."""

    def __init__(self, book: AgentBook, forms: MemoryForms) -> None:
        self.book = book
        self.forms = forms

    def delegation_of(self, conn: Any, payload: dict[str, Any]) -> DelegationRow | None:
        """Inside a read or write: the delegation an item (a payload or body of a signed kind) is signed under, or
        None when its signer is no agent here."""
        if payload.get("signature") is None or not self.book.may_be_agent(payload.get("signed_by")):
            return None  # the common case: a node's item (or unsigned), answered without a read
        signed = signed_part(payload)
        if signed is None:
            return None
        signer, signable, signature = signed
        return self.book.hint(conn, signer, claimed_at(signable), signable, signature)

    def for_peers(self, peers: list[str], reads_agents: Any, ref: str) -> list[str]:
        """Those of ``peers`` that read agents' items (``reads_agents(peer)``); the others are counted withheld."""
        out = []
        for peer in peers:
            if reads_agents(peer):
                out.append(peer)
            else:
                self.forms.withheld(ref, peer, Withheld.AGENTS_UNREAD)
        return out


def signed_part(payload: dict[str, Any]) -> tuple[str | None, Signable, bytes | None] | None:
    """The signer, the signed record and the signature of a body of a signed kind (link.put's, memory.put.v2's,
    link.invalidate's, transcript.put's, with or without ``kind``), or None for another shape."""
    signer, signature = payload.get("signed_by"), payload.get("signature")
    try:
        if "link" in payload:
            return signer, LinkPayload.from_mapping(payload["link"]), signature
        if "memory" in payload and "share_with" in payload["memory"]:
            return signer, MemoryPayload.from_mapping(payload["memory"], SIGNED_SET_SHARED), signature
        if "invalidation" in payload:
            return signer, InvalidationPayload.from_mapping(payload["invalidation"]), signature
        if "transcript" in payload:
            return signer, TranscriptPayload.from_mapping(payload["transcript"]), signature
    except attest.AttestError:
        return None
    return None
