"""Inbound federation apply on a real store: verification outcomes, idempotence, ordering, namespaces."""

import asyncio
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a import Envelope, ProtocolError, new_envelope
from mesh import keys, peerkeys
from node import attest
from node.assemble import assemble, open_service, open_store
from node.attest import LinkPayload
from node.config import NodeConfig
from node.errors import ServiceError
from node.mcp.capabilities import capabilities
from node.ratelimit import RateLimiter
from node.service import Service, now_ms
from tests.node.conftest import AGENT, make_config

PEER = "ai:peer-a@lab"
OTHER = "ai:peer-c@lab"


@pytest.fixture
def peer_key(cfg: NodeConfig, tmp_path: Path) -> Ed25519PrivateKey:
    ident = keys.generate_identity(tmp_path / "peer-keys", PEER)
    peerkeys.import_peer(cfg.peers_dir, ident.pub_path)
    return ident.private_key


def _memory(mid: str, origin: str = PEER, namespace: str = "default", version: int = 1, ts: int = 1_000,
            writer: str | None = None) -> dict:
    return {"id": mid, "namespace": namespace, "title": "", "content": f"content of {mid}", "tags": [],
            "priority": 5, "confidence": 1.0, "source": "", "origin": origin, "writer": writer or origin,
            "version": version, "created_at": ts, "updated_at": ts}


def _mput(memory: dict, key: Ed25519PrivateKey | None = None) -> dict:
    """A memory.put body, signed by ``key`` as the memory's writer when given."""
    sig = attest.sign(key, attest.MemoryPayload.from_mapping(memory)) if key else None
    return {"kind": "memory.put", "memory": memory, "signature": sig, "signed_by": memory["writer"] if key else None}


def _env(sender: str, payload: dict) -> Envelope:
    return new_envelope(sender, [AGENT], payload, now_ms(), 60_000)


def _link_put(key: Ed25519PrivateKey | None, src: str, dst: str, observed_by: str = PEER, relation: str = "related_to",
              valid_until: int | None = None, sign_over: LinkPayload | None = None) -> dict:
    payload = LinkPayload(src_id=src, dst_id=dst, relation=relation, observed_by=observed_by,
                          valid_from=now_ms() - 1000, valid_until=valid_until)
    sig = attest.sign(key, sign_over or payload) if key else None
    return {"kind": "link.put", "link": payload.to_dict(), "signature": sig,
            "signed_by": observed_by if key else None}


M1, M2 = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"


async def _frozen_budget(cfg: NodeConfig, peer_rate: RateLimiter) -> Service:
    """A service on ``cfg`` whose peers' request budget is ``peer_rate`` (a test's, on a clock that stands still)."""
    return assemble(await open_store(cfg, require_identity=True), peer_rate=peer_rate).service


async def _seed(svc: Service) -> None:
    for mid in (M1, M2):
        ack = await svc.replicator.apply(_env(PEER, _mput(_memory(mid))), PEER)
        assert ack.accepted


async def test_link_signed_by_known_peer_is_peer_attested(svc: Service, peer_key) -> None:
    await _seed(svc)
    ack = await svc.replicator.apply(_env(PEER, _link_put(peer_key, M1, M2)), PEER)
    assert ack.accepted
    [link] = await svc.links_list()
    assert link["attest_level"] == "peer_attested" and link["received_from"] == PEER
    assert (await svc.memory_verify(link["link_id"]))["signature_verified"] is True


async def test_forged_signature_is_rejected_and_not_stored(svc: Service, peer_key) -> None:
    await _seed(svc)
    ack = await svc.replicator.apply(_env(PEER, _link_put(Ed25519PrivateKey.generate(), M1, M2)), PEER)
    assert ack.reason == "rejected:bad_signature" and ack.permanent
    assert await svc.links_list() == []
    assert svc.replicator.counters["bad_signature"] == 1


async def test_field_tampered_after_signing_is_rejected(svc: Service, peer_key) -> None:
    await _seed(svc)
    genuine = LinkPayload(src_id=M1, dst_id=M2, relation="related_to", observed_by=PEER,
                          valid_from=now_ms() - 1000, valid_until=None)
    tampered = _link_put(peer_key, M1, M2, relation="contradicts", sign_over=genuine)
    tampered["link"]["valid_from"] = genuine.valid_from
    ack = await svc.replicator.apply(_env(PEER, tampered), PEER)
    assert ack.reason == "rejected:bad_signature"
    assert await svc.links_list() == []


async def test_unknown_signer_is_stored_unsigned(svc: Service) -> None:
    await _seed(svc)
    stranger = Ed25519PrivateKey.generate()
    ack = await svc.replicator.apply(_env(PEER, _link_put(stranger, M1, M2)), PEER)
    assert ack.accepted
    [link] = await svc.links_list()
    assert link["attest_level"] == "unsigned"


async def test_links_applied_in_one_turn_share_reads_and_writes_and_each_verifies_alone(svc: Service,
                                                                                         peer_key) -> None:
    await _seed(svc)
    puts = [_link_put(peer_key, M1, M2, relation=f"rel_{i}") for i in range(40)]
    puts[7] = _link_put(Ed25519PrivateKey.generate(), M1, M2, relation="forged")  # in the middle of the burst
    puts.append(dict(puts[0]))  # the same link twice in one burst
    fed = svc.replicator
    jobs_before, runs_before = svc.db.commit_stats[1], (fed.inbound.links.lookups.runs, fed.inbound.links.writes.runs)
    acks = await asyncio.gather(*(fed.apply(_env(PEER, p), PEER) for p in puts))  # as a batch frame's applies
    assert acks[7].reason == "rejected:bad_signature"
    assert all(a.accepted for i, a in enumerate(acks) if i != 7)
    stored = await svc.links_list(limit=100)
    assert len(stored) == 39 and {link["attest_level"] for link in stored} == {"peer_attested"}
    assert "forged" not in {link["relation"] for link in stored}
    for link in stored[:3]:
        assert (await svc.memory_verify(link["link_id"]))["signature_verified"] is True
    assert fed.inbound.links.lookups.runs - runs_before[0] <= 2 and fed.inbound.links.writes.runs - runs_before[1] <= 2
    assert svc.db.commit_stats[1] - jobs_before <= 4, "one writer job per turn, not one per link"
    assert (await svc.audit_verify())["ok"] is True


async def test_unverified_relay_of_another_nodes_link_is_rejected(svc: Service) -> None:
    await _seed(svc)
    ack = await svc.replicator.apply(_env(OTHER, _link_put(None, M1, M2, observed_by=PEER)), OTHER)
    assert ack.reason == "rejected:unverified_relay"


async def test_verified_relay_is_peer_attested_with_relayer_recorded(svc: Service, peer_key) -> None:
    await _seed(svc)
    ack = await svc.replicator.apply(_env(OTHER, _link_put(peer_key, M1, M2)), OTHER)
    assert ack.accepted
    [link] = await svc.links_list()
    assert link["attest_level"] == "peer_attested" and link["received_from"] == OTHER


async def test_expired_link_is_rejected(svc: Service, peer_key) -> None:
    await _seed(svc)
    ack = await svc.replicator.apply(_env(PEER, _link_put(peer_key, M1, M2, valid_until=now_ms() - 500)), PEER)
    assert ack.reason == "rejected:expired_link"


async def test_link_before_its_memories_is_held_then_rejected_retryable(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "h", federation={"orphan_hold_s": 0.2})
    keys.generate_identity(cfg.keys_dir, AGENT)
    svc = await open_service(cfg, require_identity=True)
    try:
        ack = await svc.replicator.apply(_env(PEER, _link_put(None, M1, M2)), PEER)
        assert ack.reason == "rejected:unknown_memory" and not ack.permanent
        assert await svc.links_list() == []
    finally:
        await svc.close()


async def test_replayed_link_put_after_seen_cache_eviction_is_a_no_op(svc: Service, peer_key) -> None:
    await _seed(svc)
    body = _link_put(peer_key, M1, M2)
    for _ in range(3):  # fresh correlation ids: the seen-cache cannot help, storage idempotence must
        assert (await svc.replicator.apply(_env(PEER, body), PEER)).accepted
    assert len(await svc.links_list()) == 1
    assert (await svc.audit_verify())["checked"] == 3  # the two seeded memory versions and the link, once


async def test_memory_put_is_idempotent_and_last_writer_wins(svc: Service) -> None:
    fed = svc.replicator
    await fed.apply(_env(PEER, _mput(_memory(M1, ts=1_000))), PEER)
    await fed.apply(_env(PEER, _mput(_memory(M1, ts=1_000))), PEER)
    newer = {**_memory(M1, version=2, ts=2_000), "content": "newer"}
    await fed.apply(_env(PEER, _mput(newer)), PEER)
    older = {**_memory(M1, version=2, ts=1_500), "content": "older"}
    await fed.apply(_env(PEER, _mput(older)), PEER)
    assert (await svc.memory_get(M1))["content"] == "newer"
    assert len(await svc.memory_list()) == 1


async def test_memory_put_for_namespace_peer_is_not_configured_for_is_rejected(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "ns", federation={"namespaces": {"team/x": {"peers": [OTHER]}}})
    keys.generate_identity(cfg.keys_dir, AGENT)
    svc = await open_service(cfg, require_identity=True)
    try:
        ack = await svc.replicator.apply(
            _env(PEER, _mput(_memory(M1, namespace="team/x"))), PEER)
        assert ack.reason == "rejected:namespace_not_allowed"
        assert await svc.memory_list() == []
    finally:
        await svc.close()


async def test_malformed_payload_is_a_protocol_error(svc: Service) -> None:
    with pytest.raises(ProtocolError):
        await svc.replicator.apply(_env(PEER, {"kind": "memory.put", "memory": {"id": "x"}}), PEER)


async def test_local_writes_enqueue_one_message_per_configured_peer(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "q", mesh={"peers": [{"agent_id": PEER, "url": "https://127.0.0.1:1"},
                                                       {"agent_id": OTHER, "url": "https://127.0.0.1:2"}]})
    keys.generate_identity(cfg.keys_dir, AGENT)
    svc = await open_service(cfg, require_identity=True)
    try:
        a = await svc.memory_store("one")
        b = await svc.memory_store("two")
        link = await svc.memory_link(a["id"], b["id"], "related_to")
        assert a["replicating_to"] == sorted([PEER, OTHER]) and link["replicating_to"] == sorted([PEER, OTHER])
        caps = await capabilities(svc, None)
        assert caps["outbox_depth"] == 6
    finally:
        await svc.close()


async def test_sync_pages_come_out_of_the_peers_request_budget(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "sync", limits={"peer_requests_per_second": 3})
    keys.generate_identity(cfg.keys_dir, AGENT)
    svc = await _frozen_budget(cfg, RateLimiter(3, clock=lambda: 0.0))  # time stands still: no token comes back
    try:
        await svc.memory_store("one")
        await svc.memory_store("two")
        # Three granted, two changes read: the one not used goes back.
        page = await svc.replicator.sync_page(PEER, 0, 100)
        assert len(page["items"]) == 2 and not page["more"]
        # One left: a page of one change, and the peer is told there is more.
        page = await svc.replicator.sync_page(PEER, 0, 100)
        assert len(page["items"]) == 1 and page["more"]
        with pytest.raises(ServiceError) as err:
            await svc.replicator.sync_page(PEER, page["next"], 100)
        assert err.value.code == "rate_limited" and "retry in" in err.value.message
        assert svc.replicator.counters["rejected:rate_limited"] == 1
        assert len((await svc.replicator.sync_page(OTHER, 0, 100))["items"]) == 2  # the budget is per peer
    finally:
        await svc.close()


async def test_sync_page_keeps_a_restricted_namespace_from_other_peers(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "sync", federation={"namespaces": {"team/x": {"peers": [PEER]}}})
    keys.generate_identity(cfg.keys_dir, AGENT)
    svc = await open_service(cfg, require_identity=True)
    try:
        a = await svc.memory_store("secret one", namespace="team/x")
        b = await svc.memory_store("secret two", namespace="team/x")
        await svc.memory_link(a["id"], b["id"], "related_to")
        for peer, expected in ((PEER, 3), (OTHER, 0)):
            page = await svc.replicator.sync_page(peer, 0, 100)
            assert len(page["items"]) == expected, peer
    finally:
        await svc.close()


async def test_a_sync_page_leaves_out_the_writers_the_puller_skips_and_reads_on_past_them(svc: Service) -> None:
    await _seed(svc)  # M1 and M2, written by PEER
    mine = await svc.memory_store("mine")
    # A change recorded before the change log named authors (migration 18): its author is read from its item.
    await svc.db.write(lambda c: c.execute("UPDATE change_log SET author = NULL WHERE ref_id = ?", (M2,)))
    page = await svc.replicator.sync_page(OTHER, 0, 100, [PEER])
    assert [i["memory"]["id"] for i in page["items"]] == [mine["id"]]
    assert page["next"] == page["head"] and not page["more"]
    # A row at a time: M1 is left out in SQL, M2 read and left out, then this node's own.
    got, since = [], 0
    for _ in range(5):
        page = await svc.replicator.sync_page(OTHER, since, 1, [PEER])
        got.append(([i["memory"]["id"] for i in page["items"]], page["next"], page["more"]))
        since = page["next"]
        if not page["more"]:
            break
    head = page["head"]
    assert got == [([], head - 1, True), ([mine["id"]], head, True), ([], head, False)]
    # Nothing skipped: every change, in order.
    page = await svc.replicator.sync_page(OTHER, 0, 100)
    assert [i["memory"]["id"] for i in page["items"]] == [M1, M2, mine["id"]]


async def test_sync_items_that_cannot_be_stored_yet_are_counted_for_retry(svc: Service) -> None:
    orphan = _link_put(None, M1, M2)  # its memories are not here
    outcome = await svc.replicator.apply_sync_items(PEER, [{"seq": 1, **orphan}])
    assert outcome["pending"] == 1


async def test_a_pulled_pages_links_are_applied_as_one_run_each_with_its_own_answer(svc: Service, peer_key) -> None:
    await _seed(svc)
    good = _link_put(peer_key, M1, M2)
    forged = _link_put(peer_key, M2, M1, sign_over=LinkPayload(src_id=M1, dst_id=M1, relation="x", observed_by=PEER,
                                                               valid_from=1, valid_until=None))
    malformed = {"kind": "link.put", "link": {"src_id": M1}, "signature": None, "signed_by": None}
    items = [{"seq": n, **body} for n, body in enumerate((good, forged, malformed), start=1)]
    outcome = await svc.replicator.apply_sync_items(PEER, items)
    # Pulled history that its signer's keys here do not verify may be by a key not given here: parked.
    assert outcome.codes == [None, "unknown_key", "bad_payload"]
    assert dict(outcome) == {"applied": 1, "unknown_key": 1, "bad_payload": 1}
    [link] = await svc.links_list()
    assert link["attest_level"] == "peer_attested" and (link["src_id"], link["dst_id"]) == (M1, M2)
    assert svc.replicator.counters["rejected:unknown_key"] == 1


async def test_a_peer_past_its_request_rate_is_refused_retryably_and_others_are_not(tmp_path: Path) -> None:
    from a2a.envelope import RETRYABLE_REJECT_CODES

    cfg = make_config(tmp_path / "home", limits={"peer_requests_per_second": 3})
    keys.generate_identity(cfg.keys_dir, AGENT)
    s = await open_service(cfg, require_identity=True)
    assert s.replicator.peer_rate is not None and s.replicator.peer_rate.rate == 3
    await s.close()
    s = await _frozen_budget(cfg, RateLimiter(3, clock=lambda: 0.0))  # time stands still: no token comes back
    try:
        ids = [f"{i:08d}-1111-4111-8111-111111111111" for i in range(5)]
        acks = [await s.replicator.apply(_env(PEER, _mput(_memory(mid))), PEER) for mid in ids]
        # A burst of one second's worth passes; what follows at once is refused and can be sent again.
        assert [a.accepted for a in acks[:3]] == [True] * 3
        assert [a.reason for a in acks[3:]] == ["rejected:rate_limited"] * 2
        assert "rate_limited" in RETRYABLE_REJECT_CODES and not any(a.permanent for a in acks[3:])
        assert s.replicator.counters["rejected:rate_limited"] == 2
        assert len(await s.memory_list()) == 3
        other = await s.replicator.apply(_env(OTHER, _mput(_memory(M1, origin=OTHER))), OTHER)
        assert other.accepted  # the budget is per peer
    finally:
        await s.close()


def _links_put(*bodies: dict) -> dict:
    return {"kind": "links.put", "links": [{k: v for k, v in b.items() if k != "kind"} for b in bodies]}


async def test_links_put_applies_each_link_on_its_own_and_a_forged_one_is_refused_alone(svc: Service,
                                                                                        peer_key) -> None:
    await _seed(svc)
    good = [_link_put(peer_key, M1, M2, relation=f"rel_{i}") for i in range(4)]
    forged = _link_put(Ed25519PrivateKey.generate(), M1, M2, relation="forged")
    ack = await svc.replicator.apply(_env(PEER, _links_put(*good[:2], forged, *good[2:])), PEER)
    # One ACK for the envelope: the forged link's permanent code (the sender then resends them one by one)...
    assert ack.reason == "rejected:bad_signature" and ack.permanent
    # ...but every other link was verified on its own and stored.
    stored = {link["relation"]: link for link in await svc.links_list()}
    assert sorted(stored) == [f"rel_{i}" for i in range(4)]
    assert all(link["attest_level"] == "peer_attested" and link["received_from"] == PEER for link in stored.values())
    assert svc.replicator.counters["rejected:bad_signature"] == 1
    # Sent again one per envelope (as the sender does after such an answer): duplicates ACK ok, the forged one alone
    # is refused.
    for body in good:
        assert (await svc.replicator.apply(_env(PEER, body), PEER)).accepted
    assert (await svc.replicator.apply(_env(PEER, forged), PEER)).reason == "rejected:bad_signature"
    assert len(await svc.links_list()) == 4
    # All good: accepted; all duplicates: accepted and nothing more stored.
    assert (await svc.replicator.apply(_env(PEER, _links_put(*good)), PEER)).accepted
    fresh = [_link_put(peer_key, M2, M1, relation=f"back_{i}") for i in range(3)]
    assert (await svc.replicator.apply(_env(PEER, _links_put(*fresh)), PEER)).accepted
    assert len(await svc.links_list()) == 7


async def test_links_put_with_a_link_to_a_missing_memory_answers_retryable(svc: Service, peer_key) -> None:
    await _seed(svc)
    missing = "33333333-3333-4333-8333-333333333333"
    body = _links_put(_link_put(peer_key, M1, M2), _link_put(Ed25519PrivateKey.generate(), M1, M2, relation="x"),
                      _link_put(peer_key, M1, missing))
    ack = await svc.replicator.apply(_env(PEER, body), PEER)
    # A retryable code wins over a permanent one: the sender resends the envelope, the stored link is a duplicate.
    assert ack.reason == "rejected:unknown_memory" and not ack.permanent
    assert [link["dst_id"] for link in await svc.links_list()] == [M2]


async def test_links_put_with_a_bad_item_is_bad_payload_and_stores_nothing(svc: Service, peer_key) -> None:
    await _seed(svc)
    bad = _links_put(_link_put(peer_key, M1, M2), {**_link_put(peer_key, M1, M2), "signed_by": None})
    with pytest.raises(ProtocolError) as info:  # the receiver answers it rejected:bad_payload
        await svc.replicator.apply(_env(PEER, bad), PEER)
    assert info.value.code == "bad_payload" and "payload.links[1]" in info.value.message
    assert await svc.links_list() == []


async def test_signatures_use_the_keyring_as_last_read_but_a_new_or_rotated_key_verifies_at_once(
        svc: Service, cfg: NodeConfig, peer_key, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from node import trust
    stats = []
    real = trust.peerkeys.keyring_stamp
    monkeypatch.setattr(trust.peerkeys, "keyring_stamp", lambda d: stats.append(d) or real(d))
    await _seed(svc)
    body = _links_put(*(_link_put(peer_key, M1, M2, relation=f"r{i}") for i in range(50)))
    stats.clear()
    assert (await svc.replicator.apply(_env(PEER, body), PEER)).accepted
    assert len(stats) <= 2, "the key directories are read at most once for the 50 signatures, not once each"
    # A peer rotates its key: a link signed with the new key verifies at once (a failed verify reads the
    # keyring again before refusing); so does a signer first imported just now.
    rotated = keys.generate_identity(tmp_path / "rotated", PEER, force=True)
    peerkeys.import_peer(cfg.peers_dir, rotated.pub_path)
    ack = await svc.replicator.apply(_env(PEER, _link_put(rotated.private_key, M1, M2, relation="new_key")), PEER)
    assert ack.accepted
    other = keys.generate_identity(tmp_path / "other", OTHER)
    peerkeys.import_peer(cfg.peers_dir, other.pub_path)
    ack = await svc.replicator.apply(_env(PEER, _link_put(other.private_key, M1, M2, observed_by=OTHER)), PEER)
    assert ack.accepted
    levels = {r["relation"]: (r["attest_level"], r["observed_by"]) for r in await svc.links_list()}
    assert levels["new_key"] == ("peer_attested", PEER) and levels["related_to"] == ("peer_attested", OTHER)
    # A forged signature is still refused.
    ack = await svc.replicator.apply(_env(PEER, _link_put(Ed25519PrivateKey.generate(), M1, M2, relation="f")), PEER)
    assert ack.reason == "rejected:bad_signature"


async def test_a_links_put_costs_its_peer_one_message_per_link(cfg: NodeConfig, peer_key) -> None:
    seeding = await open_service(cfg, require_identity=True)
    try:
        await _seed(seeding)
    finally:
        await seeding.close()
    svc = await _frozen_budget(cfg, RateLimiter(3, clock=lambda: 0.0))  # time stands still: no token comes back
    try:
        ack = await svc.replicator.apply(_env(PEER, _links_put(*(_link_put(peer_key, M1, M2, relation=f"r{i}")
                                                                  for i in range(5)))), PEER)
        assert ack.accepted and len(await svc.links_list()) == 5  # let in on one message of budget...
        # ...and charged for five: the peer is in debt, so its next message is refused (retryably).
        ack = await svc.replicator.apply(_env(PEER, _link_put(peer_key, M1, M2, relation="next")), PEER)
        assert ack.reason == "rejected:rate_limited" and not ack.permanent
        ping = _env(OTHER, {"kind": "ping", "sent_at": now_ms()})
        assert (await svc.replicator.apply(ping, OTHER)).accepted  # the budget is per peer
    finally:
        await svc.close()


async def test_apply_now_answers_a_ping_as_apply_does_and_leaves_other_kinds_to_it(tmp_path: Path) -> None:
    """The receiver settles pings with ``apply_now`` (no coroutine): for every ping, good or bad, within the peer's
    rate or past it, it must give what ``apply`` gives (the same ACK or the same ProtocolError, the same counters
    and tokens spent), and leave every other kind to ``apply`` without spending a token."""
    pings = [{"kind": "ping"}, {"kind": "ping", "sent_at": 5}, {"kind": "ping", "sent_at": -1},
             {"kind": "ping", "sent_at": "soon"}, {"kind": "ping", "extra": 1}, {"kind": "ping", "sent_at": True},
             {"kind": "ping"}, {"kind": "ping", "sent_at": 2**62}]
    outcomes = {}
    for way in ("apply", "apply_now"):
        cfg = make_config(tmp_path / way, limits={"peer_requests_per_second": 5})
        keys.generate_identity(cfg.keys_dir, AGENT)
        s = await _frozen_budget(cfg, RateLimiter(5, clock=lambda: 0.0))  # five tokens, none comes back
        try:
            assert s.replicator.apply_now(_env(PEER, _mput(_memory(M1))), PEER) is None
            got = []
            for payload in pings:
                env = new_envelope(PEER, [AGENT], payload, now_ms(), 60_000)
                try:
                    ack = (await s.replicator.apply(env, PEER)) if way == "apply" else s.replicator.apply_now(env, PEER)
                    assert ack is not None
                    got.append((ack.accepted, ack.reason, ack.correlation_id == env.correlation_id, ack.recipient))
                except ProtocolError as e:
                    got.append((e.code, e.message))
            outcomes[way] = (got, dict(s.replicator.counters), s.replicator.peer_rate.refused)
        finally:
            await s.close()
    assert outcomes["apply_now"] == outcomes["apply"]
    got, counters, refused = outcomes["apply"]
    assert got[0] == (True, None, True, AGENT) and refused == 3 and counters["rejected:rate_limited"] == 3
    assert any(len(g) == 2 for g in got[:5])  # some pings were malformed (and still spent their token)


async def test_the_inbound_side_is_built_at_its_first_use_and_a_closed_federation_verifies_nothing(
        tmp_path: Path) -> None:
    # A CLI command never builds the receive path; a peer's first message does, with the same checks.
    cfg = make_config(tmp_path / "h")
    keys.generate_identity(cfg.keys_dir, AGENT)
    store = await open_store(cfg, require_identity=True)
    fed = assemble(store).federation
    try:
        assert "inbound" not in vars(fed) and "verifier" not in vars(fed)
        ack = await fed.apply(_env(PEER, _mput(_memory(M1))), PEER)
        assert ack.accepted and "inbound" in vars(fed) and "verifier" in vars(fed)
    finally:
        fed.close()
        await store.close()
    # Closed before its verifier was ever built: one built now is already shut, as a closed one was.
    unused = assemble(await open_store(cfg, require_identity=True))
    unused.federation.close()
    with pytest.raises(RuntimeError):
        unused.federation.verifier.executor.submit(print)
    await unused.service.close()
