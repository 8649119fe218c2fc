"""transcript.put: verify and store one received transcript (node/transcripts.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from node.attest import AttestLevel, TranscriptPayload
from node.federation.codes import RejectCode
from node.federation.inbound.common import OK_CHANGED, OK_UNCHANGED, Applied, ApplyContext, parsed
from node.permissions.rules import Operation
from node.transcripts import inbound_row, spans_of, zstd_bound
from storage import changelog, events, transcripts


class TranscriptApply:
    """Applies transcript.put bodies from peers: only in a namespace this node keeps and replicates transcripts
    for and the sender may see, within its size limits, signed by its agent, and once every memory it cites is
    here and visible to the sender (else ``unknown_memory``, retryable)."""

    def __init__(self, ctx: ApplyContext) -> None:
        self.ctx = ctx

    async def __call__(self, body: dict[str, Any], sender: str, pulled: bool = False) -> Applied:
        ctx = self.ctx
        payload = parsed(TranscriptPayload.from_mapping, body["transcript"])
        policy = ctx.cfg.transcripts.policy(payload.namespace)
        code = self._not_allowed(payload, body["signed_by"], sender)
        if code is not None:
            return Applied(code)
        if payload.raw_bytes > policy.max_bytes or len(body["body"]) > zstd_bound(policy.max_bytes) \
                or len(payload.spans) > policy.max_spans:
            # Bounded before its signature is weighed: an item parked for a key is within the limits too.
            return Applied("too_large")
        if await ctx.db.read(transcripts.get, payload.id) is not None:
            return OK_UNCHANGED
        level = await ctx.attester.attest(payload, body["signature"], payload.agent, sender, what=payload.id,
                                          pulled=pulled, delegation=body.get("delegation"))
        if not isinstance(level, AttestLevel):
            return Applied(level)
        row = await asyncio.to_thread(inbound_row, payload, body["body"], policy, signature=body["signature"],
                                      level=level, sender=sender)
        if isinstance(row, str):
            return Applied(row)
        spans = spans_of(payload)
        if not await ctx.arrivals.visible(sender, {s.memory_id for s in spans}):
            return Applied(RejectCode.UNKNOWN_MEMORY)
        code = await ctx.gate.code(sender, payload.namespace, Operation.STORE,
                                   payload.agent if body.get("delegation") is not None else None)
        if code is not None:
            return Applied(code)
        now = ctx.clock()

        def write(conn: Any) -> Applied:
            if transcripts.get(conn, payload.id) is not None:
                return OK_UNCHANGED
            transcripts.insert(conn, row, spans)
            events.append(conn, "transcript", payload.id, payload.agent, payload.record_hash, row.signature, now)
            changelog.append(conn, "link", payload.id, 1, now)  # served on by sync, as links are
            changelog.incr(conn, f"applied:transcript.{level}")
            return OK_CHANGED

        applied: Applied = await ctx.db.write(write)
        return applied

    def _not_allowed(self, payload: TranscriptPayload, signed_by: str | None, sender: str) -> str | None:
        policy = self.ctx.cfg.transcripts.policy(payload.namespace)
        if not (policy.enabled and policy.replicate):
            return RejectCode.TRANSCRIPTS_DISABLED
        if not self.ctx.policy.shares(sender, payload.namespace):
            return RejectCode.NAMESPACE_NOT_ALLOWED
        if signed_by is not None and signed_by != payload.agent:
            return RejectCode.SIGNER_MISMATCH
        return None
