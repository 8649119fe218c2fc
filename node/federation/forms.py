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
from node.attest import SIGNED_SET_OLD, MemoryPayload
from node.wire import memory_put_body, memory_put_v2_body
from storage.memories import MemoryRow

log = logging.getLogger("node.federation")


class Withheld(StrEnum):
    """Why a memory version is not sent to a peer."""

    PEER_MUST_UPGRADE = "peer_must_upgrade"  # restricted, and the peer reads no memory.put.v2
    UNSIGNED_LIST = "unsigned_list"          # restricted, signed before the list was (set 1): refused everywhere now
    NO_OLD_FORM = "no_old_form"              # unrestricted, another writer's set-2 signature: no set 1 to give


_WHY = {
    Withheld.PEER_MUST_UPGRADE: "the peer reads no memory.put.v2: restricted memories wait until it upgrades",
    Withheld.UNSIGNED_LIST: "a restricted version signed before its sharing list was: it waits for the origin's "
                            "next version",
    Withheld.NO_OLD_FORM: "the peer reads no memory.put.v2 and only the version's writer can sign the old form: "
                          "it gets the version from its writer",
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
        self.counters[f"withheld:{why}"] += 1
        if (peer, why) not in self._told:
            self._told.add((peer, why))
            log.warning("memory_withheld", extra={"ev": {"peer": peer, "reason": str(why), "memory_id": row.id,
                                                         "detail": _WHY[why], "once": "per peer and reason"}})
