"""Links and the append-only, hash-chained signed_events log."""

from __future__ import annotations

import hashlib
import itertools
import sqlite3

import pytest

from storage import Database, StorageError, changelog, events, links
from storage.links import AttestLevel, LinkRow
from tests.storage.storage_helpers import Raw


def make_link(n: int = 0, **over) -> LinkRow:
    fields = dict(link_id=hashlib.sha256(f"link{n}".encode()).hexdigest(), src_id=f"m{n}", dst_id=f"m{n + 1}",
                  relation="supports", observed_by="ai:node-1@lab", valid_from=1_700_000_000_000 + n,
                  created_at=1_700_000_000_000 + n)
    fields.update(over)
    return LinkRow(**fields)


async def test_link_roundtrip_with_all_fields(db: Database):
    link = make_link(valid_until=1_800_000_000_000, confidence=0.5, signature=b"\x01" * 64,
                     attest_level=AttestLevel.PEER_ATTESTED, signed_by="ai:node-2@lab", received_from="ai:node-2@lab")
    await db.write(links.insert, link)
    assert await db.read(links.get, link.link_id) == link
    assert await db.read(links.get, "0" * 64) is None


async def test_duplicate_link_id_is_refused(db: Database):
    await db.write(links.insert, make_link())
    with pytest.raises(StorageError) as err:
        await db.write(links.insert, make_link(relation="other"))
    assert err.value.code == "duplicate_link"


async def test_unknown_attest_level_is_refused_by_the_check_constraint(db: Database):
    with pytest.raises(StorageError) as err:
        await db.write(links.insert, make_link(attest_level="trusted_because_i_said_so"))
    assert err.value.code == "constraint"


async def test_links_list_filter_and_counts(db: Database):
    levels = [AttestLevel.UNSIGNED, AttestLevel.SELF_SIGNED, AttestLevel.SELF_SIGNED, AttestLevel.PEER_ATTESTED]
    for i, level in enumerate(levels):
        await db.write(links.insert, make_link(i, attest_level=level))
    assert await db.read(links.counts_by_attest_level) == {"unsigned": 1, "self_signed": 2, "peer_attested": 1}
    assert [lk.src_id for lk in await db.read(links.list_)] == ["m3", "m2", "m1", "m0"]
    assert [lk.src_id for lk in await db.read(links.list_, "self_signed")] == ["m2", "m1"]
    assert [lk.src_id for lk in await db.read(links.list_, None, 2, 1)] == ["m2", "m1"]
    assert {lk.link_id for lk in await db.read(links.for_memory, "m2")} == {make_link(1).link_id,
                                                                              make_link(2).link_id}


async def test_counts_by_attest_level_lists_every_level_when_empty(db: Database):
    assert await db.read(links.counts_by_attest_level) == {"unsigned": 0, "self_signed": 0, "peer_attested": 0}


async def _append_n(db: Database, n: int) -> list[events.EventRow]:
    out = []
    for i in range(n):
        out.append(await db.write(events.append, "link", f"{i:064x}", "ai:node-1@lab", f"{i + 100:064x}",
                                  bytes([i]) * 64 if i % 2 else None, 1_700_000_000_000 + i))
    return out


async def test_events_chain_from_genesis_and_verify(db: Database):
    rows = await _append_n(db, 5)
    assert rows[0].seq == 1 and rows[0].prev_hash == events.GENESIS_HASH
    for a, b in itertools.pairwise(rows):
        assert b.prev_hash == a.event_hash and b.seq == a.seq + 1
    assert rows[2].event_hash == events.event_hash(rows[1].event_hash, 3, "link", rows[2].link_id, "ai:node-1@lab",
                                                   rows[2].payload_hash, None, rows[2].created_at)
    assert await db.read(events.verify_chain) == events.ChainReport(True, 5, None, None)
    assert await db.read(events.get_by_link, rows[3].link_id) == rows[3]
    assert await db.read(events.head) == rows[-1]


async def test_verify_chain_of_an_empty_log_is_ok(db: Database):
    assert await db.read(events.verify_chain) == events.ChainReport(True, 0, None, None)


async def test_the_same_link_event_cannot_be_appended_twice(db: Database):
    await db.write(events.append, "link", "ab" * 32, "ai:a", "cd" * 32, None, 1)
    with pytest.raises(StorageError) as err:
        await db.write(events.append, "link", "ab" * 32, "ai:a", "cd" * 32, None, 2)
    assert err.value.code == "duplicate_link"
    # Other event types may repeat a link_id (e.g. a later revocation).
    await db.write(events.append, "revoke", "ab" * 32, "ai:a", "ef" * 32, None, 3)
    assert (await db.read(events.verify_chain)).ok


@pytest.mark.parametrize("sql", ["UPDATE signed_events SET payload_hash = 'x' WHERE seq = 1",
                                 "DELETE FROM signed_events WHERE seq = 1",
                                 "DELETE FROM signed_events"])
async def test_raw_update_and_delete_on_signed_events_are_refused(db: Database, sql: str):
    await _append_n(db, 2)
    with pytest.raises(StorageError) as err:
        await db.write(lambda conn: conn.execute(sql))
    assert err.value.code == "append_only"
    raw = Raw(db)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw.execute(sql)
    raw.close()
    assert (await db.read(events.verify_chain)).checked == 2


async def test_tampering_behind_the_triggers_is_named_by_verify_chain(db: Database):
    await _append_n(db, 6)
    raw = Raw(db)
    raw.drop_trigger("signed_events_no_update")
    raw.execute("UPDATE signed_events SET payload_hash = ? WHERE seq = 4", ("f" * 64,))
    raw.close()
    report = await db.read(events.verify_chain)
    assert report.ok is False
    assert report.first_bad_seq == 4
    assert "event_hash" in report.reason


async def test_rehashing_a_tampered_row_breaks_the_next_link(db: Database):
    rows = await _append_n(db, 4)
    r = rows[1]
    forged = events.event_hash(r.prev_hash, r.seq, r.event_type, r.link_id, r.agent_id, "e" * 64, r.signature,
                               r.created_at)
    raw = Raw(db)
    raw.drop_trigger("signed_events_no_update")
    raw.execute("UPDATE signed_events SET payload_hash = ?, event_hash = ? WHERE seq = 2", ("e" * 64, forged))
    raw.close()
    report = await db.read(events.verify_chain)
    assert (report.ok, report.first_bad_seq) == (False, 3)
    assert "prev_hash" in report.reason


async def test_deleting_a_middle_event_is_detected(db: Database):
    await _append_n(db, 4)
    raw = Raw(db)
    raw.drop_trigger("signed_events_no_delete")
    raw.execute("DELETE FROM signed_events WHERE seq = 2")
    raw.close()
    assert (await db.read(events.verify_chain)).first_bad_seq == 3


async def test_stored_ids_names_the_stored_links_among_many(db: Database):
    for i in range(3):
        await db.write(links.insert, make_link(i))
    asked = [make_link(i).link_id for i in range(700)]  # past one IN (...) chunk
    assert await db.read(links.stored_ids, asked + asked[:2]) == {make_link(i).link_id for i in range(3)}
    assert await db.read(links.stored_ids, []) == set()


async def test_append_after_the_event_just_appended_chains_as_a_read_of_the_head(db: Database):
    def batch(conn: sqlite3.Connection) -> list[events.EventRow]:
        out: list[events.EventRow] = []
        for i in range(4):
            out.append(events.append(conn, "link", f"{i + 50:064x}", "ai:a", f"{i + 9:064x}", None, 1 + i,
                                     after=out[-1] if out else None))
        return out

    await _append_n(db, 2)
    rows = await db.write(batch)
    assert [r.seq for r in rows] == [3, 4, 5, 6]
    assert await db.read(events.verify_chain) == events.ChainReport(True, 6, None, None)


async def test_append_after_a_stale_event_fails_and_leaves_the_chain_whole(db: Database):
    first = (await _append_n(db, 2))[0]
    with pytest.raises(StorageError) as err:  # seq 2 is taken: a stale head never forks the chain
        await db.write(lambda conn: events.append(conn, "link", "ee" * 32, "ai:a", "ff" * 32, None, 9, after=first))
    assert err.value.code != "duplicate_link" and "signed_events.seq" in str(err.value)
    assert await db.read(events.verify_chain) == events.ChainReport(True, 2, None, None)


async def test_append_many_chains_each_event_as_append_does(db: Database):
    first = await _append_n(db, 2)
    items = [(f"{i + 70:064x}", "ai:a", f"{i + 7:064x}", bytes([i]) * 64 if i % 2 else None, 10 + i) for i in range(5)]
    last = await db.write(lambda conn: events.append_many(conn, "link", items))
    assert last is not None and last.seq == 7 and last.link_id == items[-1][0]
    assert await db.read(events.head) == last
    assert await db.read(events.verify_chain) == events.ChainReport(True, 7, None, None)
    third = await db.read(events.get_by_link, items[0][0])
    assert third is not None and third.prev_hash == first[-1].event_hash
    assert third.event_hash == events.event_hash(first[-1].event_hash, 3, "link", *items[0])
    # after= saves the read of the head; nothing to append answers it back
    more = await db.write(lambda conn: events.append_many(conn, "link", [("e" * 64, "ai:a", "f" * 64, None, 1)],
                                                          after=last))
    assert more is not None and more.seq == 8 and more.prev_hash == last.event_hash
    assert await db.write(lambda conn: events.append_many(conn, "link", [], after=more)) == more


async def test_append_many_with_a_link_event_stored_already_stores_none_of_them(db: Database):
    await _append_n(db, 2)
    taken = f"{1:064x}"  # the second event's link
    with pytest.raises(StorageError) as err:
        await db.write(lambda conn: events.append_many(conn, "link", [("a" * 64, "ai:a", "b" * 64, None, 1),
                                                                      (taken, "ai:a", "c" * 64, None, 2)]))
    assert err.value.code == "duplicate_link"
    assert await db.read(events.verify_chain) == events.ChainReport(True, 2, None, None)
    assert await db.read(events.get_by_link, "a" * 64) is None


async def test_insert_many_stores_every_row_or_none(db: Database):
    rows = [make_link(i) for i in range(5)]
    await db.write(links.insert_many, rows[:3])
    assert [await db.read(links.get, r.link_id) for r in rows[:3]] == rows[:3]
    for batch in ([rows[3], rows[0]], [rows[3], rows[4], rows[3]]):  # stored already; twice in the batch
        with pytest.raises(StorageError) as err:
            await db.write(links.insert_many, batch)
        assert err.value.code == "duplicate_link"
    assert await db.read(links.stored_ids, [r.link_id for r in rows]) == {r.link_id for r in rows[:3]}
    await db.write(links.insert_many, [])


async def test_changelog_append_many_appends_in_order(db: Database):
    before = await db.read(changelog.last_seq)
    await db.write(changelog.append_many, "link", [("l1", 1, 5), ("l2", 1, 6)])
    await db.write(changelog.append_many, "link", [])
    assert [(r.ref_id, r.created_at) for r in await db.read(changelog.page, before, 10)] == [("l1", 5), ("l2", 6)]
