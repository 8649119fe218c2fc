"""link.invalidate: verify and store one received link invalidation, as links are, only where the sender may
see the link's both ends (otherwise, as for a link not here: ``unknown_link``, retryable)."""

from __future__ import annotations

import logging
from typing import Any

from node.attest import AttestLevel, InvalidationPayload
from node.federation.codes import RejectCode
from node.federation.inbound.common import OK_CHANGED, OK_UNCHANGED, Applied, ApplyContext, parsed
from storage import changelog, events, graph, links, memories
from storage.graph import InvalidationRow

log = logging.getLogger("node.federation")


class InvalidationApply:
    """Applies link.invalidate bodies from peers."""

    def __init__(self, ctx: ApplyContext) -> None:
        self.ctx = ctx

    async def __call__(self, body: dict[str, Any], sender: str, pulled: bool = False) -> Applied:
        ctx = self.ctx
        payload = parsed(InvalidationPayload.from_mapping, body["invalidation"])
        inval_id = payload.inval_id
        if await ctx.db.read(graph.get_invalidation, inval_id) is not None:
            return OK_UNCHANGED
        signed_by = body["signed_by"]
        if signed_by is not None and signed_by != payload.observed_by:
            log.warning("signer_mismatch", extra={"ev": {"peer": sender, "inval_id": inval_id,
                                                         "signed_by": signed_by, "observed_by": payload.observed_by}})
            return Applied(RejectCode.SIGNER_MISMATCH)
        level = await ctx.attester.attest(payload, body["signature"], payload.observed_by, sender, what=inval_id,
                                          pulled=pulled, delegation=body.get("delegation"))
        if not isinstance(level, AttestLevel):
            return Applied(level)
        code = await self._gate_code(payload.link_id, sender,
                                     payload.observed_by if body.get("delegation") is not None else None)
        if code is not None:
            return Applied(code)
        now = ctx.clock()
        attested = level is not AttestLevel.UNSIGNED  # verified here (a peer's key, or ours on a restore)
        row = InvalidationRow(inval_id=inval_id, link_id=payload.link_id, observed_by=payload.observed_by,
                              valid_until=payload.valid_until, signature=body["signature"] if attested else None,
                              attest_level=str(level), signed_by=signed_by if attested else None,
                              received_from=sender, created_at=now)

        def write(conn: Any) -> Applied:
            link = links.get(conn, payload.link_id)
            if link is None or not ctx.policy.link_visible(conn, sender, link):
                return Applied(RejectCode.UNKNOWN_LINK)
            if graph.get_invalidation(conn, inval_id) is not None:
                return OK_UNCHANGED
            graph.insert_invalidation(conn, row)
            events.append(conn, "link_invalidation", payload.link_id, payload.observed_by, inval_id,
                          row.signature, now)
            changelog.append(conn, "link", inval_id, 1, now, row.observed_by)
            changelog.incr(conn, f"applied:link.invalidate.{level}")
            return OK_CHANGED

        applied: Applied = await ctx.db.write(write)
        return applied

    async def _gate_code(self, link_id: str, sender: str, agent: str | None) -> str | None:
        """The gate's ``link`` in both of the link's ends' namespaces, as for a link.put (a local invalidation
        asks the same); a link ``sender`` may not see is left to the write's ``unknown_link``."""
        ctx = self.ctx
        if not ctx.gate.active:
            return None

        def ends(conn: Any) -> set[str]:
            link = links.get(conn, link_id)
            if link is None or not ctx.policy.link_visible(conn, sender, link):
                return set()
            return {m.namespace for m in memories.get_many(conn, {link.src_id, link.dst_id}).values()}

        return await ctx.gate.link_code(sender, await ctx.db.read(ends), agent)
