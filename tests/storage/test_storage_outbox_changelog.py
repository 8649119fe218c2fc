"""Outbox and dead letters; change log, peer state and counters."""

from __future__ import annotations

import pytest

from storage import Database, StorageError, changelog, outbox


async def _enqueue(db: Database, cid: str, peer: str, next_at: int = 1000) -> int:
    return await db.write(outbox.enqueue, cid, peer, "memory.put", b"\xa1env-" + cid.encode(), 60_000, next_at, 500)


async def test_enqueue_due_and_pending_for_peer(db: Database):
    a = await _enqueue(db, "c1", "ai:b", next_at=1000)
    b = await _enqueue(db, "c1", "ai:c", next_at=3000)
    c = await _enqueue(db, "c2", "ai:b", next_at=2000)
    assert [r.id for r in await db.read(outbox.due, 2000, 10)] == [a, c]
    assert [r.id for r in await db.read(outbox.due, 5000, 1)] == [a]
    assert [r.id for r in await db.read(outbox.pending_for_peer, "ai:b", 10)] == [a, c]
    assert await db.read(outbox.depth) == 3
    assert await db.read(outbox.depth, "ai:c") == 1
    row = await db.read(outbox.get, b)
    assert (row.correlation_id, row.peer, row.envelope, row.attempts, row.last_error) == \
        ("c1", "ai:c", b"\xa1env-c1", 0, None)


async def test_enqueue_same_correlation_and_peer_is_idempotent(db: Database):
    first = await _enqueue(db, "c1", "ai:b")
    assert await _enqueue(db, "c1", "ai:b") == first
    assert await db.read(outbox.depth) == 1


async def test_mark_attempt_then_remove_on_ack(db: Database):
    i = await _enqueue(db, "c1", "ai:b")
    assert await db.write(outbox.mark_attempt, i, 1, 6000, "timeout")
    row = await db.read(outbox.get, i)
    assert (row.attempts, row.next_attempt_at, row.last_error) == (1, 6000, "timeout")
    assert await db.read(outbox.due, 5999, 10) == []
    assert await db.write(outbox.remove, "c1", "ai:b") is True
    assert await db.write(outbox.remove, "c1", "ai:b") is False
    assert await db.write(outbox.mark_attempt, i, 2, 7000, "x") is False
    assert await db.read(outbox.depth) == 0


async def test_remove_many_deletes_only_that_peers_acked_rows(db: Database):
    def fill(conn) -> None:
        for i in range(600):  # past one IN (...) chunk
            for peer in ("ai:b", "ai:c"):
                outbox.enqueue(conn, f"c{i}", peer, "link.put", b"\xa1env", 60_000, 1000, 500)

    await db.write(fill)
    acked = [f"c{i}" for i in range(0, 600, 2)]
    assert await db.write(outbox.remove_many, "ai:b", [*acked, "c0", "unknown"]) == 300
    assert await db.write(outbox.remove_many, "ai:b", acked) == 0  # a late ACK again: nothing left to delete
    assert await db.read(outbox.depth, "ai:b") == 300 and await db.read(outbox.depth, "ai:c") == 600
    left = {r.correlation_id for r in await db.read(outbox.pending_for_peer, "ai:b", 1000)}
    assert left == {f"c{i}" for i in range(1, 600, 2)}


async def test_exhausted_message_moves_to_dead_letters_and_back(db: Database):
    i = await _enqueue(db, "c1", "ai:b")
    await db.write(outbox.mark_attempt, i, 3, 9000, "connection refused")
    dead_id = await db.write(outbox.to_dead_letter, i, "gave up after 3 attempts", 40_000)
    assert dead_id is not None
    assert await db.read(outbox.depth) == 0
    [dead] = await db.read(outbox.dead_letters)
    assert (dead.correlation_id, dead.peer, dead.attempts, dead.last_error, dead.dead_at, dead.envelope) == \
        ("c1", "ai:b", 3, "gave up after 3 attempts", 40_000, b"\xa1env-c1")
    assert await db.read(outbox.dead_letter_count, "ai:b") == 1

    new_id = await db.write(outbox.replay_dead_letter, dead.id, 50_000, 110_000)
    replayed = await db.read(outbox.get, new_id)
    assert (replayed.correlation_id, replayed.attempts, replayed.next_attempt_at, replayed.expires_at) == \
        ("c1", 0, 50_000, 110_000)
    assert await db.read(outbox.dead_letters) == []


async def test_a_dead_letter_id_is_never_given_twice(db: Database):
    """The newest dead letter replayed (or cleared) leaves its id unused: `--replay ID` never names another message."""
    first = [await db.write(outbox.to_dead_letter, await _enqueue(db, f"c{i}", "ai:b"), "x", 1) for i in range(2)]
    await db.write(outbox.replay_dead_letter, first[1], 10, 70)
    third = await db.write(outbox.to_dead_letter, await _enqueue(db, "c2", "ai:b"), "x", 2)
    await db.write(outbox.clear_dead_letters)
    await _enqueue(db, "c3", "ai:b")
    await _enqueue(db, "c4", "ai:c")
    assert await db.write(outbox.dead_letter_peers_except, ["ai:b"], "peer removed", 3) == 1
    assert await db.write(outbox.dead_letter_peers_except, [], "all removed", 4) == 2  # c1 (replayed) and c3
    ids = [d.id for d in await db.read(outbox.dead_letters)]
    assert first == [1, 2] and third == 3 and ids == [4, 5, 6]


async def test_a_replayed_row_says_which_dead_letter_it_came_from(db: Database):
    dead_id = await db.write(outbox.to_dead_letter, await _enqueue(db, "c1", "ai:b"), "x", 1)
    fresh = await db.read(outbox.get, await _enqueue(db, "c2", "ai:b"))
    replayed = await db.read(outbox.get, await db.write(outbox.replay_dead_letter, dead_id, 10, 70))
    assert (fresh.replayed_from, replayed.replayed_from) == (None, dead_id)


async def test_replay_with_a_fresh_envelope_and_correlation_id(db: Database):
    i = await _enqueue(db, "c1", "ai:b")
    dead_id = await db.write(outbox.to_dead_letter, i, "x", 1)
    new_id = await db.write(lambda c: outbox.replay_dead_letter(c, dead_id, 10, 70, envelope=b"new",
                                                                correlation_id="c9"))
    row = await db.read(outbox.get, new_id)
    assert (row.correlation_id, row.envelope) == ("c9", b"new")


async def test_replay_refuses_when_already_queued_and_keeps_the_dead_letter(db: Database):
    i = await _enqueue(db, "c1", "ai:b")
    dead_id = await db.write(outbox.to_dead_letter, i, "x", 1)
    await _enqueue(db, "c1", "ai:b")
    with pytest.raises(StorageError) as err:
        await db.write(outbox.replay_dead_letter, dead_id, 10, 70)
    assert err.value.code == "already_queued"
    assert await db.read(outbox.dead_letter_count) == 1


async def test_replay_of_a_missing_dead_letter_is_not_found(db: Database):
    with pytest.raises(StorageError) as err:
        await db.write(outbox.replay_dead_letter, 42, 10, 70)
    assert err.value.code == "not_found"


async def test_to_dead_letter_of_a_missing_row_returns_none(db: Database):
    assert await db.write(outbox.to_dead_letter, 42, "x", 1) is None


async def test_clear_dead_letters_per_peer(db: Database):
    for cid, peer in [("c1", "ai:b"), ("c2", "ai:b"), ("c3", "ai:c")]:
        await db.write(outbox.to_dead_letter, await _enqueue(db, cid, peer), "x", 1)
    assert await db.write(outbox.clear_dead_letters, "ai:b") == 2
    assert [d.peer for d in await db.read(outbox.dead_letters)] == ["ai:c"]
    assert await db.write(outbox.clear_dead_letters) == 1


async def test_change_log_pages_in_seq_order(db: Database):
    seqs = [await db.write(changelog.append, "memory" if i % 2 else "link", f"ref{i}", 1, 100 + i)
            for i in range(7)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 7
    first = await db.read(changelog.page, 0, 3)
    assert [c.ref_id for c in first] == ["ref0", "ref1", "ref2"]
    rest = await db.read(changelog.page, first[-1].seq, 100)
    assert [c.ref_id for c in rest] == ["ref3", "ref4", "ref5", "ref6"]
    assert await db.read(changelog.last_seq) == seqs[-1]


async def test_change_log_pages_leave_out_the_skipped_authors_and_keep_the_unrecorded(db: Database):
    def fill(conn):
        changelog.append(conn, "memory", "m1", 1, 1, "ai:a")
        changelog.append(conn, "memory", "m2", 1, 2, "ai:b")
        changelog.append(conn, "memory", "m3", 1, 3)  # written before authors were recorded
        changelog.append_many(conn, "link", [("l1", 1, 4), ("l2", 1, 5), ("l3", 1, 6)], ["ai:c", "ai:a", None])
        changelog.append_many(conn, "link", [("l4", 1, 7)])
    await db.write(fill)
    page = await db.read(lambda c: changelog.page(c, 0, 100, skip={"ai:a", "ai:c"}))
    assert [r.ref_id for r in page] == ["m2", "m3", "l3", "l4"]
    assert [r.ref_id for r in await db.read(changelog.page, 0, 100)] == ["m1", "m2", "m3", "l1", "l2", "l3", "l4"]
    # ``upto`` bounds the seqs scanned; the limit the rows returned.
    assert [r.ref_id for r in await db.read(lambda c: changelog.page(c, 0, 100, skip={"ai:b"}, upto=3))] == ["m1", "m3"]
    assert [r.ref_id for r in await db.read(lambda c: changelog.page(c, 1, 2, skip={"ai:b"}))] == ["m3", "l1"]


async def test_change_log_append_many_wants_one_author_per_change(db: Database):
    with pytest.raises(ValueError, match="2 changes and 1 authors"):
        await db.write(changelog.append_many, "link", [("l1", 1, 1), ("l2", 1, 2)], ["ai:a"])
    assert await db.read(changelog.last_seq) == 0


async def test_change_log_rejects_an_unknown_kind(db: Database):
    with pytest.raises(StorageError) as err:
        await db.write(changelog.append, "transcript", "x", 1, 1)
    assert err.value.code == "constraint"


async def test_peer_state_upsert_keeps_unset_fields(db: Database):
    assert await db.read(changelog.get_peer_state, "ai:b") is None
    s = await db.write(lambda c: changelog.set_peer_state(c, "ai:b", last_sync_seq=10))
    assert (s.last_sync_seq, s.last_ack_at) == (10, None)
    s = await db.write(lambda c: changelog.set_peer_state(c, "ai:b", last_ack_at=555))
    assert (s.last_sync_seq, s.last_ack_at) == (10, 555)
    s = await db.write(lambda c: changelog.set_peer_state(c, "ai:b", last_sync_seq=12))
    assert (s.last_sync_seq, s.last_ack_at) == (12, 555)
    assert [p.peer for p in await db.read(changelog.list_peer_states)] == ["ai:b"]


async def test_counters_increment_from_zero(db: Database):
    assert await db.read(changelog.get_counter, "bad_signature") == 0
    assert await db.write(changelog.incr, "bad_signature") == 1
    assert await db.write(changelog.incr, "bad_signature", 4) == 5
    assert await db.read(changelog.all_counters) == {"bad_signature": 5}


async def test_clear_dead_letters_by_kind_and_time_keeps_the_rest(db: Database):
    def setup(conn):
        for i, (kind, dead_at) in enumerate([("memory.put", 10), ("ping", 10), ("link.put", 30)]):
            outbox.enqueue(conn, f"00000000-0000-4000-8000-00000000000{i}", "ai:b", kind, b"x", 100, 0, 0)
            row = outbox.pending_for_peer(conn, "ai:b", 10)[0]
            outbox.to_dead_letter(conn, row.id, "gone", dead_at)

    await db.write(setup)
    assert await db.write(outbox.clear_dead_letters, "ai:b", ("memory.put", "link.put"), 20) == 1
    left = {d.kind for d in await db.read(outbox.dead_letters, "ai:b")}
    assert left == {"ping", "link.put"}


async def test_rows_for_unconfigured_peers_move_to_dead_letters(db: Database):
    def setup(conn):
        for i, peer in enumerate(["ai:b", "ai:gone", "ai:gone"]):
            outbox.enqueue(conn, f"00000000-0000-4000-8000-0000000000a{i}", peer, "ping", b"x", 100, 0, 0)

    await db.write(setup)
    assert await db.write(outbox.dead_letter_peers_except, ["ai:b"], "no peer", 5) == 2
    assert await db.read(outbox.depth) == 1
    assert {d.peer for d in await db.read(outbox.dead_letters)} == {"ai:gone"}


async def test_due_for_peer_leaves_out_the_rows_in_flight(db: Database):
    a = await _enqueue(db, "c1", "ai:b", next_at=1000)
    b = await _enqueue(db, "c2", "ai:b", next_at=1000)
    c = await _enqueue(db, "c3", "ai:b", next_at=1000)
    assert [r.id for r in await db.read(outbox.due_for_peer, "ai:b", 2000, 10, [a, c])] == [b]
    assert [r.id for r in await db.read(outbox.due_for_peer, "ai:b", 2000, 10, [])] == [a, b, c]
    assert await db.read(outbox.due_for_peer, "ai:b", 2000, 10, [a, b, c]) == []
