"""AskUser parks a write as a pending action: applied exactly once on approval, never on deny or expiry."""

from __future__ import annotations

import pytest

from node import assemble
from node.config import NodeConfig
from node.errors import ServiceError
from node.permissions.approvals import ApprovalPending
from tests.hooks.scripts import hook, write_hooks_toml, write_scripts
from tests.permissions.conftest import rows

ASK_TEAM = """
mode = "enforce"
[[rules]]
agent = "*"
namespace = "team"
operations = ["store", "update", "link"]
action = "ask"
"""


async def _parked(svc, content: str = "plans", namespace: str = "team/x") -> str:
    with pytest.raises(ApprovalPending) as e:
        await svc.memory_store(content, namespace=namespace)
    assert e.value.code == "approval_required" and e.value.action_id in e.value.message
    return e.value.action_id


async def test_approve_writes_exactly_once(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(ASK_TEAM)
    action = await _parked(svc)
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]
    assert [a["id"] for a in await svc.approval_list()] == [action]
    decided = await svc.approval_decide(action, "approve", decided_by="ops@lab")
    assert decided["status"] == "applied" and decided["result"]["namespace"] == "team/x"
    assert rows(cfg, "SELECT content FROM memories") == [("plans",)]
    with pytest.raises(ServiceError) as e:
        await svc.approval_decide(action, "approve", decided_by="ops@lab")
    assert e.value.code == "already_decided"
    with pytest.raises(ServiceError) as e:
        await svc.approval_decide(action, "deny", decided_by="ops@lab")
    assert e.value.code == "already_decided"
    assert rows(cfg, "SELECT count(*) FROM memories") == [(1,)]
    assert rows(cfg, "SELECT event_type FROM signed_events ORDER BY seq") == [("approval",), ("memory",)]
    assert (await svc.audit_verify())["ok"]


async def test_deny_never_writes(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(ASK_TEAM)
    action = await _parked(svc)
    assert (await svc.approval_decide(action, "deny", decided_by="ops@lab"))["status"] == "denied"
    with pytest.raises(ServiceError) as e:
        await svc.approval_decide(action, "approve", decided_by="ops@lab")
    assert e.value.code == "already_decided"
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]
    assert rows(cfg, "SELECT event_type FROM signed_events") == [("approval",)]


async def test_an_expired_action_is_never_applied(tmp_path, open_service, cfg: NodeConfig) -> None:
    svc = await open_service(ASK_TEAM)
    now = [10_000]
    svc.clock = svc.approvals.clock = lambda: now[0]
    action = await _parked(svc)
    now[0] += int(cfg.approval.default_timeout_seconds * 1000)
    with pytest.raises(ServiceError) as e:
        await svc.approval_decide(action, "approve", decided_by="ops@lab")
    assert e.value.code == "approval_expired"
    assert await svc.approvals.sweep() == 1
    assert (await svc.approvals.get(action))["status"] == "expired"
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]


async def test_a_pending_action_survives_a_restart(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(ASK_TEAM)
    action = await _parked(svc)
    await svc.close()
    again = await assemble.open_service(cfg, require_identity=True)
    try:
        assert (await again.approval_decide(action, "approve", decided_by="ops@lab"))["status"] == "applied"
    finally:
        await again.close()
    assert rows(cfg, "SELECT content FROM memories") == [("plans",)]


async def test_remember_forever_answers_the_same_ask_from_then_on(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(ASK_TEAM)
    action = await _parked(svc)
    decided = await svc.approval_decide(action, "approve", decided_by="ops@lab", remember="forever")
    assert decided["remembered"].startswith("approved store on team/x")
    await svc.memory_store("no question now", namespace="team/x")
    await _parked(svc, namespace="team/y")  # only the namespace approved
    assert rows(cfg, "SELECT count(*) FROM memories") == [(2,)]


async def test_an_approved_write_refused_by_a_later_deny_is_failed(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(ASK_TEAM)
    action = await _parked(svc)
    await svc.gate.add_rule({"agent": "*", "namespace": "team/x", "operations": ["store"], "action": "deny"},
                            "test", 1)
    with pytest.raises(ServiceError) as e:
        await svc.approval_decide(action, "approve", decided_by="ops@lab")
    assert e.value.code == "permission_denied"
    assert (await svc.approvals.get(action))["status"] == "failed"
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]


async def test_a_hooks_ask_takes_the_same_pending_path(tmp_path, open_service, cfg: NodeConfig) -> None:
    exe, _ = write_scripts(tmp_path / "hooks")
    cfg.home.mkdir(parents=True, exist_ok=True)
    write_hooks_toml(cfg.hooks_path, [hook("payroll", ["pre_store"], exe, "ask", "Store payroll?")])
    svc = await open_service()
    action = await _parked(svc, "payroll on the 25th", "hr")
    assert (await svc.approvals.get(action))["asked_by"] == "hook 'payroll'"
    assert (await svc.approval_decide(action, "approve", decided_by="ops@lab"))["status"] == "applied"
    assert rows(cfg, "SELECT content FROM memories") == [("payroll on the 25th",)]
