"""Memories: CRUD, last-writer-wins apply, and FTS recall that never raises for any user string."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import make_memory

from storage import Database, StorageError, memories
from storage.migrations import migrate

HOSTILE = ['"', '""', '"unterminated', "*", "a*", "AND OR NOT", "AND", "NOT x", "NEAR(", "NEAR(a b, 2)",
           "col:", "title:foo", "content:", "{title content}: x", "^start", "(", ")", "a) OR (b", "-", "+",
           "'; DROP TABLE memories; --", "\\", "\x00", "日本語のテキスト", "émigré café", "🙂🙃", "ǅ", "ßtraße",
           "foo_bar", "___", " ", "", "\u0301", "x" * 5000, " ".join(["word"] * 500), "a" * 40 + ":" + "b"]


async def test_insert_get_roundtrip(db: Database):
    row = make_memory(title="t", content="c", tags=("a", "b"), priority=7, confidence=0.25, source="s")
    await db.write(memories.insert, row)
    assert await db.read(memories.get, row.id) == row
    assert await db.read(memories.get, "missing") is None


async def test_duplicate_memory_id_is_refused(db: Database):
    row = make_memory()
    await db.write(memories.insert, row)
    with pytest.raises(StorageError) as err:
        await db.write(memories.insert, row)
    assert err.value.code == "duplicate_memory"


async def test_list_is_newest_first_and_filters_by_namespace(db: Database):
    rows = [make_memory(namespace="a" if i % 2 else "b", content=f"n{i}") for i in range(6)]
    for r in rows:
        await db.write(memories.insert, r)
    assert await db.read(memories.list_) == rows[::-1]
    assert await db.read(memories.list_, "a") == [r for r in rows[::-1] if r.namespace == "a"]
    assert await db.read(memories.list_, None, 2, 1) == rows[::-1][1:3]
    assert await db.read(memories.count) == 6
    assert await db.read(memories.count, "b") == 3


async def test_exists_returns_the_present_subset(db: Database):
    rows = [make_memory() for _ in range(3)]
    for r in rows:
        await db.write(memories.insert, r)
    ids = [r.id for r in rows[:2]] + ["nope"] + [f"x{i}" for i in range(1200)]
    assert await db.read(memories.exists, ids) == {rows[0].id, rows[1].id}


async def test_update_bumps_version_and_reindexes(db: Database):
    row = make_memory(content="apples")
    await db.write(memories.insert, row)
    new = memories.next_version(row, writer="ai:b", updated_at=row.updated_at + 10, content="oranges")
    await db.write(memories.overwrite, new)
    assert new.version == 2 and new.content == "oranges" and new.writer == "ai:b" and new.origin == row.origin
    assert await db.read(memories.get, row.id) == new
    assert await db.read(memories.recall, "apples") == []
    assert [m.id for m, _ in await db.read(memories.recall, "oranges")] == [row.id]


def test_next_version_with_a_clock_behind_still_moves_time_forward():
    row = make_memory()
    new = memories.next_version(row, writer="ai:a", updated_at=row.updated_at - 1000, title="x")
    assert new.updated_at == row.updated_at + 1 and new.version == row.version + 1
    assert memories.lww_key(new) > memories.lww_key(row)


async def test_apply_remote_inserts_an_unknown_memory(db: Database):
    row = make_memory(origin="ai:peer")
    assert await db.write(memories.apply_remote, row) == "inserted"
    assert await db.read(memories.get, row.id) == row


async def test_apply_remote_same_write_twice_is_duplicate(db: Database):
    row = make_memory(origin="ai:peer")
    await db.write(memories.apply_remote, row)
    assert await db.write(memories.apply_remote, row) == "duplicate"


async def test_apply_remote_newer_write_wins(db: Database):
    row = make_memory(origin="ai:a", content="old")
    await db.write(memories.insert, row)
    newer = make_memory(id=row.id, origin="ai:a", writer="ai:b", content="new", version=2, created_at=row.created_at,
                        updated_at=row.updated_at + 1)
    assert await db.write(memories.apply_remote, newer) == "updated"
    assert await db.read(memories.get, row.id) == newer
    assert [m.id for m, _ in await db.read(memories.recall, "new")] == [row.id]


async def test_apply_remote_older_write_is_stale(db: Database):
    row = make_memory(origin="ai:a", content="current", version=5)
    await db.write(memories.insert, row)
    older = make_memory(id=row.id, origin="ai:a", writer="ai:z", content="older", version=4,
                        updated_at=row.updated_at + 1000)
    assert await db.write(memories.apply_remote, older) == "stale"
    assert await db.read(memories.get, row.id) == row


async def test_apply_remote_tie_on_version_and_updated_at_is_broken_by_writer(db: Database):
    row = make_memory(origin="ai:b", content="from b", version=2)
    await db.write(memories.insert, row)
    from_a = make_memory(id=row.id, origin="ai:b", writer="ai:a", content="from a", version=2,
                         updated_at=row.updated_at)
    from_c = make_memory(id=row.id, origin="ai:b", writer="ai:c", content="from c", version=2,
                         updated_at=row.updated_at)
    assert await db.write(memories.apply_remote, from_a) == "stale"
    assert await db.write(memories.apply_remote, from_c) == "updated"
    assert (await db.read(memories.get, row.id)).content == "from c"


async def test_recall_ranks_by_bm25_and_respects_limit(db: Database):
    strong = make_memory(title="zebra", content="zebra zebra stripes")
    weak = make_memory(content="a long text that mentions zebra once among many other words here")
    await db.write(memories.insert, weak)
    await db.write(memories.insert, strong)
    for _ in range(5):
        await db.write(memories.insert, make_memory(content="unrelated"))
    hits = await db.read(memories.recall, "zebra", 10)
    assert [m.id for m, _ in hits] == [strong.id, weak.id]
    assert hits[0][1] > hits[1][1] > 0
    assert len(await db.read(memories.recall, "zebra", 1)) == 1


async def test_recall_ands_tokens_then_falls_back_to_or(db: Database):
    both = make_memory(content="red apple")
    red = make_memory(content="red car")
    await db.write(memories.insert, both)
    await db.write(memories.insert, red)
    assert [m.id for m, _ in await db.read(memories.recall, "red apple")] == [both.id]
    assert {m.id for m, _ in await db.read(memories.recall, "red banana")} == {both.id, red.id}


async def test_broad_queries_rank_only_the_most_recent_matches(db: Database):
    oldest_but_best = make_memory(title="heron heron", content="heron heron heron")
    await db.write(memories.insert, oldest_but_best)
    newer = [make_memory(content=f"heron number {i}") for i in range(4)]
    for r in newer:
        await db.write(memories.insert, r)
    assert (await db.read(memories.recall, "heron", 1))[0][0] == oldest_but_best
    windowed = await db.read(lambda c: memories.recall(c, "heron", 10, rank_window=2))
    assert {m.id for m, _ in windowed} == {newer[2].id, newer[3].id}
    in_ns = await db.read(lambda c: memories.recall(c, "heron", 10, "default", rank_window=3))
    assert {m.id for m, _ in in_ns} == {r.id for r in newer[1:]}


async def test_recall_matches_tags_and_filters_namespace(db: Database):
    a = make_memory(namespace="a", content="x", tags=("kiwi",))
    b = make_memory(namespace="b", content="kiwi")
    await db.write(memories.insert, a)
    await db.write(memories.insert, b)
    assert {m.id for m, _ in await db.read(memories.recall, "kiwi")} == {a.id, b.id}
    assert [m.id for m, _ in await db.read(memories.recall, "kiwi", 10, "a")] == [a.id]


async def test_recall_is_case_and_diacritic_insensitive(db: Database):
    row = make_memory(content="Café Society")
    await db.write(memories.insert, row)
    assert [m.id for m, _ in await db.read(memories.recall, "cafe SOCIETY")] == [row.id]


@pytest.mark.parametrize("query", HOSTILE)
async def test_recall_with_hostile_input_never_raises(db: Database, query: str):
    await db.write(memories.insert, make_memory(content='word AND OR NOT NEAR col: "quoted" * 日本語 café'))
    hits = await db.read(memories.recall, query)
    assert isinstance(hits, list)


async def test_recall_of_an_empty_or_wordless_query_is_empty(db: Database):
    await db.write(memories.insert, make_memory(content="anything"))
    for q in ("", "   ", '"*"', "()", "___", ":-)"):
        assert await db.read(memories.recall, q) == []


def test_fts_tokens_quote_every_word():
    assert memories.fts_tokens('NEAR(a "b" c:') == ['"NEAR"', '"a"', '"b"', '"c"']
    assert memories.fts_tokens("Foo foo FOO bar") == ['"Foo"', '"bar"']
    assert len(memories.fts_tokens(" ".join(f"w{i}" for i in range(100)))) == memories.MAX_QUERY_TOKENS


async def test_rebuild_fts_keeps_recall_working(db: Database):
    row = make_memory(content="rebuild me")
    await db.write(memories.insert, row)
    await db.write(memories.rebuild_fts)
    assert [m.id for m, _ in await db.read(memories.recall, "rebuild")] == [row.id]


@settings(max_examples=300, deadline=None)
@given(query=st.text(max_size=80))
def test_recall_never_raises_for_any_text(recall_conn, query: str):
    assert isinstance(memories.recall(recall_conn, query), list)


@pytest.fixture(scope="module")
def recall_conn(tmp_path_factory):
    conn = sqlite3.connect(tmp_path_factory.mktemp("fuzz") / "fuzz.db", isolation_level=None)
    migrate(conn)
    for i, text in enumerate(['AND OR NOT NEAR "x" * col:', "日本語 café émigré", "plain words here"]):
        memories.insert(conn, make_memory(content=text, title=f"t{i}"))
    yield conn
    conn.close()
