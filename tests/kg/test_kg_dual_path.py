"""Every KG operation at depths 1-5 answers alike on SQLite (CTEs), Postgres (CTEs) and Postgres + AGE
(Cypher), over the fixed corpus of 200 memories and 800 links (cyclic and acyclic parts, invalidations)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.assemble import open_service
from node.config import from_dict
from node.mcp.capabilities import capabilities
from node.service import Service
from storage import changelog, links
from storage.links import LinkRow
from tests.kg import corpus

STARTS = (0, 3, 17, 42, 99, 100, 123, 150, 199)
PAIRS = ((0, 99), (3, 150), (100, 150), (123, 101), (42, 199), (150, 120), (17, 18))
AS_OF = (corpus.T0 + 20_000, corpus.T0 + 6_000)
RELATIONS = (None, ["related_to", "supports"])


async def _open(home: Path, storage: dict) -> Service:
    cfg = from_dict({"agent_id": "ai:dual@lab", "home": str(home), "storage": storage}, env={})
    svc = await open_service(cfg)
    await svc.db.write(corpus.load)
    return svc


def _query_answer(r: dict) -> set:
    return {(n["memory_id"], n["depth"], tuple(n["path"])) for n in r["neighbours"]}


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5])
async def test_every_kg_operation_agrees_across_backends(tmp_path: Path, pg_dsn: str, age_dsn: str,
                                                         depth: int) -> None:
    services = {
        "sqlite-cte": await _open(tmp_path / "lite", {}),
        "postgres-cte": await _open(tmp_path / "pg", {"backend": "postgres", "dsn": pg_dsn}),
        "postgres-age": await _open(tmp_path / "age", {"backend": "postgres", "dsn": age_dsn, "age": "on"}),
    }
    try:
        assert {name: s.kg.backend for name, s in services.items()} == {n: n for n in services}
        ids = corpus.memory_ids()
        for as_of in AS_OF:
            for rels in RELATIONS:
                for i in STARTS:
                    got = {name: _query_answer(await s.kg.query(ids[i], depth=depth, as_of=as_of, relations=rels))
                           for name, s in services.items()}
                    assert got["postgres-cte"] == got["sqlite-cte"], (i, as_of, rels)
                    assert got["postgres-age"] == got["sqlite-cte"], (i, as_of, rels)
                for a, b in PAIRS:
                    got = {name: {tuple(p["links"]) for p in (await s.kg.find_paths(
                        ids[a], ids[b], max_depth=depth, limit=100, as_of=as_of, relations=rels))["paths"]}
                        for name, s in services.items()}
                    assert got["postgres-cte"] == got["sqlite-cte"], (a, b, as_of, rels)
                    assert got["postgres-age"] == got["sqlite-cte"], (a, b, as_of, rels)
        for i in STARTS:
            tl = [await s.kg.timeline(ids[i]) for s in services.values()]
            assert tl[0] == tl[1] == tl[2]
    finally:
        for s in services.values():
            await s.close()


async def test_the_corpus_has_cycles_and_reaches_depth_five(tmp_path: Path) -> None:
    svc = await _open(tmp_path / "lite", {})
    try:
        ids = corpus.memory_ids()
        r = await svc.kg.query(ids[150], depth=5, as_of=corpus.T0 + 20_000)
        assert max(n["depth"] for n in r["neighbours"]) == 5
        back = await svc.kg.find_paths(ids[150], ids[149], max_depth=5, as_of=corpus.T0 + 20_000)
        assert back["count"] > 0  # the ring closes
    finally:
        await svc.close()


async def test_age_graph_follows_service_links_and_invalidations(tmp_path: Path, age_dsn: str) -> None:
    cfg = from_dict({"agent_id": "ai:dual@lab", "home": str(tmp_path),
                     "storage": {"backend": "postgres", "dsn": age_dsn, "age": "auto"}}, env={})
    svc = await open_service(cfg)
    try:
        a, b, c = [(await svc.memory_store(f"m{i}"))["id"] for i in range(3)]
        ab = await svc.memory_link(a, b, "r")
        await svc.memory_link(b, c, "r")
        assert (await capabilities(svc, None))["kg_backend"] == "postgres-age"
        assert (await svc.kg.query(a, depth=2))["count"] == 2
        await svc.kg.invalidate(ab["link_id"])
        assert (await svc.kg.query(a, depth=2))["count"] == 0
        assert (await svc.kg.find_paths(b, c))["count"] == 1
    finally:
        await svc.close()


async def test_a_rolled_back_write_leaves_the_age_graph_unchanged(tmp_path: Path, age_dsn: str) -> None:
    cfg = from_dict({"agent_id": "ai:dual@lab", "home": str(tmp_path),
                     "storage": {"backend": "postgres", "dsn": age_dsn, "age": "on"}}, env={})
    svc = await open_service(cfg)
    try:
        a, b = [(await svc.memory_store(f"m{i}"))["id"] for i in range(2)]
        row = LinkRow(link_id="ab" * 32, src_id=a, dst_id=b, relation="r", observed_by="ai:dual@lab",
                      valid_from=1, attest_level="unsigned", created_at=1)

        def doomed(conn) -> None:
            links.insert(conn, row)
            changelog.append(conn, "link", row.link_id, 1, 1)
            raise RuntimeError("this job fails after writing")

        with pytest.raises(RuntimeError):
            await svc.db.write(doomed)
        await svc.memory_store("a later write commits a batch and runs the graph sync")
        assert (await svc.kg.query(a, depth=1))["count"] == 0
        assert await svc.db.read(lambda c: c.execute("SELECT count(*) FROM am_kg_edge").fetchone()[0]) == 0
    finally:
        await svc.close()


async def test_a_walk_back_to_its_start_is_no_neighbour_on_any_backend(tmp_path: Path, pg_dsn: str,
                                                                      age_dsn: str) -> None:
    """A cycle through the start: the CTEs keep its distance 0, AGE's trails reach it again at depth 3."""
    answers = []
    for name, storage in (("pg", {"backend": "postgres", "dsn": pg_dsn}),
                          ("age", {"backend": "postgres", "dsn": age_dsn, "age": "on"})):
        cfg = from_dict({"agent_id": "ai:dual@lab", "home": str(tmp_path / name), "storage": storage}, env={})
        svc = await open_service(cfg)
        try:
            a, b, c = [(await svc.memory_store(f"m{i}"))["id"] for i in range(3)]
            for src, dst in ((a, b), (b, c), (c, a)):
                await svc.memory_link(src, dst, "r")
            r = await svc.kg.query(a, depth=5)
            answers.append(sorted(n["depth"] for n in r["neighbours"]))
        finally:
            await svc.close()
    assert answers == [[1, 2], [1, 2]]
