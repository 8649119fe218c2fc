"""The knowledge-graph operations through the service on a real SQLite file: walks, paths, timeline,
signed invalidation, bad input."""

from __future__ import annotations

import pytest

from node import attest
from node.attest import InvalidationPayload
from node.config import NodeConfig
from node.errors import ServiceError
from node.kg import shortest_paths
from node.service import Service
from storage.graph import Edge
from tests.kg import corpus
from tests.node.conftest import AGENT, dump_tables


async def _chain(svc: Service, n: int) -> tuple[list[str], list[str]]:
    """n memories linked in a line m0 -> m1 -> ... and back m(n-1) -> m0 (a cycle)."""
    ms = [(await svc.memory_store(f"memory {i}"))["id"] for i in range(n)]
    ls = [(await svc.memory_link(ms[i], ms[(i + 1) % n], "next"))["link_id"] for i in range(n)]
    return ms, ls


def _dump(cfg: NodeConfig) -> list:
    return dump_tables(cfg, ("memories", "memory_links", "link_invalidations", "signed_events"))


async def test_query_follows_a_cycle_once_and_reports_each_path(svc: Service) -> None:
    ms, ls = await _chain(svc, 4)
    r = await svc.kg.query(ms[0], depth=5)
    assert [(n["memory_id"], n["depth"], n["path"]) for n in r["neighbours"]] == [
        (ms[1], 1, ls[:1]), (ms[2], 2, ls[:2]), (ms[3], 3, ls[:3])]
    assert r["truncated"] is False and r["kg_backend"] == f"{svc.cfg.storage.backend}-cte"


async def test_query_limit_says_truncated(svc: Service) -> None:
    ms, _ = await _chain(svc, 5)
    r = await svc.kg.query(ms[0], depth=5, limit=2)
    assert r["count"] == 2 and r["truncated"] is True


async def test_relations_filter_and_as_of(svc: Service) -> None:
    a, b, c = [(await svc.memory_store(f"m{i}"))["id"] for i in range(3)]
    await svc.memory_link(a, b, "supports")
    await svc.memory_link(a, c, "contradicts")
    r = await svc.kg.query(a, depth=1, relations=["supports"])
    assert [n["memory_id"] for n in r["neighbours"]] == [b]
    before = await svc.kg.query(a, depth=1, as_of=1)
    assert before["neighbours"] == []


async def test_find_paths_lists_every_simple_path_shortest_first(svc: Service) -> None:
    a, b, c, d = [(await svc.memory_store(f"m{i}"))["id"] for i in range(4)]
    ab = (await svc.memory_link(a, b, "r"))["link_id"]
    bd = (await svc.memory_link(b, d, "r"))["link_id"]
    ac = (await svc.memory_link(a, c, "r"))["link_id"]
    cb = (await svc.memory_link(c, b, "r"))["link_id"]
    await svc.memory_link(d, a, "r")  # a cycle back to the start
    r = await svc.kg.find_paths(a, d, max_depth=5)
    assert [p["links"] for p in r["paths"]] == [[ab, bd], [ac, cb, bd]]
    assert (await svc.kg.find_paths(a, d, max_depth=1))["paths"] == []
    one = await svc.kg.find_paths(a, d, max_depth=5, limit=1)
    assert one["count"] == 1 and one["truncated"] is True


async def test_invalidation_is_signed_appended_and_ends_the_link(svc: Service, cfg: NodeConfig) -> None:
    ms, ls = await _chain(svc, 3)
    now = svc.clock()
    inv = await svc.kg.invalidate(ls[0])
    payload = InvalidationPayload(link_id=ls[0], observed_by=AGENT, valid_until=inv["valid_until"])
    assert inv["inval_id"] == payload.inval_id and inv["attest_level"] == "self_signed"
    assert attest.verify(svc.identity.public_key, payload, bytes.fromhex(inv["signature"]))
    assert (await svc.kg.query(ms[0], depth=3))["neighbours"] == []
    # the past is still there
    past = await svc.kg.query(ms[0], depth=3, as_of=inv["valid_until"] - 1)
    assert past["count"] == 2 and now <= inv["valid_until"]
    tl = await svc.kg.timeline(ms[0])
    [out] = [x for x in tl["links"] if x["link_id"] == ls[0]]
    assert out["ended_at"] == inv["valid_until"] and out["invalidations"][0]["inval_id"] == inv["inval_id"]
    assert [e["event"] for e in tl["events"] if e["link_id"] == ls[0]] == ["valid_from", "invalidated"]
    # the link itself is untouched: it still verifies
    assert (await svc.memory_verify(ls[0]))["signature_verified"] is True
    assert (await svc.audit_verify())["ok"] is True
    [*_, events] = dump_tables(cfg, ("signed_events",))
    assert events[-1][1] == "link_invalidation"


async def test_invalidating_twice_is_refused_and_stores_nothing(svc: Service, cfg: NodeConfig) -> None:
    _, ls = await _chain(svc, 2)
    await svc.kg.invalidate(ls[0])
    before = _dump(cfg)
    with pytest.raises(ServiceError) as e:
        await svc.kg.invalidate(ls[0])
    assert e.value.code == "already_ended"
    assert _dump(cfg) == before


@pytest.mark.parametrize(("call", "code"), [
    (lambda kg, m: kg.query(m, depth=6), "bad_input"),
    (lambda kg, m: kg.query(m, depth=0), "bad_input"),
    (lambda kg, m: kg.query("00000000-0000-4000-8000-000000000000"), "unknown_memory"),
    (lambda kg, m: kg.query(m, relations="related_to"), "bad_input"),
    (lambda kg, m: kg.query(m, relations=["r"] * 17), "too_large"),
    (lambda kg, m: kg.query(m, as_of=-1), "bad_input"),
    (lambda kg, m: kg.query(m, limit=1001), "bad_input"),
    (lambda kg, m: kg.find_paths(m, m), "bad_input"),
    (lambda kg, m: kg.find_paths(m, "nope", max_depth=2), "unknown_memory"),
    (lambda kg, m: kg.find_paths(m, m, max_depth=6), "bad_input"),
    (lambda kg, m: kg.timeline("nope"), "unknown_memory"),
    (lambda kg, m: kg.invalidate("ab" * 32), "unknown_link"),
    (lambda kg, m: kg.invalidate(""), "bad_input"),
])
async def test_bad_input_is_a_clear_error_and_changes_nothing(svc: Service, cfg: NodeConfig, call, code) -> None:
    ms, _ = await _chain(svc, 2)
    before = _dump(cfg)
    with pytest.raises(ServiceError) as e:
        await call(svc.kg, ms[0])
    assert e.value.code == code and e.value.message
    assert _dump(cfg) == before


async def test_invalidation_before_the_link_began_is_refused(svc: Service) -> None:
    _, ls = await _chain(svc, 2)
    with pytest.raises(ServiceError) as e:
        await svc.kg.invalidate(ls[0], valid_until=1)
    assert e.value.code == "bad_input"


def test_shortest_paths_picks_the_smallest_link_id_among_equal_hops() -> None:
    edges = [Edge("b", "s", "x", "r"), Edge("a", "s", "y", "r"), Edge("c", "y", "z", "r"), Edge("d", "x", "z", "r")]
    got = shortest_paths("s", {"x": 1, "y": 1, "z": 2}, edges)
    assert [e.link_id for e in got["z"]] == ["a", "c"]


async def test_corpus_walks_are_bounded_on_cycles(svc: Service) -> None:
    await svc.db.write(corpus.load)
    ids = corpus.memory_ids()
    r = await svc.kg.query(ids[150], depth=5, as_of=corpus.T0 + 20_000)
    assert 0 < r["count"] <= 100 and len({n["memory_id"] for n in r["neighbours"]}) == r["count"]
    assert all(len(n["path"]) == n["depth"] for n in r["neighbours"])
