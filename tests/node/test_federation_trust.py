"""Inbound trust rules on a real store: who may write a memory version, bounds, namespaces, sync parking.

Each refusal leaves the database as it was; the ACK code is the stable one from docs/protocol.md.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a import Envelope, new_envelope
from mesh import keys, peerkeys
from node import attest
from node.assemble import open_service
from node.attest import LinkPayload, MemoryPayload
from node.mcp.capabilities import capabilities
from node.service import Service, now_ms
from storage import changelog
from tests.node.conftest import AGENT, make_config

PEER = "ai:peer-a@lab"
OTHER = "ai:peer-c@lab"
INT64_MAX = 2**63 - 1


def _env(sender: str, payload: dict) -> Envelope:
    return new_envelope(sender, [AGENT], payload, now_ms(), 60_000)


def _memory(origin: str = PEER, writer: str | None = None, **over: object) -> dict:
    ts = now_ms()
    m = {"id": str(uuid.uuid4()), "namespace": "default", "title": "", "content": "peer content", "tags": [],
         "priority": 5, "confidence": 1.0, "source": "", "origin": origin, "writer": writer or origin,
         "version": 1, "created_at": ts, "updated_at": ts}
    m.update(over)
    return m


def _mput(memory: dict, key: Ed25519PrivateKey | None = None, **extra: object) -> dict:
    sig = attest.sign(key, MemoryPayload.from_mapping(memory)) if key else None
    return {"kind": "memory.put", "memory": memory, "signature": sig,
            "signed_by": memory["writer"] if key else None, **extra}


def _mput2(memory: dict, key: Ed25519PrivateKey | None = None, share_with: list[str] | None = None) -> dict:
    """A memory.put.v2: the sharing list inside the record, signed with it (signed set 2)."""
    m = {**memory, "share_with": share_with}
    sig = attest.sign(key, MemoryPayload.from_mapping(m, attest.SIGNED_SET_SHARED)) if key else None
    return {"kind": "memory.put.v2", "memory": m, "signature": sig, "signed_by": memory["writer"] if key else None}


def _link_put(key: Ed25519PrivateKey | None, src: str, dst: str, observed_by: str = PEER, **link_extra: object) -> dict:
    payload = LinkPayload(src_id=src, dst_id=dst, relation="related_to", observed_by=observed_by,
                          valid_from=now_ms() - 1000, valid_until=None)
    return {"kind": "link.put", "link": {**payload.to_dict(), **link_extra},
            "signature": attest.sign(key, payload) if key else None, "signed_by": observed_by if key else None}


@pytest.fixture
def peer_keys(tmp_path: Path, cfg) -> dict[str, Ed25519PrivateKey]:
    out = {}
    for agent in (PEER, OTHER):
        ident = keys.generate_identity(tmp_path / f"keys-{agent}", agent)
        peerkeys.import_peer(cfg.peers_dir, ident.pub_path)
        out[agent] = ident.private_key
    return out


async def _apply(svc: Service, sender: str, payload: dict) -> str | None:
    ack = await svc.replicator.apply(_env(sender, payload), sender)
    return None if ack.accepted else ack.reason.removeprefix("rejected:")


async def _rows(svc: Service) -> list[dict]:
    return await svc.memory_list(limit=100)


async def test_a_peer_cannot_write_a_version_of_anothers_memory(svc: Service, peer_keys) -> None:
    mine = await svc.memory_store("local truth")
    forged = _memory(origin=AGENT, writer=PEER, id=mine["id"], version=2, content="forged")
    assert await _apply(svc, PEER, _mput(forged, peer_keys[PEER])) == "writer_not_allowed"
    as_origin = _memory(origin=PEER, id=mine["id"], version=2, content="claims to be the creator")
    assert await _apply(svc, PEER, _mput(as_origin, peer_keys[PEER])) == "origin_mismatch"
    assert [(r["content"], r["version"]) for r in await _rows(svc)] == [("local truth", 1)]


async def test_a_relay_cannot_pass_off_a_version_signed_by_someone_else(svc: Service, peer_keys) -> None:
    theirs = _memory(origin=OTHER)
    assert await _apply(svc, PEER, _mput(theirs, peer_keys[PEER])) == "bad_signature"  # signed_by OTHER, wrong key
    assert await _apply(svc, PEER, _mput(theirs)) == "unverified_relay"
    assert await _rows(svc) == []
    assert await _apply(svc, PEER, _mput(theirs, peer_keys[OTHER])) is None  # a genuine relay
    [row] = await _rows(svc)
    assert row["attest_level"] == "peer_attested" and row["received_from"] == PEER and row["writer"] == OTHER
    assert (await svc.memory_verify(row["id"]))["signature_verified"] is True


async def test_a_named_writer_may_write_versions(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "w", federation={"namespaces": {"team/x": {"peers": [PEER], "writers": [PEER]}}})
    keys.generate_identity(cfg.keys_dir, AGENT)
    ident = keys.generate_identity(tmp_path / "pk", PEER)
    peerkeys.import_peer(cfg.peers_dir, ident.pub_path)
    svc = await open_service(cfg, require_identity=True)
    try:
        mine = await svc.memory_store("team note", namespace="team/x")
        v2 = _memory(origin=AGENT, writer=PEER, id=mine["id"], namespace="team/x", version=2, content="edited",
                     created_at=mine["created_at"])
        # The origin's list is signed with its version: a named writer carries it as it is.
        assert await _apply(svc, PEER, _mput2(v2, ident.private_key, mine["share_with"])) is None
        assert (await svc.memory_get(mine["id"]))["content"] == "edited"
    finally:
        await svc.close()


@pytest.mark.parametrize(("over", "code"), [
    ({"content": "x" * 200 * 1024}, "too_large"),
    ({"tags": [f"t{i}" for i in range(2000)]}, "too_large"),
    ({"namespace": "n" * 50_000}, "too_large"),
    ({"priority": -2**63}, "bad_input"),
    ({"confidence": 1e308}, "bad_input"),
    ({"content": "   "}, "content_empty"),
    ({"updated_at": INT64_MAX}, "clock_skew"),
    ({"created_at": 10, "updated_at": 5}, "clock_skew"),
    ({"version": INT64_MAX}, "version_out_of_range"),
])
async def test_inbound_versions_are_bounded_like_local_writes(svc: Service, peer_keys, over: dict, code: str) -> None:
    assert await _apply(svc, PEER, _mput(_memory(**over), peer_keys[PEER])) == code
    assert await _rows(svc) == []


async def test_updated_at_far_ahead_cannot_freeze_a_memory(svc: Service, peer_keys) -> None:
    key = peer_keys[PEER]
    theirs = _memory()
    assert await _apply(svc, PEER, _mput(theirs, key)) is None
    ahead = {**theirs, "version": 2, "updated_at": now_ms() + 10 * 365 * 86_400_000, "content": "future"}
    assert await _apply(svc, PEER, _mput(ahead, key)) == "clock_skew"
    honest = {**theirs, "version": 2, "updated_at": now_ms(), "content": "honest next"}
    assert await _apply(svc, PEER, _mput(honest, key)) is None
    assert (await svc.memory_get(theirs["id"]))["content"] == "honest next"


async def test_a_remote_update_never_moves_a_memory_out_of_its_namespace(svc: Service, peer_keys) -> None:
    theirs = _memory(namespace="notes")
    assert await _apply(svc, PEER, _mput(theirs, peer_keys[PEER])) is None
    moved = {**theirs, "version": 2, "namespace": "default"}
    assert await _apply(svc, PEER, _mput(moved, peer_keys[PEER])) == "namespace_mismatch"
    assert (await svc.memory_get(theirs["id"]))["namespace"] == "notes"


async def _restricted(tmp_path: Path) -> tuple[Service, dict[str, Ed25519PrivateKey]]:
    cfg = make_config(tmp_path / "r", federation={"namespaces": {"secret": {"peers": [OTHER]}}})
    keys.generate_identity(cfg.keys_dir, AGENT)
    pk = {}
    for agent in (PEER, OTHER):
        ident = keys.generate_identity(tmp_path / f"k-{agent}", agent)
        peerkeys.import_peer(cfg.peers_dir, ident.pub_path)
        pk[agent] = ident.private_key
    return await open_service(cfg, require_identity=True), pk


async def test_a_restricted_id_looks_absent_to_a_peer_that_may_not_see_it(tmp_path: Path) -> None:
    svc, pk = await _restricted(tmp_path)
    try:
        secret = await svc.memory_store("secret", namespace="secret")
        probe = _memory(origin=PEER, id=secret["id"], content="probe")
        # Answered exactly as for an unknown id (accepted), and nothing changes.
        assert await _apply(svc, PEER, _mput(probe, pk[PEER])) is None
        assert (await svc.memory_get(secret["id"]))["content"] == "secret"
        assert (await svc.memory_get(secret["id"]))["namespace"] == "secret"
        public = await svc.memory_store("public")
        # A link into the restricted namespace is answered as if the memory were missing.
        assert await _apply(svc, PEER, _link_put(pk[PEER], public["id"], secret["id"])) == "unknown_memory"
        assert await svc.links_list() == []
    finally:
        await svc.close()


async def test_sync_serves_a_link_only_where_both_ends_are_visible(tmp_path: Path) -> None:
    svc, _ = await _restricted(tmp_path)
    try:
        public = await svc.memory_store("public")
        secret = await svc.memory_store("secret", namespace="secret")
        link = await svc.memory_link(public["id"], secret["id"], "related_to")
        assert "replicating_to" not in link  # no peer may see both ends (no [[mesh.peers]] here either)
        page = await svc.replicator.sync_page(PEER, 0, 100)
        assert [i["kind"] for i in page["items"]] == ["memory.put.v2"]  # the public memory only
        page = await svc.replicator.sync_page(OTHER, 0, 100)
        assert sorted(i["kind"] for i in page["items"]) == ["link.put", "memory.put.v2", "memory.put.v2"]
    finally:
        await svc.close()


async def test_a_received_restriction_travels_and_is_honoured_when_serving(svc: Service, peer_keys) -> None:
    m = _memory(origin=OTHER, namespace="team/x")
    assert await _apply(svc, OTHER, _mput2(m, peer_keys[OTHER], sorted([OTHER, AGENT]))) is None
    assert (await svc.replicator.sync_page(PEER, 0, 100))["items"] == []
    # A later version in the old form (no signed list) cannot lift it: refused, the list stays.
    v2 = {**m, "version": 2, "content": "v2"}
    assert await _apply(svc, OTHER, _mput(v2, peer_keys[OTHER])) == "share_with_unsigned"
    assert (await svc.memory_get(m["id"]))["share_with"] == sorted([OTHER, AGENT])


async def test_link_confidence_from_a_relay_is_not_stored(svc: Service, peer_keys) -> None:
    a, b = _memory(), _memory()
    for m in (a, b):
        assert await _apply(svc, PEER, _mput(m, peer_keys[PEER])) is None
    relayed = _link_put(peer_keys[PEER], a["id"], b["id"], confidence=0.01)
    assert await _apply(svc, OTHER, relayed) is None
    [row] = await svc.links_list()
    assert row["attest_level"] == "peer_attested" and row["confidence"] is None


async def test_link_confidence_from_its_observer_is_stored(svc: Service, peer_keys) -> None:
    a, b = _memory(), _memory()
    for m in (a, b):
        assert await _apply(svc, PEER, _mput(m, peer_keys[PEER])) is None
    assert await _apply(svc, PEER, _link_put(peer_keys[PEER], a["id"], b["id"], confidence=0.5)) is None
    assert (await svc.links_list())[0]["confidence"] == 0.5


async def test_inbound_memories_are_refused_past_max_db_bytes(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "full", limits={"max_db_bytes": 1})
    keys.generate_identity(cfg.keys_dir, AGENT)
    svc = await open_service(cfg, require_identity=True)
    try:
        ack = await svc.replicator.apply(_env(PEER, _mput(_memory())), PEER)
        assert ack.reason == "rejected:storage_full" and not ack.permanent
        assert await _rows(svc) == []
    finally:
        await svc.close()


async def test_sync_skips_what_the_puller_wrote_or_gets_from_the_writer(svc: Service, peer_keys) -> None:
    for agent in (PEER, OTHER):
        assert await _apply(svc, agent, _mput(_memory(origin=agent), peer_keys[agent])) is None
    mine = await svc.memory_store("local")
    items = (await svc.replicator.sync_page(PEER, 0, 100, [OTHER]))["items"]
    assert [i["memory"]["id"] for i in items] == [mine["id"]]


async def test_an_item_that_never_applies_is_parked_and_the_cursor_moves_on(cfg) -> None:
    # Each round holds the orphan link orphan_hold_s for its memories: short, the rounds are what counts.
    cfg = dataclasses.replace(cfg, federation=dataclasses.replace(cfg.federation, orphan_hold_s=0.05))
    svc = await open_service(cfg, require_identity=True)
    try:
        fed = svc.replicator
        orphan = {"seq": 7, **_link_put(None, str(uuid.uuid4()), str(uuid.uuid4()))}
        later = {"seq": 8, **_mput(_memory())}
        outcome = await fed.apply_sync_items(PEER, [orphan, later])
        assert outcome["pending"] == 1 and outcome["applied"] == 1
        for _ in range(svc.cfg.federation.sync_park_after - 1):
            outcome = await fed.retry_pending(PEER)
        assert outcome["parked"] == 1
        [parked] = await svc.db.read(changelog.parked, PEER)
        assert (parked.seq, parked.code) == (7, "unknown_memory")
        assert (await capabilities(svc, None))["sync_parked"] == 1
        assert (await fed.retry_pending(PEER)) == {}  # parked items are not retried
    finally:
        await svc.close()


async def test_no_ops_are_not_counted_as_applied(svc: Service, peer_keys) -> None:
    item = {"seq": 1, **_mput(_memory(), peer_keys[PEER])}
    assert (await svc.replicator.apply_sync_items(PEER, [item]))["applied"] == 1
    again = await svc.replicator.apply_sync_items(PEER, [item])
    assert again["applied"] == 0 and again["unchanged"] == 1
