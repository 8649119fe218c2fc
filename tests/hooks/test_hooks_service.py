"""Hooks as real processes around a real service on a real SQLite file."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path

import pytest

from node.config import NodeConfig
from node.hooks import SPECS, HookEvent, HookRefused
from node.hooks.pipeline import HookPipeline
from node.mcp.capabilities import capabilities
from node.permissions.approvals import ApprovalPending
from tests.hooks.conftest import log_lines, rows
from tests.hooks.scripts import hook, write_hooks_toml

# Bound on the polling loops below (count and time), never an assertion on duration.
POLL_S = 0.02
POLL_MAX = 500


def counts(svc, name: str) -> dict:
    return next(h for h in svc.hooks.snapshot()["hooks"] if h["name"] == name)["counts"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_no_hooks_file_means_no_hooks(open_service) -> None:
    svc = await open_service()
    m = await svc.memory_store("plain memory")
    assert m["content"] == "plain memory"
    assert svc.hooks.snapshot()["by_event"] == {}


async def test_allow_hook_lets_the_store_through_and_sees_the_payload(open_service, scripts, hook_log,
                                                                      cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("gate", ["pre_store"], exe, "allow")])
    m = await svc.memory_store("allowed text", tags=["t"])
    assert rows(cfg, "SELECT id, content FROM memories") == [(m["id"], "allowed text")]
    name, event, payload = log_lines(hook_log)[0].split(" ", 2)
    assert (name, event) == ("gate", "pre_store")
    assert json.loads(payload)["id"] == m["id"] and json.loads(payload)["tags"] == ["t"]
    assert counts(svc, "gate") == {"fired": 1, "allowed": 1}


async def test_deny_refuses_the_write_with_the_hooks_code_and_stores_nothing(open_service, scripts,
                                                                             cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("no-secrets", ["pre_store"], exe, "deny", "secret_detected")])
    with pytest.raises(HookRefused) as e:
        await svc.memory_store("the password is hunter2")
    assert e.value.code == "secret_detected"
    assert "no-secrets" in e.value.message and "refused by the test hook" in e.value.message
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]
    assert rows(cfg, "SELECT count(*) FROM change_log") == [(0,)]


async def test_modify_changes_the_stored_row(open_service, scripts, cfg: NodeConfig) -> None:
    exe, _ = scripts
    delta = json.dumps({"title": "[reviewed]", "tags": ["hooked"], "priority": 9})
    svc = await open_service([hook("tagger", ["pre_store"], exe, "modify", delta)])
    m = await svc.memory_store("some text", title="orig")
    assert (m["title"], m["tags"], m["priority"]) == ("[reviewed]", ["hooked"], 9)
    assert rows(cfg, "SELECT title, tags, priority FROM memories") == [("[reviewed]", '["hooked"]', 9)]


async def test_modify_that_breaks_a_limit_is_refused_by_the_service(open_service, scripts) -> None:
    exe, _ = scripts
    svc = await open_service([hook("bad", ["pre_store"], exe, "modify", json.dumps({"priority": 99}))])
    with pytest.raises(Exception) as e:
        await svc.memory_store("text")
    assert e.value.code == "bad_input"


async def test_ask_user_parks_the_store_as_approval_required_with_the_prompt(open_service, scripts,
                                                                             cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("ask", ["pre_store"], exe, "ask", "Store a memory about payroll?")])
    with pytest.raises(ApprovalPending) as e:
        await svc.memory_store("payroll details")
    assert e.value.code == "approval_required"
    assert "Store a memory about payroll?" in e.value.message
    assert (await svc.approvals.get(e.value.action_id))["call"]["args"]["content"] == "payroll details"
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]


async def test_ask_user_on_a_link_parks_it_under_its_source_namespace(open_service, scripts,
                                                                        cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("ask", ["pre_link"], exe, "ask", "Link these?")])
    a = await svc.memory_store("a", namespace="team/x")
    b = await svc.memory_store("b", namespace="free")
    with pytest.raises(ApprovalPending) as e:
        await svc.memory_link(a["id"], b["id"], "related_to")
    assert (await svc.approvals.get(e.value.action_id))["namespace"] == "team/x"
    decided = await svc.approval_decide(e.value.action_id, "approve", remember="forever")
    # Remembered for the link's namespace only, not as a rule answering link asks everywhere.
    assert decided["remembered"].startswith("approved link on team/x for ")
    assert rows(cfg, "SELECT count(*) FROM memory_links") == [(1,)]


async def test_an_asked_link_from_an_unknown_memory_adds_no_rule(open_service, scripts, cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("ask", ["pre_link"], exe, "ask", "Link these?")])
    a = await svc.memory_store("a")
    with pytest.raises(ApprovalPending) as e:  # its source is not stored here: no namespace to park under
        await svc.memory_link("0" * 32, a["id"], "related_to")
    assert (await svc.approvals.get(e.value.action_id))["namespace"] == ""
    with pytest.raises(Exception) as refused:  # the approved re-run finds no source memory
        await svc.approval_decide(e.value.action_id, "approve", remember="forever")
    assert getattr(refused.value, "code", None) == "unknown_memory"
    assert (await capabilities(svc, None))["permissions"]["rules"] == 0


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_hanging_hook_is_killed_at_its_deadline(open_service, scripts, tmp_path: Path, cfg: NodeConfig,
                                                      fail_mode: str) -> None:
    exe, _ = scripts
    pid_file = tmp_path / "hang.pid"
    svc = await open_service([hook("sleepy", ["pre_store"], exe, "hang", str(pid_file), timeout_ms=1000,
                                   fail_mode=fail_mode)])
    if fail_mode == "open":
        await svc.memory_store("goes ahead")
        assert rows(cfg, "SELECT count(*) FROM memories") == [(1,)]
    else:
        with pytest.raises(HookRefused) as e:
            await svc.memory_store("refused")
        assert e.value.code == "hook_timeout"
        assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]
    # On a loaded machine the hook may be killed before it got to write its pid: then nothing is left either.
    if pid_file.exists() and pid_file.read_text():
        assert gone(int(pid_file.read_text())), "the hung hook must be killed and reaped"
    assert counts(svc, "sleepy")["timeout"] == 1


@pytest.mark.parametrize("mode,failure", [("crash", "crashed"), ("garbage", "malformed")])
async def test_crashing_or_garbage_hook_fails_open_by_default_and_closed_when_asked(
        open_service, scripts, cfg: NodeConfig, mode: str, failure: str) -> None:
    exe, _ = scripts
    svc = await open_service([hook("loose", ["pre_store"], exe, mode),
                              hook("strict", ["pre_update"], exe, mode, fail_mode="closed")])
    m = await svc.memory_store("stored despite the broken hook")
    assert counts(svc, "loose") == {"fired": 1, failure: 1}
    with pytest.raises(HookRefused) as e:
        await svc.memory_update(m["id"], content="changed")
    assert e.value.code == f"hook_{failure}"
    assert rows(cfg, "SELECT version FROM memories") == [(1,)]


async def test_chain_runs_by_priority_and_first_deny_wins(open_service, scripts, hook_log,
                                                          cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([
        hook("low", ["pre_store"], exe, "deny", "low_code", priority=1),
        hook("high", ["pre_store"], exe, "allow", priority=10),
        hook("mid", ["pre_store"], exe, "deny", "mid_code", priority=5),
    ])
    with pytest.raises(HookRefused) as e:
        await svc.memory_store("x")
    assert e.value.code == "mid_code"
    assert [line.split()[0] for line in log_lines(hook_log)] == ["high", "mid"]  # low never ran
    assert rows(cfg, "SELECT count(*) FROM memories") == [(0,)]


async def test_modify_deltas_apply_in_order_and_later_hooks_see_earlier_changes(open_service, scripts,
                                                                                 hook_log) -> None:
    exe, _ = scripts
    svc = await open_service([
        hook("second", ["pre_store"], exe, "modify", json.dumps({"title": "B"}), priority=1),
        hook("first", ["pre_store"], exe, "modify", json.dumps({"title": "A", "source": "first"}), priority=2),
    ])
    m = await svc.memory_store("x", title="orig")
    assert (m["title"], m["source"]) == ("B", "first")
    second_saw = json.loads(log_lines(hook_log)[1].split(" ", 2)[2])
    assert second_saw["title"] == "A"


async def test_modify_on_a_post_event_is_ignored(open_service, scripts, cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("late", ["post_store"], exe, "modify", json.dumps({"title": "nope"}))])
    m = await svc.memory_store("x", title="kept")
    assert m["title"] == "kept"
    assert rows(cfg, "SELECT title FROM memories") == [("kept",)]


async def test_deny_on_post_recall_withholds_results_from_a_daemon(open_service, scripts) -> None:
    _, daemon = scripts
    svc = await open_service([hook("dlp", ["post_recall"], daemon)])
    await svc.memory_store("the forbidden archive")
    await svc.memory_store("an ordinary note")
    assert [h["content"] for h in await svc.memory_recall("ordinary")] == ["an ordinary note"]
    with pytest.raises(HookRefused) as e:
        await svc.memory_recall("archive")
    assert e.value.code == "forbidden_topic"
    state = svc.hooks.snapshot()["hooks"][0]
    assert state["mode"] == "daemon" and state["runner"]["state"] == "running"
    assert state["counts"] == {"fired": 2, "allowed": 1, "denied": 1}


async def test_daemon_that_dies_is_restarted(open_service, scripts, hook_log) -> None:
    _, daemon = scripts
    svc = await open_service([hook("guard", ["pre_store"], daemon, mode="daemon")])
    await svc.memory_store("warm up")
    first_pid = svc.hooks.snapshot()["hooks"][0]["runner"]["pid"]
    await svc.memory_store("die now please")  # the daemon exits without answering: fail-open
    with pytest.raises(HookRefused):
        await svc.memory_store("forbidden words")  # answered by the restarted daemon
    runner = svc.hooks.snapshot()["hooks"][0]["runner"]
    assert runner["state"] == "running" and runner["restarts"] == 1 and runner["pid"] != first_pid
    assert counts(svc, "guard") == {"fired": 3, "allowed": 1, "crashed": 1, "denied": 1}
    await svc.hooks.close()
    assert gone(first_pid) and gone(runner["pid"]), "daemons are reaped on close"


async def test_daemon_garbage_line_is_a_malformed_answer(open_service, scripts) -> None:
    _, daemon = scripts
    svc = await open_service([hook("g", ["pre_store"], daemon, mode="daemon", timeout_ms=1500,
                                   fail_mode="closed")])
    with pytest.raises(HookRefused) as e:
        await svc.memory_store("garble this")
    # The garbage line answers nothing, so the request runs out its time.
    assert e.value.code == "hook_timeout"
    await svc.memory_store("fine afterwards")


async def test_hot_reload_swaps_config_and_in_flight_fires_finish_on_the_old_one(
        open_service, scripts, hook_log, cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("gate", ["pre_store"], exe, "slow_allow", "0.5")])
    in_flight = asyncio.create_task(svc.memory_store("started under the old config"))
    for _ in range(POLL_MAX):
        if log_lines(hook_log):
            break
        await asyncio.sleep(POLL_S)
    write_hooks_toml(cfg.hooks_path, [hook("gate", ["pre_store"], exe, "deny", "new_rules")])
    refused = None
    for _ in range(POLL_MAX):
        try:
            await svc.memory_store("after the change")
        except HookRefused as e:
            refused = e
            break
        await asyncio.sleep(POLL_S)
    assert refused is not None and refused.code == "new_rules"
    assert (await in_flight)["content"] == "started under the old config"
    assert svc.hooks.snapshot()["reloads"] >= 1


async def test_broken_reload_keeps_the_last_good_config(open_service, scripts, cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("gate", ["pre_store"], exe, "deny", "still_denied")])
    cfg.hooks_path.write_text("[[hooks]]\nname = 'x'\nevents = ['pre_nothing']\ncommand = ['true']\n")
    snap = None
    for _ in range(POLL_MAX):
        with pytest.raises(HookRefused):
            await svc.memory_store("x")
        snap = svc.hooks.snapshot()
        if snap["reload_error"]:
            break
        await asyncio.sleep(POLL_S)
    assert snap is not None and "hooks[0] (x).events[0]" in snap["reload_error"]


async def test_hooks_file_created_later_takes_effect(open_service, scripts, cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service()
    await svc.memory_store("before")
    write_hooks_toml(cfg.hooks_path, [hook("gate", ["pre_link"], exe, "deny", "no_links")])
    a = await svc.memory_store("a")
    b = await svc.memory_store("b")
    refused = None
    for _ in range(POLL_MAX):
        try:
            await svc.memory_link(a["id"], b["id"], "related_to")
        except HookRefused as e:
            refused = e
            break
        await asyncio.sleep(POLL_S)
    assert refused is not None and refused.code == "no_links"


async def test_capabilities_report_hooks_by_event_from_live_state(open_service, scripts) -> None:
    exe, daemon = scripts
    svc = await open_service([hook("a", ["pre_store", "post_store"], exe, "allow"),
                              hook("b", ["pre_store"], daemon, mode="daemon", priority=5),
                              hook("off", ["pre_recall"], exe, "allow", enabled=False)])
    caps = await capabilities(svc, None)
    assert caps["hooks"]["by_event"] == {"pre_store": ["b", "a"], "post_store": ["a"]}
    assert {h["name"]: h["enabled"] for h in caps["hooks"]["hooks"]} == {"a": True, "b": True, "off": False}


async def test_proposed_links_to_memories_not_here_are_skipped(open_service, scripts, cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc0 = await open_service()
    kept = await svc0.memory_store("already stored")
    await svc0.close()
    proposals = [{"dst_id": kept["id"], "relation": "related_to", "confidence": 0.5},
                 {"dst_id": "00000000-0000-4000-8000-000000000000", "relation": "related_to"}]
    svc = await open_service([hook("linker", ["pre_store"], exe, "modify", json.dumps({"links": proposals}))])
    m = await svc.memory_store("new one")
    assert [(link["dst_id"], link["confidence"]) for link in m["links"]] == [(kept["id"], 0.5)]
    assert rows(cfg, "SELECT src_id, dst_id FROM memory_links") == [(m["id"], kept["id"])]


async def test_notifications_fire_without_blocking_the_caller(open_service, tmp_path: Path) -> None:
    # A shell hook: the index class has a 1 s deadline, tighter than a Python start on a loaded machine.
    sh = tmp_path / "deny.sh"
    sh.write_text("#!/bin/sh\ncat >/dev/null\necho '{\"decision\": \"deny\", \"code\": \"ignored\"}'\n")
    sh.chmod(0o755)
    svc = await open_service([{"name": "evictions", "events": ["on_index_eviction"], "mode": "exec",
                               "command": [str(sh)]}])
    svc.hooks.notify(HookEvent.ON_INDEX_EVICTION, {"index": "seen_cache", "key": "k1", "expires_at": 1,
                                                   "size": 1, "maxsize": 1})
    for _ in range(POLL_MAX):
        if len(counts(svc, "evictions")) > 1:
            break
        await asyncio.sleep(POLL_S)
    assert counts(svc, "evictions") == {"fired": 1, "denied": 1}  # recorded; an on_* event is never refused


async def test_fired_payloads_carry_exactly_the_documented_fields(open_service, scripts, hook_log) -> None:
    _, daemon = scripts
    service_events = ["pre_store", "post_store", "pre_update", "post_update", "pre_link", "post_link",
                      "pre_recall", "post_recall", "pre_verify", "post_verify"]
    svc = await open_service([hook("recorder", service_events, daemon, mode="daemon")])
    a = await svc.memory_store("first note")
    b = await svc.memory_store("second note")
    await svc.memory_update(a["id"], title="t")
    link = await svc.memory_link(a["id"], b["id"], "related_to")
    await svc.memory_recall("note")
    await svc.memory_verify(link["link_id"])
    seen = {}
    for line in log_lines(hook_log):
        _, event, keys = line.split(" ", 2)
        seen[event] = json.loads(keys)
    assert sorted(seen) == sorted(service_events)
    for event, keys in seen.items():
        assert keys == sorted(SPECS[HookEvent(event)].payload), event


async def test_unresponsive_daemon_is_killed_after_timeouts_in_a_row_and_restarted(open_service, scripts,
                                                                                     cfg: NodeConfig) -> None:
    _, daemon = scripts
    svc = await open_service([hook("stuck", ["pre_store"], daemon, mode="daemon", timeout_ms=1000)])
    stuck_pid = 0
    for i in range(cfg.hooks.daemon_max_timeouts):
        await svc.memory_store(f"stall {i}")  # fail-open: stored after the timeout
        stuck_pid = svc.hooks.snapshot()["hooks"][0]["runner"]["pid"] or stuck_pid
    for _ in range(POLL_MAX):
        if svc.hooks.snapshot()["hooks"][0]["runner"]["state"] == "backoff":
            break
        await asyncio.sleep(POLL_S)
    assert gone(stuck_pid), "the unresponsive daemon is killed and reaped"
    await svc.memory_store("answered again")
    runner = svc.hooks.snapshot()["hooks"][0]["runner"]
    assert runner["restarts"] == 1 and runner["state"] == "running"
    assert counts(svc, "stuck") == {"fired": 4, "timeout": 3, "allowed": 1}


async def test_daemon_queue_bound_holds_fires_back_instead_of_piling_up(cfg: NodeConfig, scripts) -> None:
    _, daemon = scripts
    cfg.home.mkdir(parents=True, exist_ok=True)
    write_hooks_toml(cfg.hooks_path, [hook("one-at-a-time", ["pre_recall"], daemon)])
    pipeline = HookPipeline(cfg.hooks_path, dataclasses.replace(cfg.hooks, daemon_queue_max=1))
    try:
        payload = {"query": "take a while", "limit": 10, "namespace": None}
        results = await asyncio.gather(*(pipeline.fire(HookEvent.PRE_RECALL, dict(payload)) for _ in range(4)))
        assert results == [payload] * 4
        runner = pipeline.snapshot()["hooks"][0]["runner"]
        assert runner["peak_outstanding"] == 1
    finally:
        await pipeline.close()


async def test_memory_link_many_fires_pre_and_post_link_per_link_as_memory_link(open_service, scripts, hook_log,
                                                                               cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("relabel", ["pre_link"], exe, "modify", json.dumps({"relation": "hooked"})),
                              hook("watch", ["post_link"], exe, "allow")])
    src = await svc.memory_store("source")
    dsts = [await svc.memory_store(f"target {i}") for i in range(3)]
    out = await svc.memory_link_many([{"src_id": src["id"], "dst_id": d["id"], "relation": "asked"} for d in dsts])
    assert out["made"] == 3 and {r["ok"]["relation"] for r in out["results"]} == {"hooked"}
    fired = [line.split(" ", 2)[:2] for line in log_lines(hook_log)]
    assert fired.count(["relabel", "pre_link"]) == 3 and fired.count(["watch", "post_link"]) == 3
    assert rows(cfg, "SELECT DISTINCT relation FROM memory_links") == [("hooked",)]


async def test_memory_link_many_refused_by_a_pre_link_hook_answers_each_item_and_stores_nothing(
        open_service, scripts, cfg: NodeConfig) -> None:
    exe, _ = scripts
    svc = await open_service([hook("gate", ["pre_link"], exe, "deny", "no_links")])
    a, b = await svc.memory_store("a"), await svc.memory_store("b")
    out = await svc.memory_link_many([{"src_id": a["id"], "dst_id": b["id"], "relation": f"r{i}"} for i in range(2)])
    assert (out["made"], out["failed"]) == (0, 2)
    assert [r["error"]["code"] for r in out["results"]] == ["no_links", "no_links"]
    assert rows(cfg, "SELECT count(*) FROM memory_links") == [(0,)]
