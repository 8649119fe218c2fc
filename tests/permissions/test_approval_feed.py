"""The approval feed: what another opener of the store (a CLI command, an embedded ai-memory mcp) parks and
decides, read back by the node from the shared store, each action's request once and its decision once."""

from __future__ import annotations

import uuid

from node.config import NodeConfig
from node.hooks.decision import AskUser
from node.permissions.feed import RESULT_WAIT_MS, ApprovalFeed
from storage import approvals as rows
from storage.approvals import ActionRow
from tests.permissions.test_approvals import ASK_TEAM, _parked


def kinds(events: list) -> list[tuple[str, str, str]]:
    return [(e, d["id"], d["status"]) for e, d in events]


async def opened(open_service, cfg: NodeConfig):
    """The node's service (its feed) and another process's, on one store."""
    node = await open_service(ASK_TEAM)
    other = await open_service()
    feed = ApprovalFeed(node.approvals.db, node.approvals.clock, cfg.approval.sweep_interval_s)
    await feed.rebase()
    return node, other, feed


async def test_another_openers_parks_and_decisions_are_read_once_each(open_service, cfg: NodeConfig) -> None:
    _, other, feed = await opened(open_service, cfg)
    ids = [await _parked(other, f"plan {n}") for n in range(3)]
    assert kinds(await feed.poll()) == [("approval.requested", a, "pending") for a in ids]
    assert await feed.poll() == []
    await other.approval_decide(ids[1], "approve", decided_by="ops")
    await other.approval_decide(ids[0], "deny", decided_by="ops")
    events = await feed.poll()
    assert kinds(events) == [("approval.decided", ids[1], "applied"), ("approval.decided", ids[0], "denied")]
    assert events[0][1]["result"]["content"] == "plan 1" and events[0][1]["decided_by"] == "ops"
    assert await feed.poll() == []


async def test_an_action_parked_and_decided_between_two_polls_is_both_events_in_order(open_service,
                                                                                     cfg: NodeConfig) -> None:
    _, other, feed = await opened(open_service, cfg)
    action = await _parked(other)
    await other.approval_decide(action, "deny", decided_by="ops")
    events = await feed.poll()
    assert kinds(events) == [("approval.requested", action, "pending"), ("approval.decided", action, "denied")]
    assert events[0][1]["decided_by"] is None
    assert await feed.poll() == []


async def test_what_is_there_at_the_rebase_is_old_news_but_its_decision_is_not(open_service, cfg: NodeConfig) -> None:
    node = await open_service(ASK_TEAM)
    other = await open_service()
    before = await _parked(other, "before")
    settled = await _parked(other, "settled before")
    await other.approval_decide(settled, "deny", decided_by="ops")
    feed = ApprovalFeed(node.approvals.db, node.approvals.clock, cfg.approval.sweep_interval_s)
    await feed.rebase()
    assert await feed.poll() == []
    await other.approval_decide(before, "approve", decided_by="ops")
    assert kinds(await feed.poll()) == [("approval.decided", before, "applied")]


async def test_an_expiry_by_another_processs_sweep_is_one_decided_event(open_service, cfg: NodeConfig) -> None:
    _, other, feed = await opened(open_service, cfg)
    action = await _parked(other)
    assert kinds(await feed.poll()) == [("approval.requested", action, "pending")]
    now = other.approvals.clock()
    other.approvals.clock = lambda: now + int(cfg.approval.default_timeout_seconds * 1000) + 1
    assert await other.approvals.sweep() == 1
    events = await feed.poll()
    assert kinds(events) == [("approval.decided", action, "expired")] and events[0][1]["decided_by"] == "sweeper"
    assert await feed.poll() == []


async def test_an_approval_waits_for_its_result_before_it_is_announced(open_service, cfg: NodeConfig) -> None:
    """An approved action is claimed in its write's transaction and given its result in the next one."""
    node, _, feed = await opened(open_service, cfg)
    now = node.approvals.clock()
    ask = AskUser("ok?", ("approve", "deny"), "deny")
    row = ActionRow(id=str(uuid.uuid4()), agent="a", operation="store", namespace="team/x",
                    call={"method": "memory_store", "args": {}}, prompt=ask.prompt, options=ask.options,
                    default_choice=ask.default, asked_by="rule", status="pending", created_at=now,
                    expires_at=now + 300_000, decided_at=None, decided_by=None, result=None)
    await node.db.write(rows.insert, row)
    await node.db.write(rows.settle, row.id, "applied", now, "ops")
    assert kinds(await feed.poll()) == [("approval.requested", row.id, "pending")]
    await node.db.write(rows.set_result, row.id, {"id": "m1"})
    events = await feed.poll()
    assert kinds(events) == [("approval.decided", row.id, "applied")] and events[0][1]["result"] == {"id": "m1"}
    # A result that never comes (the approving process died): announced without it after RESULT_WAIT_MS.
    late = ActionRow(**{**{f: getattr(row, f) for f in row.__slots__}, "id": str(uuid.uuid4())})
    await node.db.write(rows.insert, late)
    await node.db.write(rows.settle, late.id, "applied", now, "ops")
    assert kinds(await feed.poll()) == [("approval.requested", late.id, "pending")]
    feed.clock = lambda: now + RESULT_WAIT_MS
    assert kinds(await feed.poll()) == [("approval.decided", late.id, "applied")]
