"""Transcripts through the service, on both backends: spans in code points, replay permission, the
archive-then-prune lifecycle on a driven clock, clear errors that leave stored data as it was."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mesh import keys
from node.assemble import open_service
from node.config import NodeConfig, from_dict
from node.errors import ServiceError
from node.hooks import HookEvent, NoHooks
from storage import events, transcripts
from tests.node.conftest import AGENT, dump_tables, tamper

DAY_MS = 86_400_000
TEXT = "user: où est le café? ☕\nassistant: rue de la Paix 🙂 — 3e étage.\n" * 3
OPEN = {"default": {"enabled": True, "replay": "allow", "ttl_s": 86_400.0, "prune_after_s": 2 * 86_400.0},
        "closed": {"enabled": True}, "small": {"enabled": True, "max_bytes": 64, "max_spans": 2}}


class Clock:
    """A clock the test moves by hand (unix ms)."""

    def __init__(self, t: int = 1_700_000_000_000) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


@pytest.fixture
def tcfg(cfg: NodeConfig) -> NodeConfig:
    policies = {ns: dataclasses.replace(cfg.transcripts.default, **p) for ns, p in OPEN.items()}
    return dataclasses.replace(cfg, transcripts=dataclasses.replace(cfg.transcripts, namespaces=policies))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def tsvc(tcfg: NodeConfig, clock: Clock):
    s = await open_service(tcfg, clock=clock, require_identity=True)
    yield s
    await s.close()


async def _memory(svc, namespace: str = "default") -> str:
    return str((await svc.memory_store("drawn from a transcript", namespace=namespace))["id"])


async def test_spans_are_code_points_and_come_back_exactly(tsvc):
    mid = await _memory(tsvc)
    start = TEXT.index("café")
    end = TEXT.index("🙂") + 1
    stored = await tsvc.transcripts.store(TEXT, spans=[{"memory_id": mid, "start": start, "end": end},
                                                       {"memory_id": mid, "start": 0, "end": 4}])
    assert stored["attest_level"] == "self_signed" and stored["raw_bytes"] == len(TEXT.encode("utf-8"))
    assert stored["spans"] == [{"memory_id": mid, "start": 0, "end": 4}, {"memory_id": mid, "start": start, "end": end}]
    r = await tsvc.transcripts.replay(mid)
    assert r["count"] == 1 and "text" not in r["transcripts"][0]
    assert [s["text"] for s in r["transcripts"][0]["spans"]] == ["user", TEXT[start:end]]
    cited = r["transcripts"][0]["spans"][1]["text"]
    assert cited.startswith("café") and cited[-1] == "🙂"
    full = await tsvc.transcripts.replay(mid, full=True)
    assert full["transcripts"][0]["text"].encode("utf-8") == TEXT.encode("utf-8")


async def test_store_is_a_signed_event(tsvc):
    stored = await tsvc.transcripts.store(TEXT)
    head = await tsvc.db.read(events.head)
    assert head is not None and head.event_type == "transcript" and head.link_id == stored["id"]
    assert (await tsvc.audit_verify())["ok"]


async def test_full_replay_is_permission_denied_where_the_namespace_does_not_allow_it(tsvc):
    mid = await _memory(tsvc, "closed")
    await tsvc.transcripts.store(TEXT, namespace="closed", spans=[{"memory_id": mid, "start": 0, "end": 5}])
    assert (await tsvc.transcripts.replay(mid))["transcripts"][0]["spans"][0]["text"] == "user:"
    with pytest.raises(ServiceError) as err:
        await tsvc.transcripts.replay(mid, full=True)
    assert err.value.code == "permission_denied" and "closed" in err.value.message


async def test_disabled_namespace_refuses_and_stores_nothing(tsvc, tcfg):
    with pytest.raises(ServiceError) as err:
        await tsvc.transcripts.store(TEXT, namespace="elsewhere")
    assert err.value.code == "transcripts_disabled"
    assert dump_tables(tcfg, ("memory_transcripts",)) == [[]]


@pytest.mark.parametrize(("namespace", "spans", "code"), [
    ("small", None, "too_large"),
    ("default", [{"memory_id": "m", "start": 0, "end": len(TEXT) + 1}], "span_out_of_range"),
    ("default", [{"memory_id": "m", "start": 3, "end": 3}], "span_out_of_range"),
    ("default", [{"memory_id": "m", "start": -1, "end": 2}], "span_out_of_range"),
    ("default", [{"memory_id": "m", "start": 0}], "bad_input"),
    ("default", [{"memory_id": "not-stored", "start": 0, "end": 2}], "unknown_memory"),
])
async def test_bad_input_is_a_clear_error_and_changes_nothing(tsvc, tcfg, namespace, spans, code):
    before = await tsvc.transcripts.store(TEXT)
    with pytest.raises(ServiceError) as err:
        await tsvc.transcripts.store(TEXT, namespace=namespace, spans=spans)
    assert err.value.code == code
    rows = dump_tables(tcfg, ("memory_transcripts",))[0]
    assert [r[0] for r in rows] == [before["id"]]


async def test_too_many_spans_is_too_large(tsvc):
    mid = await _memory(tsvc, "small")
    with pytest.raises(ServiceError) as err:
        await tsvc.transcripts.store("short", namespace="small",
                                     spans=[{"memory_id": mid, "start": i, "end": i + 1} for i in range(3)])
    assert err.value.code == "too_large"


async def test_unknown_memory_replay_is_unknown_memory(tsvc):
    with pytest.raises(ServiceError) as err:
        await tsvc.transcripts.replay("00000000-0000-4000-8000-000000000000")
    assert err.value.code == "unknown_memory"


async def test_ttl_archives_then_prunes_on_a_driven_clock(tsvc, clock):
    mid = await _memory(tsvc)
    tid = (await tsvc.transcripts.store(TEXT, spans=[{"memory_id": mid, "start": 0, "end": 4}]))["id"]
    clock.t += DAY_MS - 1
    assert (await tsvc.transcripts.lifecycle())["archived"] == []
    clock.t += 2
    assert (await tsvc.transcripts.lifecycle())["archived"] == [tid]
    r = await tsvc.transcripts.replay(mid)
    assert r["transcripts"][0]["archived"] and r["transcripts"][0]["spans"][0]["text"] == "user"
    assert await tsvc.db.read(transcripts.counts) == {"hot": 0, "archived": 1, "links": 1}
    clock.t += 2 * DAY_MS - 1
    assert (await tsvc.transcripts.lifecycle())["pruned"] == []
    clock.t += 2
    assert (await tsvc.transcripts.lifecycle())["pruned"] == [tid]
    assert (await tsvc.transcripts.replay(mid))["transcripts"] == []
    assert await tsvc.db.read(transcripts.counts) == {"hot": 0, "archived": 0, "links": 0}


async def test_a_corrupted_blob_is_transcript_corrupt_and_stays_stored(tsvc, tcfg):
    mid = await _memory(tsvc)
    tid = (await tsvc.transcripts.store(TEXT, spans=[{"memory_id": mid, "start": 0, "end": 4}]))["id"]
    tamper(tcfg, "UPDATE memory_transcripts SET body = ? WHERE id = ?", (b"\x28\xb5\x2f\xfd garbage", tid))
    with pytest.raises(ServiceError) as err:
        await tsvc.transcripts.replay(mid)
    assert err.value.code == "transcript_corrupt" and tid in err.value.message
    assert (await tsvc.memory_get(mid))["id"] == mid  # the rest of the store answers as before


class _Recorder(NoHooks):
    def __init__(self) -> None:
        self.fired: list[tuple[str, dict]] = []

    async def fire(self, event, payload):
        self.fired.append((str(event), payload))
        if event == HookEvent.PRE_TRANSCRIPT_STORE:
            return {**payload, "content": payload["content"].upper()}
        return payload


async def test_pre_and_post_transcript_store_hooks_fire(tmp_path: Path):
    cfg = from_dict({"agent_id": AGENT, "home": str(tmp_path), "transcripts": {"enabled": True}}, env={})
    keys.generate_identity(cfg.keys_dir, AGENT)
    rec = _Recorder()
    svc = await open_service(cfg, require_identity=True, hooks=rec)
    try:
        stored = await svc.transcripts.store("hello there")
        replayed = await svc.db.read(transcripts.get, stored["id"])
        assert replayed is not None and transcripts.decompress(replayed) == "HELLO THERE"
    finally:
        await svc.close()
    names = [e for e, _ in rec.fired]
    assert names == ["pre_transcript_store", "post_transcript_store"]
    assert rec.fired[0][1] == {"session_id": stored["id"], "content": "hello there", "agent_id": AGENT}
    assert rec.fired[1][1] == {"session_id": stored["id"], "transcript_id": stored["id"]}


async def test_the_permission_gate_answers_transcript_store_and_replay(tcfg):
    tcfg.home.mkdir(parents=True, exist_ok=True)
    tcfg.permissions_path.write_text(
        'mode = "enforce"\n'
        '[[rules]]\nagent = "*"\nnamespace = "closed"\noperations = ["replay"]\naction = "deny"\n'
        '[[rules]]\nagent = "*"\nnamespace = "small"\noperations = ["store"]\naction = "ask"\n', encoding="utf-8")
    svc = await open_service(tcfg, require_identity=True)
    try:
        mid = await _memory(svc, "closed")
        await svc.transcripts.store(TEXT, namespace="closed", spans=[{"memory_id": mid, "start": 0, "end": 5}])
        with pytest.raises(ServiceError) as denied:
            await svc.transcripts.replay(mid)  # cited spans too: the rule denies replay in this namespace
        assert denied.value.code == "permission_denied"
        before = await svc.db.read(transcripts.counts)
        with pytest.raises(ServiceError) as ask:
            await svc.transcripts.store("short", namespace="small")  # an ask refuses: a transcript is not parked
        assert ask.value.code == "approval_required"
        assert await svc.db.read(transcripts.counts) == before
    finally:
        await svc.close()


async def test_replay_of_a_memory_the_agent_may_not_get_is_refused(tcfg):
    """The spans a memory was drawn from are its content: replay reads it as memory_get does."""
    svc = await open_service(tcfg, require_identity=True)
    try:
        hidden = await _memory(svc, "closed")
        await svc.transcripts.store(TEXT, namespace="default", spans=[{"memory_id": hidden, "start": 0, "end": 5}])
        tcfg.permissions_path.write_text(
            'mode = "enforce"\n'
            '[[rules]]\nagent = "*"\nnamespace = "closed"\noperations = ["get"]\naction = "deny"\n', encoding="utf-8")
        await svc.gate.refresh()
        with pytest.raises(ServiceError) as denied:
            await svc.memory_get(hidden)
        assert denied.value.code == "permission_denied"
        with pytest.raises(ServiceError) as denied:
            await svc.transcripts.replay(hidden)
        assert denied.value.code == "permission_denied" and "'closed'" in denied.value.message
    finally:
        await svc.close()
