"""Recall on Postgres ranks as recall on SQLite: the same memories in both engines, the same queries, the same top
ten with the same bm25 scores (storage/memories.py recall_pg), and the GIN index takes rows without a pending list
(migration 14)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from storage import memories
from storage.backend import open_database
from testbed.bench.storage_bench import Corpus

T0 = 1_700_000_000_000


@pytest.fixture
async def both(tmp_path: Path, pg_dsn: str):
    corpus = Corpus(7, vocab_size=300)
    rows = [corpus.memory(T0 + i) for i in range(1_200)]
    dbs = [await open_database(backend="sqlite", path=tmp_path / "m.db", dsn=""),
           await open_database(backend="postgres", path=Path(), dsn=pg_dsn)]
    for db in dbs:
        await db.write(lambda conn: [memories.insert(conn, r) for r in rows])
    try:
        yield dbs, [corpus.query() for _ in range(60)] + ["zzzunknown " + corpus.query(), "", "!!"]
    finally:
        for db in dbs:
            await db.close()


async def test_postgres_ranks_the_top_ten_as_sqlite_does(both) -> None:
    dbs, queries = both
    for namespace in (None, "work"):
        for q in queries:
            sqlite, pg = [await db.read(memories.recall, q, 10, namespace, memories.DocFreqs()) for db in dbs]
            assert [m.id for m, _ in pg] == [m.id for m, _ in sqlite], q
            assert [s for _, s in pg] == pytest.approx([s for _, s in sqlite], rel=1e-6), q


async def test_a_small_window_ranks_the_same_as_a_full_one(both) -> None:
    dbs, queries = both
    for q in queries[:20]:
        sqlite, pg = [await db.read(lambda conn, q=q: memories.recall(conn, q, 5, None, memories.DocFreqs(),
                                                                      rank_window=40)) for db in dbs]
        assert [m.id for m, _ in pg] == [m.id for m, _ in sqlite], q


async def test_the_gin_index_keeps_no_pending_list(pg_dsn: str) -> None:
    db = await open_database(backend="postgres", path=Path(), dsn=pg_dsn)
    await db.close()
    with psycopg.connect(pg_dsn) as c:
        options = c.execute("SELECT reloptions FROM pg_class WHERE relname = 'memories_fts_gin'").fetchone()
    assert options == (["fastupdate=off"],)


async def test_with_the_planner_statistics_the_ranking_stays_the_same(both, pg_dsn: str) -> None:
    """After ANALYZE the common words' row counts come from pg_stats (an estimate), not from counting them."""
    dbs, queries = both
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("ANALYZE memories")
        tracked = c.execute("SELECT cardinality(most_common_elems::text::text[]) FROM pg_stats "
                            "WHERE tablename = 'memories' AND attname = 'fts'").fetchone()
    assert tracked is not None and tracked[0] > 50
    overlaps = []
    for q in queries:
        sqlite, pg = [await db.read(memories.recall, q, 10, None, memories.DocFreqs()) for db in dbs]
        want = {m.id for m, _ in sqlite}
        overlaps.append(len(want & {m.id for m, _ in pg}) / len(want) if want else float(not pg))
    assert sum(overlaps) / len(overlaps) >= 0.95
