"""Agents as principals, as a receiving node checks them (docs/protocol.md, "Agents"; docs/security.md, "Agents").

A peer (PEER, a node this node pins) vouches for its agent BOT with a delegation; what BOT signs is verified under
the key that delegation names. Envelopes are built by hand from the protocol document (a delegation is canonical
CBOR of ``{type: "agent.delegation", agent_id, agent_key, issuer, valid_from, valid_until}`` signed by the issuer;
a revocation ``{type: "agent.revocation", delegation_id, agent_id, issuer, revoked_at}``), applied to a real store.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from pathlib import Path

import cbor2
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from a2a import new_envelope
from mesh import keys, peerkeys
from node.agents.acting import acting_as
from node.assemble import open_service
from node.config import NodeConfig
from node.errors import ServiceError
from node.service import Service, now_ms
from tests.node.conftest import AGENT, make_config
from tests.node.test_signed_sharing import memory, put_v2

PEER = "ai:peer@lab"
STRANGER = "ai:stranger@lab"  # a node this node does not pin
BOT, OTHER_BOT = "ai:bot@peer", "ai:other-bot@peer"
DAY = 86_400_000


def raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def delegation(issuer_key: Ed25519PrivateKey, agent: str, agent_key: Ed25519PrivateKey, issuer: str = PEER, *,
               valid_from: int | None = None, valid_until: int | None = None) -> tuple[dict, str]:
    """An agent.delegate payload signed by ``issuer_key``, and the delegation's id (hex SHA-256 of the bytes)."""
    start = now_ms() - DAY if valid_from is None else valid_from
    record = {"agent_id": agent, "agent_key": raw(agent_key), "issuer": issuer, "valid_from": start,
              "valid_until": start + 2 * DAY if valid_until is None else valid_until}
    signed = cbor2.dumps({"type": "agent.delegation", **record}, canonical=True)
    return ({"kind": "agent.delegate", "delegation": record, "signature": issuer_key.sign(signed),
             "signed_by": issuer}, hashlib.sha256(signed).hexdigest())


def revocation(issuer_key: Ed25519PrivateKey, delegation_id: str, agent: str, revoked_at: int) -> dict:
    record = {"delegation_id": delegation_id, "agent_id": agent, "issuer": PEER, "revoked_at": revoked_at}
    signed = cbor2.dumps({"type": "agent.revocation", **record}, canonical=True)
    return {"kind": "agent.revoke", "revocation": record, "signature": issuer_key.sign(signed), "signed_by": PEER}


def agent_memory(agent_key: Ed25519PrivateKey, delegation_id: str, agent: str = BOT, **over: object) -> dict:
    """A memory.put.v2 written and signed by ``agent`` (with ``agent_key``), naming ``delegation_id``."""
    return {**put_v2(memory(origin=agent, **over), agent_key, None), "delegation": delegation_id}


@pytest.fixture
async def node(tmp_path: Path):
    """This node (AGENT), pinning PEER's key; and the keys of PEER, a stranger node and PEER's two agents."""
    cfg = make_config(tmp_path / "n", federation={"orphan_hold_s": 0.2})
    keys.generate_identity(cfg.keys_dir, AGENT)
    peer = keys.generate_identity(tmp_path / "k-peer", PEER)
    peerkeys.import_peer(cfg.peers_dir, peer.pub_path)
    pk = {PEER: peer.private_key, STRANGER: Ed25519PrivateKey.generate(), BOT: Ed25519PrivateKey.generate(),
          OTHER_BOT: Ed25519PrivateKey.generate()}
    svc = await open_service(cfg, require_identity=True)
    yield svc, pk
    await svc.close()


async def apply(svc: Service, payload: dict, sender: str = PEER) -> str | None:
    ack = await svc.replicator.apply(new_envelope(sender, [AGENT], payload, now_ms(), 60_000), sender)
    return None if ack.accepted else ack.reason.removeprefix("rejected:")


async def stored_delegations(svc: Service) -> int:
    return int(await svc.db.read(lambda c: c.execute("SELECT count(*) FROM agent_delegations").fetchone()[0]))


async def test_an_agents_memory_verified_by_its_delegation_is_stored_peer_attested_naming_the_agent(node) -> None:
    svc, pk = node
    vouch, d_id = delegation(pk[PEER], BOT, pk[BOT])
    assert await apply(svc, vouch) is None
    put = agent_memory(pk[BOT], d_id)
    assert await apply(svc, put) is None
    row = await svc.memory_get(put["memory"]["id"])
    assert (row["writer"], row["attest_level"]) == (BOT, "peer_attested")
    assert await stored_delegations(svc) == 1


async def test_forged_mismatched_expired_and_revoked_are_each_refused_with_their_own_code(node) -> None:
    svc, pk = node
    # Forged: a delegation in PEER's name signed by another key; and one by a node this node does not pin.
    forged, _ = delegation(pk[STRANGER], BOT, pk[BOT])
    assert await apply(svc, forged) == "bad_delegation"
    unknown, _ = delegation(pk[STRANGER], BOT, pk[BOT], issuer=STRANGER)
    assert await apply(svc, unknown, sender=STRANGER) == "unknown_issuer"
    # A delegation naming a node (this one) vouches for nothing.
    as_node, _ = delegation(pk[PEER], AGENT, pk[BOT])
    assert await apply(svc, as_node) == "agent_is_node"
    assert await stored_delegations(svc) == 0
    # Genuine delegations of BOT (live), OTHER_BOT (live) and BOT-expired (a window long gone).
    vouch, d_id = delegation(pk[PEER], BOT, pk[BOT])
    other, other_id = delegation(pk[PEER], OTHER_BOT, pk[OTHER_BOT])
    for payload in (vouch, other):
        assert await apply(svc, payload) is None
    # An agent key signing for another agent: OTHER_BOT's key writes as BOT, naming its own delegation, or BOT's.
    assert await apply(svc, agent_memory(pk[OTHER_BOT], other_id, agent=BOT)) == "delegation_mismatch"
    assert await apply(svc, agent_memory(pk[OTHER_BOT], d_id, agent=BOT)) == "bad_signature"
    # Dated outside the window.
    long_ago = now_ms() - 10 * DAY
    assert await apply(svc, agent_memory(pk[BOT], d_id, created_at=long_ago, updated_at=long_ago)) \
        == "delegation_expired"
    # A delegation this node never received: the item waits (retryable), then is refused, nothing stored.
    assert await apply(svc, agent_memory(pk[BOT], "ab" * 32)) == "unknown_delegation"
    # Revoked from now: new writes refused; one dated before the revocation still verifies.
    before = agent_memory(pk[BOT], d_id)
    cut = now_ms() + 1
    assert await apply(svc, revocation(pk[PEER], d_id, BOT, cut)) is None
    later = cut + 5
    assert await apply(svc, agent_memory(pk[BOT], d_id, created_at=later, updated_at=later)) == "delegation_revoked"
    assert await svc.memory_list(limit=10) == []
    assert await apply(svc, before) is None
    assert [m["writer"] for m in await svc.memory_list(limit=10)] == [BOT]
    # A revocation by another node than the issuer is refused.
    wrong = revocation(pk[STRANGER], other_id, OTHER_BOT, cut)
    assert await apply(svc, wrong) == "bad_delegation"


async def test_an_item_that_overtakes_its_delegation_waits_for_it(node) -> None:
    svc, pk = node
    vouch, d_id = delegation(pk[PEER], BOT, pk[BOT])
    put = agent_memory(pk[BOT], d_id)
    # Pulled out of order: parked until the delegation arrives, then applied.
    outcome = await svc.replicator.apply_sync_items(PEER, [{"seq": 2, **put}, {"seq": 1, **vouch}])
    assert outcome["applied"] == 2, outcome
    assert (await svc.memory_get(put["memory"]["id"]))["writer"] == BOT


LOCAL_BOT = "ai:claude-code@laptop"


@pytest.fixture
async def pair(tmp_path: Path, cfg: NodeConfig):
    """This node (AGENT, on each storage backend) with PEER as its peer, and PEER's store pinning AGENT's key."""
    keeps = replace(cfg.transcripts.default, enabled=True, replicate=True)  # transcripts kept and replicated
    cfg = replace(cfg, mesh=make_config(tmp_path, mesh={"peers": [{"agent_id": PEER,
                                                                     "url": "https://127.0.0.1:1/"}]}).mesh,
                  transcripts=replace(cfg.transcripts, default=keeps))
    peer_cfg = replace(make_config(tmp_path / "p"), agent_id=PEER, transcripts=cfg.transcripts)
    keys.generate_identity(peer_cfg.keys_dir, PEER)
    peerkeys.import_peer(peer_cfg.peers_dir, cfg.keys_dir / f"{AGENT}.pub")
    origin = await open_service(cfg, require_identity=True)
    holder = await open_service(peer_cfg, require_identity=True)
    yield origin, holder
    await holder.close()
    await origin.close()


async def test_a_local_agent_signs_with_its_own_key_and_its_peer_verifies_it_by_the_delegation(pair) -> None:
    origin, holder = pair
    principal = await origin.agents.principal(LOCAL_BOT)
    assert principal is not None and principal.agent_id == LOCAL_BOT
    priv = origin.cfg.keys_dir / "agents" / f"{LOCAL_BOT}.priv"
    assert priv.stat().st_mode & 0o777 == 0o600
    with acting_as(principal):
        a = await origin.memory_store("the agent's own", title="a")
        b = await origin.memory_store("and another")
        link = await origin.memory_link(a["id"], b["id"], "related_to")
        said = await origin.transcripts.store("the agent said so, and wrote it down")
    assert said["agent"] == LOCAL_BOT
    mine = await origin.memory_get(a["id"])
    assert (mine["writer"], mine["origin"], mine["attest_level"]) == (LOCAL_BOT, LOCAL_BOT, "self_signed")
    # The delegation travels first, each of the agent's items naming it.
    page = await origin.replicator.sync_page(PEER, 0, 100)
    kinds = [i["kind"] for i in page["items"]]
    assert kinds[0] == "agent.delegate"
    assert sorted(kinds[1:]) == ["link.put", "memory.put.v2", "memory.put.v2", "transcript.put"]
    assert {i["delegation"] for i in page["items"][1:]} == {principal.delegation_id}
    outcome = await holder.replicator.apply_sync_items(AGENT, page["items"])
    assert outcome["applied"] == 5, outcome
    got = await holder.memory_get(a["id"])
    assert (got["writer"], got["attest_level"]) == (LOCAL_BOT, "peer_attested")
    for svc in (origin, holder):
        assert (await svc.memory_verify(a["id"]))["signature_verified"] is True
    links = await holder.links_list()
    assert [(x["observed_by"], x["attest_level"]) for x in links if x["link_id"] == link["link_id"]] \
        == [(LOCAL_BOT, "peer_attested")]
    # Revoked on its node: the revocation replicates; the agent's old items keep verifying there.
    await origin.agents.revoke(LOCAL_BOT)
    assert not priv.exists()
    page = await origin.replicator.sync_page(PEER, page["head"], 100)
    assert [i["kind"] for i in page["items"]] == ["agent.revoke"]
    assert (await holder.replicator.apply_sync_items(AGENT, page["items"]))["applied"] == 1
    assert (await holder.memory_get(a["id"]))["attest_level"] == "peer_attested"
    assert (await holder.memory_verify(link["link_id"]))["signature_verified"] is True
    with pytest.raises(ServiceError) as e:
        await origin.agents.principal(LOCAL_BOT)
    assert e.value.code == "delegation_revoked"


async def test_an_agent_delegated_again_beside_a_running_service_is_taken_up_with_its_new_key(
        tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "n")
    keys.generate_identity(cfg.keys_dir, AGENT)
    running, beside = await open_service(cfg, require_identity=True), await open_service(cfg, require_identity=True)
    try:
        old = await running.agents.principal(LOCAL_BOT)
        await beside.agents.revoke(LOCAL_BOT)
        # Another process's records reach the running service within STAMP_RECHECK_S (polled, bounded).
        assert await until(running, "delegation_revoked")
        new = await beside.agents.delegate_again(LOCAL_BOT)
        assert new is not None
        assert await until(running, new.delegation_id)
        now = await running.agents.principal(LOCAL_BOT)
        assert old is not None and now is not None
        assert now.identity.fingerprint == new.identity.fingerprint != old.identity.fingerprint
        assert now.delegation_id == new.delegation_id
    finally:
        await beside.close()
        await running.close()


async def until(svc: Service, want: str, deadline_s: float = 10.0) -> bool:
    """Ask ``svc`` for LOCAL_BOT until it answers ``want`` (a refusal's code, or the delegation id it runs under);
    bounded."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while loop.time() < end:
        try:
            principal = await svc.agents.principal(LOCAL_BOT)
            got = principal.delegation_id if principal is not None else None
        except ServiceError as e:
            got = e.code
        if got == want:
            return True
        await asyncio.sleep(0.05)
    return False
