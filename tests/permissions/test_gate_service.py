"""The gate on local operations (service) and on peer writes (federation): one decision, one refusal."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from node import assemble
from node.config import ConfigError, NodeConfig
from node.errors import ServiceError
from node.mcp.capabilities import capabilities
from tests.node.conftest import AGENT
from tests.node.test_federation_apply import M1, M2, PEER, _env, _memory, _mput
from tests.permissions.conftest import rows, write_rules

DENY_TEAM = """
mode = "enforce"
[[rules]]
agent = "*"
namespace = "team"
operations = ["store", "update", "link"]
action = "deny"
"""


async def test_enforce_a_parent_deny_blocks_a_child_write(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(DENY_TEAM)
    with pytest.raises(ServiceError) as e:
        await svc.memory_store("plans", namespace="team/project/sub")
    assert e.value.code == "permission_denied" and "'team/project/sub'" in e.value.message
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]
    assert (await svc.memory_store("elsewhere", namespace="teamwork"))["namespace"] == "teamwork"


async def test_inherit_false_on_the_child_lets_it_write(open_service) -> None:
    svc = await open_service(DENY_TEAM + """
[[rules]]
agent = "*"
namespace = "team/open"
operations = ["store"]
action = "allow"
inherit = false
""")
    assert (await svc.memory_store("ok", namespace="team/open/notes"))["namespace"] == "team/open/notes"
    with pytest.raises(ServiceError, match="may not store"):
        await svc.memory_store("no", namespace="team/closed")


async def test_advisory_logs_but_allows(open_service, caplog: pytest.LogCaptureFixture) -> None:
    svc = await open_service(DENY_TEAM.replace('mode = "enforce"', 'mode = "advisory"'))
    with caplog.at_level(logging.WARNING, logger="node.permissions"):
        m = await svc.memory_store("plans", namespace="team/project")
    assert m["namespace"] == "team/project"
    # Only warnings: an INFO "permissions_loaded" shows when another test left the node loggers at INFO.
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warned] == ["permission_advisory"]
    assert warned[0].ev["decision"] == "denied"  # type: ignore[attr-defined]
    assert (await capabilities(svc, None))["permissions"]["counts"] == {"advisory_denied": 1}


async def test_rules_without_a_mode_are_advisory(open_service) -> None:
    svc = await open_service(DENY_TEAM.replace('mode = "enforce"', ""))
    assert (await svc.memory_store("plans", namespace="team"))["namespace"] == "team"
    assert (await capabilities(svc, None))["permissions"]["mode"] == "advisory"


async def test_the_mode_is_read_live(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(DENY_TEAM.replace('mode = "enforce"', 'mode = "off"'))
    await svc.memory_store("first", namespace="team")
    write_rules(cfg, DENY_TEAM + "\n# now enforced\n")
    with pytest.raises(ServiceError, match="permission_denied|may not store"):
        await svc.memory_store("second", namespace="team")


async def test_update_and_link_are_gated_by_the_memories_namespaces(open_service, cfg: NodeConfig) -> None:
    svc = await open_service()
    a = await svc.memory_store("a", namespace="team/x")
    b = await svc.memory_store("b", namespace="free")
    write_rules(cfg, DENY_TEAM)
    with pytest.raises(ServiceError) as e:
        await svc.memory_update(a["id"], title="changed")
    assert e.value.code == "permission_denied"
    with pytest.raises(ServiceError) as e:
        await svc.memory_link(b["id"], a["id"], "related_to")
    assert e.value.code == "permission_denied"
    assert rows(cfg, "SELECT count(*) FROM memory_links") == [(0,)]
    assert rows(cfg, "SELECT max(version) FROM memories") == [(1,)]


async def test_recall_leaves_out_namespaces_the_agent_may_not_recall(open_service, cfg: NodeConfig) -> None:
    svc = await open_service()
    await svc.memory_store("shared apples", namespace="team/hidden")
    await svc.memory_store("public apples", namespace="public")
    write_rules(cfg, f"""
mode = "enforce"
[[rules]]
agent = "{AGENT}"
namespace = "team"
operations = ["recall", "list", "get"]
action = "deny"
""")
    hits = await svc.memory_recall("apples")
    assert [h["namespace"] for h in hits] == ["public"]
    assert [m["namespace"] for m in await svc.memory_list()] == ["public"]
    with pytest.raises(ServiceError, match="may not recall"):
        await svc.memory_recall("apples", namespace="team/hidden")


async def test_ask_refuses_with_approval_required(open_service) -> None:
    svc = await open_service(DENY_TEAM.replace('action = "deny"', 'action = "ask"'))
    with pytest.raises(ServiceError) as e:
        await svc.memory_store("plans", namespace="team")
    assert e.value.code == "approval_required"


async def test_a_peer_write_is_rejected_as_a_local_one(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(DENY_TEAM.replace('agent = "*"', f'agent = "{PEER}"'))
    ack = await svc.replicator.apply(_env(PEER, _mput(_memory(M1, namespace="team/x"))), PEER)
    assert not ack.accepted and ack.reason == "rejected:permission_denied"
    assert (await svc.replicator.apply(_env(PEER, _mput(_memory(M2, namespace="other"))), PEER)).accepted
    assert rows(cfg, "SELECT id FROM memories") == [(M2,)]
    # The same rule for this node's own agent refuses the local write with the same code.
    write_rules(cfg, DENY_TEAM)
    with pytest.raises(ServiceError) as e:
        await svc.memory_store("local", namespace="team/x")
    assert e.value.code == "permission_denied"


async def test_an_invalid_rules_file_refuses_to_open(open_service) -> None:
    with pytest.raises(ConfigError, match=r"rules\[1\] contradicts permissions.toml: rules\[0\]: deny vs allow"):
        await open_service(DENY_TEAM + DENY_TEAM.replace('mode = "enforce"', "").replace("deny", "allow"))


async def test_a_broken_edit_keeps_the_last_good_rules(open_service, cfg: NodeConfig) -> None:
    svc = await open_service(DENY_TEAM)
    write_rules(cfg, "mode = 'sometimes'")
    with pytest.raises(ServiceError):
        await svc.memory_store("still denied", namespace="team")
    assert "mode must be off | advisory | enforce" in (await capabilities(svc, None))["permissions"]["reload_error"]


async def test_runtime_rules_join_the_file_rules_and_contradictions_are_refused(open_service) -> None:
    svc = await open_service(DENY_TEAM)
    await svc.gate.add_rule({"agent": "*", "namespace": "ops", "operations": ["store"], "action": "deny"},
                            "test", 1)
    with pytest.raises(ServiceError, match="may not store"):
        await svc.memory_store("x", namespace="ops/a")
    with pytest.raises(ServiceError) as e:
        await svc.gate.add_rule({"agent": "*", "namespace": "team", "operations": ["store"], "action": "allow"},
                                "test", 2)
    assert e.value.code == "bad_input" and "contradicts" in e.value.message
    summary = (await capabilities(svc, None))["permissions"]["rule_summary"]
    assert summary[-1].startswith("deny store on ops for * (runtime #1")


async def test_storage_quota_refuses_a_local_insert_and_a_peers_alike(tmp_path, cfg: NodeConfig) -> None:
    from dataclasses import replace

    from node import assemble
    # On each backend: the quota counts UTF-8 bytes of content and title, whatever the characters.
    qcfg = replace(cfg, permissions=replace(cfg.permissions, max_bytes_per_agent=24))
    svc = await assemble.open_service(qcfg, require_identity=True)
    try:
        await svc.memory_store("é\\x41", title="0123456789")  # 2 + 4 + 10 bytes
        await svc.memory_store("0123456")  # 23
        with pytest.raises(ServiceError) as e:
            await svc.memory_store("ab")  # 25
        assert e.value.code == "quota_exceeded"
        await svc.memory_store("a")  # 24
        ok = _memory(M1)  # "content of <id>": 47 bytes, past the peer's 20
        ack = await svc.replicator.apply(_env(PEER, _mput(ok)), PEER)
        assert ack.reason == "rejected:quota_exceeded"
        assert rows(qcfg, "SELECT count(*) FROM memories") == [(3,)]
    finally:
        await svc.close()


async def test_kg_invalidate_is_gated_as_link_in_both_ends_namespaces(open_service, cfg: NodeConfig) -> None:
    svc = await open_service()
    a = await svc.memory_store("a", namespace="team/x")
    b = await svc.memory_store("b", namespace="free")
    link = await svc.memory_link(b["id"], a["id"], "related_to")
    write_rules(cfg, DENY_TEAM)
    with pytest.raises(ServiceError) as e:
        await svc.kg.invalidate(link["link_id"])
    assert e.value.code == "permission_denied" and "'team/x'" in e.value.message
    assert rows(cfg, "SELECT count(*) FROM link_invalidations") == [(0,)]
    assert (await svc.kg.query(b["id"], depth=1))["count"] == 1


async def test_kg_invalidate_under_an_ask_is_parked_and_runs_once_approved(open_service, cfg: NodeConfig) -> None:
    svc = await open_service()
    a = await svc.memory_store("a", namespace="team/x")
    b = await svc.memory_store("b", namespace="team/y")
    link = await svc.memory_link(a["id"], b["id"], "related_to")
    write_rules(cfg, DENY_TEAM.replace('action = "deny"', 'action = "ask"'))
    with pytest.raises(ServiceError) as e:
        await svc.kg.invalidate(link["link_id"], valid_until=link["valid_from"] + 1)
    assert e.value.code == "approval_required"
    assert rows(cfg, "SELECT count(*) FROM link_invalidations") == [(0,)]
    [pending] = await svc.approval_list()
    assert pending["operation"] == "link"
    decided = await svc.approval_decide(pending["id"], "approve")
    assert decided["status"] == "applied"
    assert rows(cfg, "SELECT link_id, valid_until FROM link_invalidations") == [(link["link_id"],
                                                                               link["valid_from"] + 1)]


async def test_a_peers_invalidation_is_gated_as_its_link_is(open_service, cfg: NodeConfig, tmp_path) -> None:
    from mesh import keys, peerkeys
    from node.attest import LinkPayload
    from tests.kg.test_kg_federation import _invalidate
    from tests.node.test_federation_apply import _link_put
    ident = keys.generate_identity(tmp_path / "peer-keys", PEER)
    peerkeys.import_peer(cfg.peers_dir, ident.pub_path)
    svc = await open_service()
    for mid in (M1, M2):
        assert (await svc.replicator.apply(_env(PEER, _mput(_memory(mid, namespace="team/x"))), PEER)).accepted
    put = _link_put(ident.private_key, M1, M2)
    assert (await svc.replicator.apply(_env(PEER, put), PEER)).accepted
    link_id = LinkPayload.from_mapping(put["link"]).link_id
    write_rules(cfg, DENY_TEAM.replace('agent = "*"', f'agent = "{PEER}"'))
    ack = await svc.replicator.apply(_env(PEER, _invalidate(ident.private_key, link_id, svc.clock())), PEER)
    assert not ack.accepted and ack.reason == "rejected:permission_denied"
    assert rows(cfg, "SELECT count(*) FROM link_invalidations") == [(0,)]



HIDE_TEAM = f"""
mode = "enforce"
[[rules]]
agent = "{AGENT}"
namespace = "team"
operations = ["recall", "list", "get", "verify"]
action = "deny"
"""


async def test_kg_reads_leave_out_memories_the_agent_may_not_read(open_service, cfg: NodeConfig) -> None:
    svc = await open_service()
    pub = await svc.memory_store("public start", namespace="public")
    hidden = await svc.memory_store("secret", namespace="team/hidden")
    beyond = await svc.memory_store("public beyond", namespace="public")
    near = await svc.memory_store("public near", namespace="public")
    await svc.memory_link(pub["id"], hidden["id"], "related_to")
    await svc.memory_link(hidden["id"], beyond["id"], "related_to")
    await svc.memory_link(pub["id"], near["id"], "related_to")
    write_rules(cfg, HIDE_TEAM)
    q = await svc.kg.query(pub["id"], depth=3)
    # The hidden memory is not listed, nor is what is reached only through it.
    assert [n["memory_id"] for n in q["neighbours"]] == [near["id"]]
    paths = await svc.kg.find_paths(pub["id"], beyond["id"])
    assert paths["paths"] == [] and paths["count"] == 0
    tl = await svc.kg.timeline(pub["id"])
    assert {(x["src_id"], x["dst_id"]) for x in tl["links"]} == {(pub["id"], near["id"])}
    assert all(ev["link_id"] in {x["link_id"] for x in tl["links"]} for ev in tl["events"])
    # A hidden memory itself is refused as memory_get refuses it.
    for call in (svc.kg.query(hidden["id"]), svc.kg.timeline(hidden["id"]),
                 svc.kg.find_paths(pub["id"], hidden["id"])):
        with pytest.raises(ServiceError) as e:
            await call
        assert e.value.code == "permission_denied"


async def test_links_a_pre_store_hook_proposes_pass_the_gate_as_memory_link(tmp_path, open_service,
                                                                            cfg: NodeConfig) -> None:
    import json

    from tests.hooks.scripts import hook, write_hooks_toml, write_scripts
    first = await open_service()
    target = await first.memory_store("team plans", namespace="team/x")
    await first.close()
    exe, _ = write_scripts(tmp_path / "hooks")
    delta = {"links": [{"dst_id": target["id"], "relation": "related_to", "confidence": 1.0}]}
    write_hooks_toml(cfg.hooks_path, [hook("linker", ["pre_store"], exe, "modify", json.dumps(delta))])
    svc = await open_service(DENY_TEAM)
    m = await svc.memory_store("free note", namespace="free")
    # The memory is stored; the proposed link into team, which memory_link would be refused, is not made.
    assert "links" not in m
    assert rows(cfg, "SELECT count(*) FROM memory_links") == [(0,)]
    write_rules(cfg, DENY_TEAM.replace('namespace = "team"', 'namespace = "elsewhere"'))
    made = await svc.memory_store("another", namespace="free")
    assert [link["dst_id"] for link in made["links"]] == [target["id"]]


async def test_with_permissions_off_a_link_reads_no_namespaces_first(open_service, monkeypatch) -> None:
    svc = await open_service()
    a = await svc.memory_store("a", namespace="team/x")
    b = await svc.memory_store("b", namespace="free")
    reads: list[str] = []
    real_read = svc.db.read

    async def counting_read(fn, *args):
        reads.append(fn.__name__)
        return await real_read(fn, *args)

    monkeypatch.setattr(svc.db, "read", counting_read)
    await svc.memory_link(a["id"], b["id"], "related_to")
    assert "get_many" not in reads  # the ends are still checked, inside the write
    assert rows(svc.cfg, "SELECT count(*) FROM memory_links") == [(1,)]


async def _one_in_team_two_free(svc: Any) -> tuple[dict, dict, dict]:
    """Memories a (team/x), b and c (free), stored before any rule is written."""
    return (await svc.memory_store("a", namespace="team/x"), await svc.memory_store("b", namespace="free"),
            await svc.memory_store("c", namespace="free"))


async def test_verify_by_link_id_needs_verify_in_both_ends_namespaces(open_service, cfg: NodeConfig) -> None:
    svc = await open_service()
    a, b, c = await _one_in_team_two_free(svc)
    hidden = await svc.memory_link(b["id"], a["id"], "related_to")
    open_link = await svc.memory_link(b["id"], c["id"], "related_to")
    write_rules(cfg, HIDE_TEAM)
    with pytest.raises(ServiceError) as e:  # the link's signer and level are the hidden end's too
        await svc.memory_verify(hidden["link_id"])
    assert e.value.code == "permission_denied" and "'team/x'" in e.value.message
    assert (await svc.memory_verify(open_link["link_id"]))["signature_verified"] is True


async def test_a_transcript_may_cite_only_memories_the_agent_may_get(open_service, cfg: NodeConfig) -> None:
    svc = await open_service()
    await svc.close()
    policy = dataclasses.replace(cfg.transcripts.default, enabled=True)
    tcfg = dataclasses.replace(cfg, transcripts=dataclasses.replace(cfg.transcripts, namespaces={"free": policy}))
    svc = await assemble.open_service(tcfg, require_identity=True)
    try:
        hidden = await svc.memory_store("a secret plan", namespace="team/x")
        shown = await svc.memory_store("a public note", namespace="free")
        write_rules(cfg, HIDE_TEAM)
        text = "user: tell me the plan\nassistant: no"
        with pytest.raises(ServiceError) as e:  # a span would quote a memory the agent may not read
            await svc.transcripts.store(text, namespace="free", spans=[{"memory_id": hidden["id"], "start": 0,
                                                                        "end": 4}])
        assert e.value.code == "permission_denied"
        assert rows(cfg, "SELECT count(*) FROM memory_transcripts") == [(0,)]
        stored = await svc.transcripts.store(text, namespace="free",
                                             spans=[{"memory_id": shown["id"], "start": 0, "end": 4}])
        assert [s["memory_id"] for s in stored["spans"]] == [shown["id"]]
    finally:
        await svc.close()


async def test_memory_link_many_asks_the_gate_per_link_and_makes_the_allowed_ones(open_service,
                                                                                   cfg: NodeConfig) -> None:
    svc = await open_service()
    a, b, c = await _one_in_team_two_free(svc)
    write_rules(cfg, DENY_TEAM)
    out = await svc.memory_link_many([{"src_id": b["id"], "dst_id": a["id"], "relation": "into_team"},
                                      {"src_id": b["id"], "dst_id": c["id"], "relation": "free_to_free"}])
    denied, made = out["results"]
    assert denied["error"]["code"] == "permission_denied" and "'team/x'" in denied["error"]["message"]
    assert made["ok"]["relation"] == "free_to_free" and (out["made"], out["failed"]) == (1, 1)
    assert rows(cfg, "SELECT relation FROM memory_links") == [("free_to_free",)]


async def test_memory_link_many_parks_an_asked_link_alone_and_approval_makes_it(open_service,
                                                                                cfg: NodeConfig) -> None:
    svc = await open_service()
    a, b, c = await _one_in_team_two_free(svc)
    write_rules(cfg, DENY_TEAM.replace('action = "deny"', 'action = "ask"'))
    out = await svc.memory_link_many([{"src_id": a["id"], "dst_id": b["id"], "relation": "asked"},
                                      {"src_id": c["id"], "dst_id": b["id"], "relation": "free"}])
    assert out["results"][0]["error"]["code"] == "approval_required" and "ok" in out["results"][1]
    [pending] = await svc.approval_list()
    assert pending["operation"] == "link"
    await svc.approval_decide(pending["id"], "approve")  # runs the parked link as one memory_link
    assert sorted(rows(cfg, "SELECT relation FROM memory_links")) == [("asked",), ("free",)]


class _CountedReads:
    """The gate's database, its reads counted by the function each runs."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.calls: dict[str, int] = {}

    async def read(self, fn: Any, *args: Any) -> Any:
        self.calls[fn.__name__] = self.calls.get(fn.__name__, 0) + 1
        return await self.db.read(fn, *args)


async def test_quota_checks_made_together_sum_the_agents_memories_once(cfg: NodeConfig) -> None:
    import asyncio
    from dataclasses import replace

    from node.permissions.gate import Gate
    # A pulled page's memories are applied together: their quota checks find the sum stale at once.
    qcfg = replace(cfg, permissions=replace(cfg.permissions, reload_check_s=3600.0))
    svc = await assemble.open_service(qcfg, require_identity=True)
    try:
        await svc.memory_store("0123456789")
        db = _CountedReads(svc.db)
        gate = await Gate.open(qcfg, db)  # type: ignore[arg-type]
        codes = await asyncio.gather(*(gate.quota_code(AGENT, 1) for _ in range(64)))
        assert codes == [None] * 64
        assert db.calls["bytes_by_writer"] == 1
        assert await gate.usage(AGENT) == 10 + 64  # the sum, and what was admitted since
    finally:
        await svc.close()


def test_an_agents_bytes_are_summed_again_no_sooner_than_twenty_times_the_last_sum_took() -> None:
    from node.permissions.gate import sum_every_s
    assert sum_every_s(1.0, 0.002) == 1.0  # a small store: every reload_check_s
    assert sum_every_s(1.0, 0.25) == 5.0  # a sum of a quarter second: at most 5% of a reader's time
