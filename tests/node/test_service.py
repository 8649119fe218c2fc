"""The service layer end to end on a real SQLite file: store, recall, link, verify, audit, bad input."""

import dataclasses

import pytest

from node.assemble import open_service
from node.config import NodeConfig
from node.errors import ServiceError
from node.mcp.capabilities import capabilities
from node.service import Service
from tests.node.conftest import AGENT, dump_tables, make_config, tamper


async def _two(svc: Service) -> tuple[dict, dict]:
    a = await svc.memory_store("alpha signing notes", title="a", tags=["x"])
    b = await svc.memory_store("beta verification notes", title="b")
    return a, b


def _dump(cfg: NodeConfig) -> list:
    return dump_tables(cfg, ("memories", "memory_links", "signed_events"))


async def test_store_get_list_recall_round_trip(svc: Service) -> None:
    a, b = await _two(svc)
    assert (await svc.memory_get(a["id"]))["content"] == "alpha signing notes"
    assert a["origin"] == AGENT and a["version"] == 1
    assert {m["id"] for m in await svc.memory_list()} == {a["id"], b["id"]}
    hits = await svc.memory_recall("verification")
    assert [h["id"] for h in hits] == [b["id"]]


async def test_link_is_self_signed_and_verifies(svc: Service) -> None:
    a, b = await _two(svc)
    link = await svc.memory_link(a["id"], b["id"], "related_to")
    assert link["attest_level"] == "self_signed"
    assert link["signed_by"] == AGENT
    v = await svc.memory_verify(link["link_id"])
    assert v["signature_verified"] is True
    assert v["attest_level"] == "self_signed"
    assert (await svc.audit_verify())["ok"] is True


async def test_link_without_key_is_unsigned(tmp_path) -> None:
    svc = await open_service(make_config(tmp_path / "nokey"))
    try:
        a, b = await _two(svc)
        link = await svc.memory_link(a["id"], b["id"], "related_to")
        assert link["attest_level"] == "unsigned"
        v = await svc.memory_verify(link["link_id"])
        assert v["signature_verified"] is False and v["reason"] == "link is unsigned"
    finally:
        await svc.close()


async def test_link_to_unknown_memory_is_refused_and_stores_nothing(svc: Service, cfg: NodeConfig) -> None:
    a, _ = await _two(svc)
    before = _dump(cfg)
    with pytest.raises(ServiceError) as err:
        await svc.memory_link(a["id"], "00000000-0000-4000-8000-000000000000", "related_to")
    assert err.value.code == "unknown_memory"
    assert _dump(cfg) == before


async def test_tampered_link_row_fails_verification(svc: Service, cfg: NodeConfig) -> None:
    a, b = await _two(svc)
    link = await svc.memory_link(a["id"], b["id"], "related_to")
    tamper(cfg, "UPDATE memory_links SET relation = 'contradicts' WHERE link_id = ?", (link["link_id"],))
    v = await svc.memory_verify(link["link_id"])
    assert v["signature_verified"] is False
    assert "row altered" in v["reason"]


async def test_tampered_signature_fails_verification(svc: Service, cfg: NodeConfig) -> None:
    a, b = await _two(svc)
    link = await svc.memory_link(a["id"], b["id"], "related_to")
    tamper(cfg, "UPDATE memory_links SET signature = ? WHERE link_id = ?", (b"\x01" * 64, link["link_id"]))
    assert (await svc.memory_verify(link["link_id"]))["signature_verified"] is False


async def test_broken_chain_names_first_bad_seq(svc: Service, cfg: NodeConfig) -> None:
    a, b = await _two(svc)
    for rel in ("r1", "r2", "r3"):
        await svc.memory_link(a["id"], b["id"], rel)
    tamper(cfg, "UPDATE signed_events SET payload_hash = 'x' WHERE seq = 2", drop_trigger="signed_events_no_update")
    r = await svc.audit_verify()
    assert r["ok"] is False and r["first_bad_seq"] == 2


@pytest.mark.parametrize("kwargs,code", [
    ({"content": ""}, "content_empty"),
    ({"content": "   "}, "content_empty"),
    ({"content": "x" * 70_000}, "too_large"),
    ({"content": "ok", "title": "t" * 600}, "too_large"),
    ({"content": "ok", "namespace": ""}, "bad_input"),
    ({"content": "ok", "tags": "notalist"}, "bad_input"),
    ({"content": "ok", "tags": ["t"] * 40}, "too_large"),
    ({"content": "ok", "priority": 11}, "bad_input"),
    ({"content": "ok", "confidence": 1.5}, "bad_input"),
    ({"content": "ok", "title": "bad\x00title"}, "bad_input"),
])
async def test_bad_memory_input_is_refused_and_stores_nothing(svc: Service, cfg: NodeConfig, kwargs, code) -> None:
    before = _dump(cfg)
    kwargs = dict(kwargs)  # the parameter is shared by both backends' runs
    content = kwargs.pop("content")
    with pytest.raises(ServiceError) as err:
        await svc.memory_store(content, **kwargs)
    assert err.value.code == code
    assert _dump(cfg) == before


async def test_unknown_ids_are_not_found(svc: Service) -> None:
    for call in (svc.memory_get("nope"), svc.memory_verify("00" * 32)):
        with pytest.raises(ServiceError) as err:
            await call
        assert err.value.code == "not_found"


@pytest.mark.parametrize("query", ['"', "*", "AND OR NOT", "NEAR(", "title:x", "a\"b'c", "ünïcödé ✓", "-", "()"])
async def test_hostile_recall_queries_never_raise_sql_errors(svc: Service, query: str) -> None:
    await _two(svc)
    assert isinstance(await svc.memory_recall(query), list)


async def test_data_survives_restart(cfg: NodeConfig) -> None:
    svc = await open_service(cfg, require_identity=True)
    a, b = await _two(svc)
    link = await svc.memory_link(a["id"], b["id"], "related_to")
    await svc.close()
    svc = await open_service(cfg, require_identity=True)
    try:
        assert (await svc.memory_get(a["id"]))["id"] == a["id"]
        assert (await svc.memory_verify(link["link_id"]))["signature_verified"] is True
    finally:
        await svc.close()


async def test_concurrent_stores_all_commit(svc: Service) -> None:
    import asyncio
    ids = await asyncio.gather(*(svc.memory_store(f"note {i}") for i in range(200)))
    assert len({m["id"] for m in ids}) == 200
    assert len(await svc.memory_list(limit=100)) == 100


async def test_store_past_the_database_budget_is_refused_on_each_backend(cfg: NodeConfig) -> None:
    small = dataclasses.replace(cfg, limits=dataclasses.replace(cfg.limits, max_db_bytes=1))
    svc = await open_service(small)
    try:
        assert svc.db.bytes_used() > 1  # measured: the file and WAL, or pg_database_size
        with pytest.raises(ServiceError) as err:
            await svc.memory_store("does not fit")
        assert err.value.code == "storage_full"
        assert (await capabilities(svc, None))["storage"]["bytes"] == svc.db.bytes_used()
        assert await svc.memory_list() == []
    finally:
        await svc.close()


async def test_update_bumps_version_keeps_other_fields_and_refuses_bad_input(svc: Service) -> None:
    a = await svc.memory_store("first text", title="t", tags=["x"])
    b = await svc.memory_update(a["id"], content="second text")
    assert b["version"] == 2 and b["content"] == "second text" and b["title"] == "t" and b["tags"] == ["x"]
    assert b["updated_at"] > a["updated_at"]
    assert [h["id"] for h in await svc.memory_recall("second")] == [a["id"]]
    for kwargs, code in (({}, "bad_input"), ({"content": ""}, "content_empty"), ({"priority": 0}, "bad_input")):
        with pytest.raises(ServiceError) as err:
            await svc.memory_update(a["id"], **kwargs)
        assert err.value.code == code
    with pytest.raises(ServiceError) as err:
        await svc.memory_update("nope", content="x")
    assert err.value.code == "not_found"
    assert (await svc.memory_get(a["id"]))["version"] == 2


async def test_link_many_refuses_links_stored_before_or_earlier_in_the_call_and_chains_each_event(
        svc: Service) -> None:
    a, b = await _two(svc)
    svc.clock = lambda: 1_900_000_000_000  # one ms for all: the same fields make the same link_id
    stored = await svc.memory_link(a["id"], b["id"], "r0")
    out = await svc.memory_link_many([{"src_id": a["id"], "dst_id": b["id"], "relation": r}
                                      for r in ("r0", "r1", "r1", "r2")])
    assert out["made"] == 2 and out["failed"] == 2
    codes = [r.get("error", {}).get("code") for r in out["results"]]
    assert codes == ["duplicate_link", None, "duplicate_link", None]
    assert out["results"][1]["ok"]["relation"] == "r1" and stored["relation"] == "r0"
    await svc.memory_link(b["id"], a["id"], "after the batch")
    audit = await svc.audit_verify()
    assert audit["ok"] is True and audit["checked"] == 2 + 1 + 2 + 1  # two memories, then four links
    assert [(await svc.memory_verify(r["ok"]["link_id"]))["signature_verified"] for r in out["results"]
            if "ok" in r] == [True, True]
