"""Pending actions: an ``ask`` (a permission rule's or a hook's) parks the operation until a person decides.

``park`` stores the call durably and the caller gets ``approval_required`` with the action id. ``decide``
approves or denies it: an approval re-runs the call with ``APPROVED`` set, and the service's write claims
the row (``pending`` -> ``applied``) inside the write's own transaction, so the write lands exactly once
or not at all, also when the node restarted in between. A denial, an expiry (the sweeper, or a decision
arriving too late) and an approval whose write is refused never write anything. Every decision appends
a signed event to ``signed_events``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from node.config import NodeConfig
from node.errors import ServiceError, describe
from node.events import EventSink, NoEvents
from node.hooks import HookEvent, Hooks
from node.hooks.decision import AskUser
from storage import approvals as rows
from storage import events
from storage.approvals import ActionRow
from storage.db import Database

log = logging.getLogger("node.approvals")

APPROVE, DENY = "approve", "deny"
LIST_MAX = 1000


@dataclass(frozen=True, slots=True)
class Approved:
    """Set while an approved action re-runs: its write claims the row in the same transaction."""

    action_id: str
    decided_by: str


APPROVED: ContextVar[Approved | None] = ContextVar("approved_action", default=None)


class ApprovalPending(ServiceError):
    """The operation was parked; ``action_id`` names the pending action to approve or deny."""

    def __init__(self, action_id: str, message: str) -> None:
        super().__init__("approval_required", message)
        self.action_id = action_id


# Called after a decision (approval requested / decided), e.g. by the approval API's event stream.
Listener = Callable[[str, dict[str, Any]], None]
Signer = Callable[[bytes], bytes | None]


def signer(identity: Any) -> Signer:
    """Signs a decision's digest with the node key (``mesh.keys.Identity``); None without a key."""
    return lambda digest: identity.private_key.sign(digest) if identity is not None else None


def action_dict(a: ActionRow) -> dict[str, Any]:
    return {"id": a.id, "agent": a.agent, "operation": a.operation, "namespace": a.namespace, "call": a.call,
            "prompt": a.prompt, "options": list(a.options), "default": a.default_choice, "asked_by": a.asked_by,
            "status": a.status, "created_at": a.created_at, "expires_at": a.expires_at,
            "decided_at": a.decided_at, "decided_by": a.decided_by, "result": a.result}


def claim(conn: Any, approved: Approved, now_ms: int, agent_id: str, sign: Signer) -> None:
    """Inside an approved action's write transaction: pending -> applied, or refuse the write."""
    if not rows.settle(conn, approved.action_id, "applied", now_ms, approved.decided_by):
        current = rows.get(conn, approved.action_id)
        raise _not_pending(approved.action_id, current, now_ms)
    _audit(conn, approved.action_id, "approve", approved.decided_by, now_ms, agent_id, sign)


def _audit(conn: Any, action_id: str, choice: str, decided_by: str, now_ms: int, agent_id: str,
           sign: Signer) -> None:
    body = json.dumps({"type": "approval", "action_id": action_id, "choice": choice, "decided_by": decided_by,
                       "decided_at": now_ms}, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(body).hexdigest()
    events.append(conn, "approval", None, agent_id, digest, sign(bytes.fromhex(digest)), now_ms)


def _not_pending(action_id: str, current: ActionRow | None, now_ms: int) -> ServiceError:
    if current is None:
        return ServiceError("not_found", f"no pending action with id {action_id!r}")
    if current.status == "pending" and current.expires_at <= now_ms:
        return ServiceError("approval_expired", f"pending action {action_id} expired at {current.expires_at} "
                                                "(unix ms); it was not applied")
    if current.status == "expired":
        return ServiceError("approval_expired", f"pending action {action_id} expired; it was not applied")
    return ServiceError("already_decided", f"pending action {action_id} was already decided: {current.status} "
                                           f"by {current.decided_by}")


class Approvals:
    """Parks, lists, decides and expires pending actions for one node process."""

    def __init__(self, cfg: NodeConfig, db: Database, hooks: Hooks, clock: Callable[[], int], agent_id: str,
                 sign: Signer, *, events: EventSink | None = None) -> None:
        self.cfg = cfg
        self.db = db
        self.hooks = hooks
        self.clock = clock
        self.agent_id = agent_id
        self.sign = sign
        self._listeners: list[Listener] = []
        # The durable consumer (webhook subscriptions): awaited, so the event is queued before the reply.
        self.events: EventSink = events if events is not None else NoEvents()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Tell ``listener`` of every approval event this process emits from now on (the approval API's event
        stream); returns the call that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def _emit(self, event: str, data: dict[str, Any]) -> None:
        for listener in self._listeners:
            try:
                listener(event, data)
            except Exception:  # a listener's failure never undoes a decision already committed
                log.exception("approval listener failed")
        try:
            await self.events.publish(event, data)
        except Exception:  # the decision is committed; a lost notification is logged, not raised
            log.exception("approval sink failed")

    async def park(self, agent: str, operation: str, namespace: str, call: dict[str, Any], ask: AskUser,
                   asked_by: str) -> ApprovalPending:
        """Store the call as a pending action; returns the error the caller answers with."""
        now = self.clock()
        row = ActionRow(id=str(uuid.uuid4()), agent=agent, operation=operation, namespace=namespace, call=call,
                        prompt=ask.prompt, options=ask.options, default_choice=ask.default, asked_by=asked_by,
                        status="pending", created_at=now,
                        expires_at=now + int(self.cfg.approval.default_timeout_seconds * 1000),
                        decided_at=None, decided_by=None, result=None)
        await self.db.write(rows.insert, row)
        data = action_dict(row)
        self.hooks.notify(HookEvent.ON_APPROVAL_REQUESTED, {
            "approval_id": row.id, "event": operation, "prompt": row.prompt, "options": list(row.options),
            "default": row.default_choice, "payload": call})
        await self._emit("approval.requested", data)
        log.info("approval_requested", extra={"ev": {"id": row.id, "agent": agent, "operation": operation,
                                                     "namespace": namespace, "asked_by": asked_by}})
        return ApprovalPending(row.id, f"{asked_by} asks for approval: {ask.prompt}; pending action {row.id} "
                                       f"(approve or deny it before it expires at {row.expires_at} unix ms)")

    async def list(self, status: str | None = "pending", limit: int = 100) -> list[dict[str, Any]]:
        if status not in (None, "pending", "applied", "denied", "expired", "failed"):
            raise ServiceError("bad_input", f"status must be pending | applied | denied | expired | failed, "
                                            f"got {status!r}")
        if not 1 <= limit <= LIST_MAX:
            raise ServiceError("bad_input", f"limit must be 1..{LIST_MAX}, got {limit}")
        await self.sweep()
        return [action_dict(a) for a in await self.db.read(rows.list_, status, limit)]

    async def get(self, action_id: str) -> dict[str, Any]:
        row = await self.db.read(rows.get, action_id)
        if row is None:
            raise ServiceError("not_found", f"no pending action with id {action_id!r}")
        return action_dict(row)

    async def decide(self, action_id: str, choice: str, decided_by: str,
                     run: Callable[[dict[str, Any], str], Awaitable[Any]]) -> dict[str, Any]:
        """Approve (re-run the call through ``run`` as the agent that made it, which claims the row in its write)
        or deny."""
        if choice not in (APPROVE, DENY):
            raise ServiceError("bad_input", f"choice must be approve or deny, got {choice!r}")
        if not isinstance(decided_by, str) or not decided_by.strip() or len(decided_by) > 256:
            raise ServiceError("bad_input", "decided_by must be a non-empty string of at most 256 chars")
        current = await self.db.read(rows.get, action_id)
        now = self.clock()
        if current is None or current.status != "pending" or current.expires_at <= now:
            raise _not_pending(action_id, current, now)
        if choice == DENY:
            def deny(conn: Any) -> None:
                if not rows.settle(conn, action_id, "denied", now, decided_by):
                    raise _not_pending(action_id, rows.get(conn, action_id), now)
                _audit(conn, action_id, DENY, decided_by, now, self.agent_id, self.sign)

            await self.db.write(deny)
        else:
            token = APPROVED.set(Approved(action_id, decided_by))
            try:
                result = await run(current.call, current.agent)
            except ServiceError as e:
                if e.code in ("already_decided", "approval_expired", "not_found"):
                    raise
                d = describe(e)
                # The write was refused (its transaction, with the claim, rolled back): record why.
                await self.db.write(rows.mark_failed, action_id, self.clock(), decided_by,
                                    {"error": {"code": d.code, "message": d.message}})
                raise
            finally:
                APPROVED.reset(token)
            await self.db.write(rows.set_result, action_id, result)
        decided = await self.get(action_id)
        self.hooks.notify(HookEvent.ON_APPROVAL_DECIDED, {"approval_id": action_id, "event": current.operation,
                                                          "choice": choice, "decided_by": decided_by})
        await self._emit("approval.decided", decided)
        log.info("approval_decided", extra={"ev": {"id": action_id, "choice": choice, "decided_by": decided_by,
                                                   "status": decided["status"]}})
        return decided

    async def sweep(self) -> int:
        """Expire pending actions whose time is up; returns how many."""
        expired = await self.db.write(rows.expire_due, self.clock())
        for a in expired:
            self.hooks.notify(HookEvent.ON_APPROVAL_DECIDED, {"approval_id": a.id, "event": a.operation,
                                                              "choice": "expired", "decided_by": "sweeper"})
            await self._emit("approval.decided", {**action_dict(a), "status": "expired", "decided_by": "sweeper"})
            log.info("approval_expired", extra={"ev": {"id": a.id, "operation": a.operation}})
        return len(expired)
