"""Hooks on inbound federation: a refused memory or link is ACKed rejected with the hook's code, not stored."""

from __future__ import annotations

from node.config import NodeConfig
from tests.hooks.conftest import log_lines, rows
from tests.hooks.scripts import hook
from tests.node.test_federation_apply import M1, M2, PEER, _env, _link_put, _memory, _mput


async def test_pre_federated_memory_deny_rejects_with_the_hooks_code(open_service, scripts, hook_log,
                                                                    cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("inbound", ["pre_federated_memory"], exe, "deny", "untrusted_origin"),
                              hook("seen", ["post_federated_memory"], exe, "allow")])
    ack = await svc.replicator.apply(_env(PEER, _mput(_memory(M1))), PEER)
    assert not ack.accepted and ack.reason == "rejected:untrusted_origin"
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]
    assert [line.split()[:2] for line in log_lines(hook_log)] == [["inbound", "pre_federated_memory"]]


async def test_federated_link_hooks_see_the_sender_and_attest_level(open_service, scripts, hook_log,
                                                                    cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("links-in", ["pre_federated_link"], exe, "ask", "accept this link?"),
                              hook("mem-after", ["post_federated_memory"], exe, "allow")])
    for mid in (M1, M2):
        assert (await svc.replicator.apply(_env(PEER, _mput(_memory(mid))), PEER)).accepted
    ack = await svc.replicator.apply(_env(PEER, _link_put(None, M1, M2)), PEER)
    assert ack.reason == "rejected:approval_required"
    assert rows(cfg, "SELECT count(*) FROM memory_links") == [(0,)]
    events = [line.split(" ", 2) for line in log_lines(hook_log)]
    assert [e[:2] for e in events] == [["mem-after", "post_federated_memory"]] * 2 + [
        ["links-in", "pre_federated_link"]]
    assert '"sender": "ai:peer-a@lab"' in events[-1][2] and '"attest_level": "unsigned"' in events[-1][2]
