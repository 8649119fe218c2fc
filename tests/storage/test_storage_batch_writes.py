"""Review: events.append_many / links.insert_many / changelog.append_many against their one-row forms, on both
backends (the ``db`` fixture), including the writer's savepoints around a failed executemany."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from storage import Database, StorageError, changelog, events, links
from tests.storage.test_storage_links_events import make_link

ITEMS = [
    (f"{i:064x}", f"ai:agent{i % 3}", f"{i + 500:064x}", None if i % 3 == 0 else bytes([i]) * 64, 1_000 + i)
    for i in range(1, 8)
]


async def _all_events(db: Database) -> list[events.EventRow]:
    def read(conn):
        return [events._row(r) for r in conn.execute(f"SELECT {events._COLUMNS} FROM signed_events ORDER BY seq")]
    return await db.read(read)


async def test_append_many_writes_exactly_the_rows_append_writes(db: Database, tmp_path: Path) -> None:
    ref = await Database.open(tmp_path / "ref.db")
    try:
        # A head that is not genesis, of another event type, with link_id None.
        for d in (db, ref):
            await d.write(lambda c: events.append(c, "memory", None, "ai:x", "aa" * 32, b"\x01" * 64, 5))

        def one_by_one(conn):
            last = None
            for it in ITEMS:
                last = events.append(conn, "link", *it, after=last)
            return last
        last_ref = await ref.write(one_by_one)
        last = await db.write(lambda c: events.append_many(c, "link", ITEMS))
        assert last == last_ref
        assert await _all_events(db) == await _all_events(ref)
        assert await db.read(events.verify_chain) == events.ChainReport(True, 1 + len(ITEMS), None, None)
    finally:
        await ref.close()


async def test_append_many_with_the_same_link_twice_in_one_call_is_duplicate_link_and_stores_none(db: Database):
    item = ITEMS[0]
    with pytest.raises(StorageError) as err:
        await db.write(lambda c: events.append_many(c, "link", [item, ITEMS[1], item]))
    assert err.value.code == "duplicate_link"
    assert await db.read(events.verify_chain) == events.ChainReport(True, 0, None, None)


async def test_append_many_after_a_stale_row_fails_on_seq_and_leaves_the_chain_whole(db: Database):
    first = await db.write(lambda c: events.append_many(c, "link", ITEMS[:2]))
    assert first is not None
    stale = await db.read(events.get_by_link, ITEMS[0][0])
    with pytest.raises(StorageError) as err:
        await db.write(lambda c: events.append_many(c, "link", ITEMS[2:4], after=stale))
    assert err.value.code != "duplicate_link"
    assert await db.read(events.verify_chain) == events.ChainReport(True, 2, None, None)


async def test_a_failed_batch_job_is_undone_alone_and_the_jobs_around_it_commit(db: Database):
    """Three jobs in one writer transaction; the middle one's executemany fails part way (a row stored already
    is the third of five): its first rows are rolled back with its savepoint, the others commit, and the
    connection keeps working (on Postgres: the pipeline that executemany opens)."""
    rows = [make_link(i) for i in range(12)]
    await db.write(links.insert_many, [rows[2]])

    def job(batch):
        def write(conn):
            links.insert_many(conn, batch)
            events.append_many(conn, "link", [(r.link_id, r.observed_by, r.link_id, r.signature, r.created_at)
                                              for r in batch])
            changelog.append_many(conn, "link", [(r.link_id, 1, r.created_at) for r in batch])
            return len(batch)
        return write

    before = await db.read(changelog.last_seq)
    got = await asyncio.gather(db.write(job(rows[5:8])), db.write(job(rows[0:5])), db.write(job(rows[8:12])),
                               return_exceptions=True)
    assert got[0] == 3 and got[2] == 4
    assert isinstance(got[1], StorageError) and got[1].code == "duplicate_link"
    stored = await db.read(links.stored_ids, [r.link_id for r in rows])
    assert stored == {r.link_id for r in [rows[2], *rows[5:12]]}
    assert await db.read(events.verify_chain) == events.ChainReport(True, 7, None, None)
    assert [r.ref_id for r in await db.read(changelog.page, before, 100)] == [r.link_id for r in rows[5:12]]
    # and the writer is still usable afterwards
    await db.write(job([rows[0], rows[1]]))
    assert await db.read(events.verify_chain) == events.ChainReport(True, 9, None, None)


async def test_one_row_insert_and_append_keep_their_error_messages(db: Database):
    row = make_link(1)
    await db.write(links.insert, row)
    with pytest.raises(StorageError) as err:
        await db.write(links.insert, row)
    assert err.value.code == "duplicate_link" and row.link_id in err.value.message
    await db.write(lambda c: events.append(c, "link", row.link_id, "ai:a", "b" * 64, None, 1))
    with pytest.raises(StorageError) as err:
        await db.write(lambda c: events.append(c, "link", row.link_id, "ai:a", "b" * 64, None, 2))
    assert err.value.code == "duplicate_link" and row.link_id in err.value.message


async def test_append_returns_the_signature_it_was_given(db: Database):
    sig = bytearray(b"\x02" * 64)
    ev = await db.write(lambda c: events.append(c, "link", "c" * 64, "ai:a", "d" * 64, bytes(sig), 3))
    assert ev.signature == bytes(sig)
    assert await db.read(events.head) == ev


async def test_executemany_of_nothing_and_errors_translate_as_execute_does(db: Database):
    sql = "INSERT INTO change_log (kind, ref_id, version, created_at) VALUES (?,?,?,?)"
    await db.write(lambda c: c.executemany(sql, []))
    await db.write(lambda c: c.executemany(sql, iter([("link", "a%b?", 1, 1)])))  # an iterator; % and ? in a value
    assert [r.ref_id for r in await db.read(changelog.page, 0, 10)] == ["a%b?"]
    await db.write(lambda c: events.append(c, "link", "e" * 64, "ai:a", "f" * 64, None, 1))
    with pytest.raises(StorageError) as many:
        await db.write(lambda c: c.executemany("UPDATE signed_events SET agent_id = ? WHERE seq = ?", [("x", 1)]))
    with pytest.raises(StorageError) as one:
        await db.write(lambda c: c.execute("UPDATE signed_events SET agent_id = ? WHERE seq = ?", ("x", 1)))
    assert many.value.code == one.value.code
    with pytest.raises(StorageError) as many:
        await db.write(lambda c: c.executemany(sql, [("link", None, 1, 1)]))  # NOT NULL
    with pytest.raises(StorageError) as one:
        await db.write(lambda c: c.execute(sql, ("link", None, 1, 1)))
    assert many.value.code == one.value.code
