"""memory.put and memory.put.v2: bound, authorise, verify and store one received memory version (docs/security.md
has the rules; docs/protocol.md the sharing list's)."""

from __future__ import annotations

import logging
from typing import Any

from a2a.kinds import MEMORY_PUT_V2
from node import attest
from node.attest import SIGNED_SET_OLD, SIGNED_SET_SHARED, AttestLevel, MemoryPayload
from node.errors import ServiceError
from node.federation.codes import RejectCode
from node.federation.inbound.common import OK_CHANGED, OK_UNCHANGED, Applied, ApplyContext
from node.federation.verify import TurnBatch
from node.hooks import HookError, HookEvent
from node.limits import check_db_budget, check_memory_fields, check_text
from node.permissions.rules import Operation
from node.wire import memory_dict
from storage import changelog, events, memories
from storage.memories import MemoryRow, lww_key

log = logging.getLogger("node.federation")


class MemoryApply:
    """Applies memory.put and memory.put.v2 bodies from peers to this node's store."""

    def __init__(self, ctx: ApplyContext) -> None:
        self.ctx = ctx
        # The stored versions the memory versions of one loop turn (a pulled page's, a batch frame's) compare
        # with: one reader hop for them all.
        self.lookups: TurnBatch[str, MemoryRow | None] = TurnBatch(self._stored_versions)

    async def __call__(self, body: dict[str, Any], sender: str, pulled: bool = False) -> Applied:
        """Bound, authorise, verify and store one memory version from ``sender`` (the body's ``kind`` says which
        signed field set its signature covers; ``pulled``: it came in a sync page)."""
        ctx, m = self.ctx, body["memory"]
        signed_set = SIGNED_SET_SHARED if body.get("kind") == MEMORY_PUT_V2 else SIGNED_SET_OLD
        code = self._out_of_bounds(m) or self._not_allowed(body, sender) or list_code(body, signed_set)
        if code is not None:
            return self._refused(code, sender, m)
        payload = MemoryPayload.from_mapping(m, signed_set)
        level = await ctx.attester.attest(payload, body["signature"], m["writer"], sender, what=m["id"],
                                          pulled=pulled, delegation=body.get("delegation"))
        if not isinstance(level, AttestLevel):
            return Applied(level)
        stored = await self.lookups(m["id"])
        if stored is not None and not ctx.policy.visible_to(sender, stored):
            # Answered exactly as if absent: an ACK never tells a peer whether a memory it may not see exists.
            return await self._as_if_absent(m, sender)
        operation = Operation.STORE if stored is None else Operation.UPDATE
        row = memory_row(body, level, sender, signed_set)
        code = (against_stored(stored, m, ctx.cfg.federation.max_version_step) or list_after(stored, row)
                or await ctx.gate.code(sender, m["namespace"], operation,
                                       m["writer"] if body.get("delegation") is not None else None)
                or (await self._quota_code(m) if stored is None else None))
        if code is not None:
            return self._refused(code, sender, m)
        try:
            check_db_budget(ctx.cfg, ctx.db.bytes_used())
            await ctx.hooks.fire(HookEvent.PRE_FEDERATED_MEMORY, {"sender": sender, "memory": m})
        except (ServiceError, HookError) as e:  # a hook refusal is permanent and carries the hook's code
            return self._refused(e.code, sender, m)
        applied = await self._store(row, sender, payload)
        await ctx.hooks.fire(HookEvent.POST_FEDERATED_MEMORY, {"sender": sender, "memory": m,
                                                               "stored": applied.changed})
        return applied

    async def _stored_versions(self, ids: list[str]) -> list[MemoryRow | None]:
        found = await self.ctx.db.read(memories.get_many, ids)
        return [found.get(i) for i in ids]

    async def _quota_code(self, m: dict[str, Any]) -> str | None:
        return await self.ctx.gate.quota_code(m["writer"], len(m["content"].encode()) + len(m["title"].encode()))

    async def _as_if_absent(self, m: dict[str, Any], sender: str) -> Applied:
        """The answer an unknown id would get, without storing anything (the id is one ``sender`` may not see)."""
        ctx = self.ctx
        code = against_stored(None, m, ctx.cfg.federation.max_version_step)
        if code is None:
            try:
                check_db_budget(ctx.cfg, ctx.db.bytes_used())
                await ctx.hooks.fire(HookEvent.PRE_FEDERATED_MEMORY, {"sender": sender, "memory": m})
            except (ServiceError, HookError) as e:
                code = e.code
        if code is not None:
            return self._refused(code, sender, m)
        log.warning("hidden_id_conflict", extra={"ev": {"peer": sender, "memory_id": m["id"]}})
        ctx.counters["memory:hidden_conflict"] += 1
        return OK_UNCHANGED

    def _out_of_bounds(self, m: dict[str, Any]) -> str | None:
        """The same limits as a local write, and times within ``max_clock_skew_s`` of this node's clock."""
        cfg = self.ctx.cfg
        try:
            check_memory_fields(cfg.limits, m["content"], m["title"], m["namespace"], m["tags"],
                                m["priority"], m["confidence"], m["source"])
            for name in ("origin", "writer"):
                check_text(name, m[name], cfg.limits.max_id_chars, allow_empty=False)
        except ServiceError as e:
            return e.code
        skew_ms = int(cfg.federation.max_clock_skew_s * 1000)
        if m["created_at"] > m["updated_at"] or m["updated_at"] > self.ctx.clock() + skew_ms:
            return RejectCode.CLOCK_SKEW
        return None

    def _not_allowed(self, body: dict[str, Any], sender: str) -> str | None:
        m, policy = body["memory"], self.ctx.policy
        if not policy.shares(sender, m["namespace"]):
            return RejectCode.NAMESPACE_NOT_ALLOWED
        if body["signed_by"] is not None and body["signed_by"] != m["writer"]:
            return RejectCode.SIGNER_MISMATCH
        if not policy.may_write(m["writer"], m["origin"], m["namespace"]):
            return RejectCode.WRITER_NOT_ALLOWED
        return None

    @staticmethod
    def _refused(code: str, sender: str, m: dict[str, Any]) -> Applied:
        log.warning("memory_refused", extra={"ev": {"peer": sender, "code": code, "memory_id": m.get("id"),
                                                    "writer": m.get("writer"), "origin": m.get("origin")}})
        return Applied(code)

    async def _store(self, row: MemoryRow, sender: str, payload: MemoryPayload) -> Applied:
        """``row`` written (``payload``: its signed fields, as its signature was checked over them)."""
        ctx = self.ctx
        step = ctx.cfg.federation.max_version_step
        kept: list[MemoryRow] = []

        def write(conn: Any) -> Applied:
            # Checked again inside the transaction: another version may have landed since the read.
            stored = memories.get(conn, row.id)
            if stored is not None and not ctx.policy.visible_to(sender, stored):
                return OK_UNCHANGED
            code = against_stored(stored, wire_fields(row), step) or list_after(stored, row)
            if code is not None:
                return Applied(code)
            result = memories.apply_remote(conn, row)
            if result not in ("inserted", "updated"):
                return OK_UNCHANGED
            kept.append(row)
            now = ctx.clock()
            events.append(conn, "memory", None, row.author, payload.version_hash, row.signature, now)
            changelog.append(conn, "memory", row.id, row.version, now, row.author)
            changelog.incr(conn, f"applied:memory.{result}")
            return OK_CHANGED

        applied: Applied = await ctx.db.write(write)
        ctx.counters["memory:stored" if applied.changed else "memory:unchanged"] += 1
        if applied.changed:
            await ctx.arrivals.memory_stored()
            await ctx.events.publish("memory.stored", memory_dict(kept[-1]))
        return applied


def against_stored(stored: MemoryRow | None, m: dict[str, Any], step: int) -> str | None:
    """Why version ``m`` may not follow ``stored`` (a remote write never changes origin or namespace)."""
    if stored is None:
        return RejectCode.VERSION_OUT_OF_RANGE if m["version"] > step else None
    if stored.origin != m["origin"]:
        return RejectCode.ORIGIN_MISMATCH
    if stored.namespace != m["namespace"]:
        return RejectCode.NAMESPACE_MISMATCH
    if m["version"] > stored.version + step:
        return RejectCode.VERSION_OUT_OF_RANGE
    return None


def wire_fields(row: MemoryRow) -> dict[str, Any]:
    """A stored version's signed fields, as a memory.put carries them."""
    return {f: getattr(row, f) for f in attest.MEMORY_SIGNED_FIELDS}


def list_code(body: dict[str, Any], signed_set: int) -> str | None:
    """What the sharing list of a received version says on its own: a memory.put (signed set 1) may not carry
    one (outside the signature, any relay could have dropped or changed it), and a signed list names the
    memory's origin (the origin is always a member of its own list)."""
    if signed_set == SIGNED_SET_OLD:
        return RejectCode.SHARE_WITH_UNSIGNED if body.get("share_with") is not None else None
    m = body["memory"]
    if m["share_with"] is not None and m["origin"] not in m["share_with"]:
        return RejectCode.SHARE_WITH_WITHOUT_ORIGIN
    return None


def list_after(stored: MemoryRow | None, row: MemoryRow) -> str | None:
    """The rule for a version that would replace ``stored``: the list is the origin's. A version written by the
    origin may carry any list (narrow it, widen it, lift it): its signature states it. A version by any other
    writer carries the stored list unchanged (``share_with_changed``). A signed set 1 version has no signed list
    at all, so it may not follow a restricted one (``share_with_unsigned``). An older or equal version changes
    nothing and is not judged."""
    if stored is None or lww_key(row) <= lww_key(stored):
        return None
    if row.signed_set == SIGNED_SET_OLD:
        return RejectCode.SHARE_WITH_UNSIGNED if stored.share_with is not None else None
    if row.writer != row.origin and _as_set(row.share_with) != _as_set(stored.share_with):
        return RejectCode.SHARE_WITH_CHANGED
    return None


def _as_set(share_with: tuple[str, ...] | None) -> frozenset[str] | None:
    return None if share_with is None else frozenset(share_with)


def memory_row(body: dict[str, Any], level: AttestLevel, sender: str,
               signed_set: int = SIGNED_SET_OLD) -> MemoryRow:
    """The row a received memory.put (``signed_set`` 1) or memory.put.v2 (2) is stored as, at ``level``."""
    m = body["memory"]
    attested = level is not AttestLevel.UNSIGNED  # verified here (a peer's key, or ours on a restore)
    share = m["share_with"] if signed_set == SIGNED_SET_SHARED else body.get("share_with")
    return MemoryRow(id=m["id"], namespace=m["namespace"], title=m["title"], content=m["content"],
                     tags=tuple(m["tags"]), priority=m["priority"], confidence=float(m["confidence"]),
                     source=m["source"], origin=m["origin"], writer=m["writer"], version=m["version"],
                     created_at=m["created_at"], updated_at=m["updated_at"],
                     signature=body["signature"] if attested else None,
                     signed_by=body["signed_by"] if attested else None, attest_level=str(level),
                     share_with=None if share is None else tuple(share), received_from=sender,
                     signed_set=signed_set)
