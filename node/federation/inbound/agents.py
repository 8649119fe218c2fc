"""agent.delegate and agent.revoke: a node vouching for one of its agents, and ending that (docs/protocol.md,
"Agents"). Each is a record signed by its issuer, a node: kept only when the issuer's key verifies it (current or
retired, as any node signature), so a delegation grants nothing a trusted node did not sign. The items the agent
signs are verified against the key a stored delegation names (node/federation/verify.py, ``decide_agent``)."""

from __future__ import annotations

import logging
from typing import Any

from node.agents.book import DELEGATE_REF, REVOKE_REF, claimed_by_other
from node.attest import AttestLevel, DelegationPayload, RevocationPayload
from node.errors import ServiceError
from node.federation.codes import RejectCode
from node.federation.inbound.common import OK_CHANGED, OK_UNCHANGED, Applied, ApplyContext, parsed
from node.limits import check_text
from storage import agents, changelog, events
from storage.agents import DelegationRow, RevocationRow

log = logging.getLogger("node.federation")


def issuer_verdict(level: AttestLevel | RejectCode) -> AttestLevel | RejectCode:
    """An issuer's signature checked as any node's (``Attester.attest``), as a delegation record reads it: a record
    its issuer's key does not verify is forged (``bad_delegation``; pulled history signed with a key not known here
    yet stays ``unknown_key``, parked); one by a node not trusted here, or unsigned, vouches for nothing
    (``unknown_issuer``)."""
    if level is RejectCode.BAD_SIGNATURE:
        return RejectCode.BAD_DELEGATION
    if level is AttestLevel.UNSIGNED or level is RejectCode.UNVERIFIED_RELAY:
        return RejectCode.UNKNOWN_ISSUER
    return level


class DelegationApply:
    """Applies agent.delegate bodies from peers."""

    def __init__(self, ctx: ApplyContext) -> None:
        self.ctx = ctx

    async def __call__(self, body: dict[str, Any], sender: str, pulled: bool = False) -> Applied:
        ctx = self.ctx
        payload = parsed(DelegationPayload.from_mapping, body["delegation"])
        d_id = payload.delegation_id
        code = self._out_of_bounds(payload, body["signed_by"])
        if code is not None:
            return self._refused(code, sender, payload)
        if await ctx.db.read(agents.get_delegation, d_id) is not None:
            return OK_UNCHANGED
        level = issuer_verdict(await ctx.attester.attest(payload, body["signature"], payload.issuer, sender,
                                                         what=d_id, pulled=pulled))
        if not isinstance(level, AttestLevel):
            return self._refused(level, sender, payload) if level is not RejectCode.UNKNOWN_KEY else Applied(level)
        now = ctx.clock()
        row = DelegationRow(delegation_id=d_id, **payload.to_dict(), signature=body["signature"],
                            attest_level=str(level), received_from=sender, created_at=now)

        def write(conn: Any) -> Applied:
            claimed = claimed_by_other(conn, payload.agent_id, payload.issuer, now)
            if claimed is not None:
                return Applied(RejectCode.AGENT_CLAIMED)
            if not agents.insert_delegation(conn, row):
                return OK_UNCHANGED
            events.append(conn, "agent_delegation", d_id, payload.issuer, d_id, row.signature, now)
            changelog.append(conn, "link", DELEGATE_REF + d_id, 1, now)
            changelog.incr(conn, f"applied:agent.delegate.{level}")
            return OK_CHANGED

        applied: Applied = await ctx.db.write(write)
        if applied.code is not None:
            return self._refused(applied.code, sender, payload)
        if applied.changed:
            ctx.counters["agent.delegate:stored"] += 1
            await ctx.attester.agents.stored()
        return applied

    def _out_of_bounds(self, payload: DelegationPayload, signed_by: str) -> str | None:
        """Ids within ``[limits]``; signed by its issuer; naming an agent, not a node; not dated ahead."""
        cfg = self.ctx.cfg
        try:
            for name in ("agent_id", "issuer"):
                check_text(name, getattr(payload, name), cfg.limits.max_id_chars, allow_empty=False)
        except ServiceError as e:
            return e.code
        if signed_by != payload.issuer:
            return RejectCode.SIGNER_MISMATCH
        if payload.agent_id == payload.issuer or self.ctx.attester.agents.is_node(payload.agent_id):
            return RejectCode.AGENT_IS_NODE
        if payload.valid_from > self.ctx.clock() + int(cfg.federation.max_clock_skew_s * 1000):
            return RejectCode.CLOCK_SKEW
        return None

    def _refused(self, code: str, sender: str, payload: DelegationPayload) -> Applied:
        log.warning("delegation_refused", extra={"ev": {"peer": sender, "code": str(code), "agent": payload.agent_id,
                                                        "issuer": payload.issuer}})
        return Applied(code)


class RevocationApply:
    """Applies agent.revoke bodies from peers."""

    def __init__(self, ctx: ApplyContext) -> None:
        self.ctx = ctx

    async def __call__(self, body: dict[str, Any], sender: str, pulled: bool = False) -> Applied:
        ctx = self.ctx
        payload = parsed(RevocationPayload.from_mapping, body["revocation"])
        r_id = payload.revocation_id
        if body["signed_by"] != payload.issuer:
            return Applied(RejectCode.SIGNER_MISMATCH)
        if await ctx.db.read(agents.get_revocation, r_id) is not None:
            return OK_UNCHANGED
        level = issuer_verdict(await ctx.attester.attest(payload, body["signature"], payload.issuer, sender,
                                                         what=r_id, pulled=pulled))
        if not isinstance(level, AttestLevel):
            return Applied(level)
        now = ctx.clock()
        row = RevocationRow(revocation_id=r_id, **payload.to_dict(), signature=body["signature"],
                            attest_level=str(level), received_from=sender, created_at=now)

        def write(conn: Any) -> Applied:
            d = agents.get_delegation(conn, payload.delegation_id)
            # Only the delegation's issuer ends it. One not here yet: kept, and counted once it shows that issuer.
            if d is not None and (d.issuer != payload.issuer or d.agent_id != payload.agent_id):
                return Applied(RejectCode.REVOCATION_MISMATCH)
            if not agents.insert_revocation(conn, row):
                return OK_UNCHANGED
            events.append(conn, "agent_revocation", payload.delegation_id, payload.issuer, r_id, row.signature, now)
            changelog.append(conn, "link", REVOKE_REF + r_id, 1, now)
            changelog.incr(conn, f"applied:agent.revoke.{level}")
            return OK_CHANGED

        applied: Applied = await ctx.db.write(write)
        if applied.changed:
            ctx.counters["agent.revoke:stored"] += 1
            log.info("delegation_revoked", extra={"ev": {"peer": sender, "agent": payload.agent_id,
                                                         "issuer": payload.issuer, "revoked_at": payload.revoked_at}})
            await ctx.attester.agents.stored()
        return applied
