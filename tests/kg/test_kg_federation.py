"""link.invalidate received from a peer: verified like a link, stored once, refused when forged."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a import validate_payload
from mesh import keys, peerkeys
from node import attest
from node.attest import InvalidationPayload
from node.config import NodeConfig
from node.kg import invalidation_wire
from node.service import Service
from storage import graph
from tests.node.test_federation_apply import M1, M2, PEER, _env, _link_put, _seed


@pytest.fixture
def peer_key(cfg: NodeConfig, tmp_path: Path) -> Ed25519PrivateKey:
    ident = keys.generate_identity(tmp_path / "peer-keys", PEER)
    peerkeys.import_peer(cfg.peers_dir, ident.pub_path)
    return ident.private_key


def _invalidate(key: Ed25519PrivateKey | None, link_id: str, valid_until: int, observed_by: str = PEER,
                sign_over: InvalidationPayload | None = None) -> dict:
    payload = InvalidationPayload(link_id=link_id, observed_by=observed_by, valid_until=valid_until)
    sig = attest.sign(key, sign_over or payload) if key else None
    return {"kind": "link.invalidate", "invalidation": payload.to_dict(), "signature": sig,
            "signed_by": observed_by if key else None}


async def _linked(svc: Service, key: Ed25519PrivateKey) -> str:
    await _seed(svc)
    put = _link_put(key, M1, M2)
    assert (await svc.replicator.apply(_env(PEER, put), PEER)).accepted
    return attest.LinkPayload.from_mapping(put["link"]).link_id


async def test_signed_invalidation_from_a_peer_is_peer_attested_and_ends_the_link(svc: Service, peer_key) -> None:
    link_id = await _linked(svc, peer_key)
    end = svc.clock() - 10
    body = _invalidate(peer_key, link_id, end)
    validate_payload(body)
    assert (await svc.replicator.apply(_env(PEER, body), PEER)).accepted
    # the same record again is a no-op
    assert (await svc.replicator.apply(_env(PEER, body), PEER)).accepted
    tl = await svc.kg.timeline(M1)
    [inv] = tl["links"][0]["invalidations"]
    assert inv["attest_level"] == "peer_attested" and inv["valid_until"] == end
    assert (await svc.kg.query(M1, depth=1))["neighbours"] == []
    assert (await svc.audit_verify())["ok"] is True


async def test_forged_invalidation_is_rejected_and_not_stored(svc: Service, peer_key) -> None:
    link_id = await _linked(svc, peer_key)
    other = InvalidationPayload(link_id=link_id, observed_by=PEER, valid_until=1)
    body = _invalidate(peer_key, link_id, svc.clock(), sign_over=other)
    ack = await svc.replicator.apply(_env(PEER, body), PEER)
    assert not ack.accepted and ack.reason == "rejected:bad_signature"
    assert (await svc.kg.query(M1, depth=1))["count"] == 1


async def test_unsigned_relay_of_another_nodes_invalidation_is_refused(svc: Service, peer_key) -> None:
    link_id = await _linked(svc, peer_key)
    body = _invalidate(None, link_id, svc.clock(), observed_by="ai:someone-else@lab")
    ack = await svc.replicator.apply(_env(PEER, body), PEER)
    assert ack.reason == "rejected:unverified_relay"


async def test_invalidation_of_an_unknown_link_is_a_retryable_reject(svc: Service, peer_key) -> None:
    ack = await svc.replicator.apply(_env(PEER, _invalidate(peer_key, "ab" * 32, 5)), PEER)
    assert ack.reason == "rejected:unknown_link"


async def test_local_invalidation_is_served_by_sync_as_its_own_kind(svc: Service, peer_key) -> None:
    link_id = await _linked(svc, peer_key)
    inv = await svc.kg.invalidate(link_id)
    page = await svc.replicator.sync_page(PEER, 0, 100)
    [item] = [i for i in page["items"] if i["kind"] == "link.invalidate"]
    stored = await svc.db.read(graph.get_invalidation, inv["inval_id"])
    assert {k: v for k, v in item.items() if k != "seq"} == {"kind": "link.invalidate", **invalidation_wire(stored)}
    validate_payload({k: v for k, v in item.items() if k != "seq"})


async def test_a_pulled_invalidation_waiting_for_its_link_names_the_link(svc: Service, peer_key) -> None:
    from storage import changelog
    link_id = "ab" * 32
    item = {"seq": 7, **_invalidate(peer_key, link_id, 5)}
    outcome = await svc.replicator.apply_sync_items(PEER, [item])
    assert outcome["pending"] == 1
    [waiting] = await svc.db.read(changelog.pending, PEER, 10)
    assert (waiting.kind, waiting.ref_id, waiting.code) == ("link.invalidate", link_id, "unknown_link")
