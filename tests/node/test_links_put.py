"""links.put on the sending side: what memory_link_many queues per peer (packed only for a peer that said it
reads links.put), the bounds of one envelope, and the outbox's fallback to one link per envelope over real
mutual-TLS sockets (a peer that does not know the kind, a peer that refuses one link of many)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import cbor2
import pytest

from a2a import Ack, Envelope, ProtocolError, RetrySchedule, decode_frame, new_envelope, validate_payload
from a2a.kinds import LINKS_PUT_MAX_BYTES, LINKS_PUT_MAX_ITEMS
from mesh import keys
from node import attest
from node.assemble import open_service
from node.attest import LinkPayload
from node.federation.outbound import link_chunks
from node.federation.sender import OutboxSender
from node.wire import split_links_put
from storage import Database, outbox
from tests.mesh.wire_fixture import CLIENT_ID, SERVER_ID, make_pki, pair
from tests.node.conftest import AGENT, Acks, make_config

B, C = "ai:b@lab", "ai:c@lab"


@pytest.fixture
async def svc(tmp_path: Path):
    cfg = make_config(tmp_path / "home", mesh={"peers": [{"agent_id": B, "url": "https://127.0.0.1:1/"},
                                                         {"agent_id": C, "url": "https://127.0.0.1:2/"}]})
    keys.generate_identity(cfg.keys_dir, AGENT)
    s = await open_service(cfg, require_identity=True)
    yield s
    await s.close()


async def _queued_links(svc, peer: str) -> list[outbox.OutboxRow]:
    return [r for r in await svc.db.read(outbox.pending_for_peer, peer, 1000) if r.kind != "memory.put"]


def _decoded(row: outbox.OutboxRow) -> Envelope:
    env = decode_frame(row.envelope, 1 << 20)
    assert isinstance(env, Envelope)
    validate_payload(env.payload)
    return env


async def test_memory_link_many_packs_links_for_a_peer_that_reads_links_put_and_not_for_others(svc) -> None:
    svc.replicator.note_accepts(B, ["links.put", "some.future.kind"])
    svc.replicator.note_accepts(C, None)  # an older node's sync page says nothing
    assert svc.replicator.accepts.of(B) == frozenset({"links.put"})
    ids = [(await svc.memory_store(f"memory {i}"))["id"] for i in range(11)]
    out = await svc.memory_link_many([{"src_id": ids[0], "dst_id": ids[i], "relation": "rel"} for i in range(1, 11)])
    assert out["made"] == 10 and out["replicating_to"] == [B, C]
    to_b, to_c = await _queued_links(svc, B), await _queued_links(svc, C)
    assert [r.kind for r in to_b] == ["links.put"] and [r.kind for r in to_c] == ["link.put"] * 10
    env = _decoded(to_b[0])
    assert env.recipients == (B,) and env.sender == AGENT and len(env.payload["links"]) == 10
    # Each link inside carries its own signature over its own canonical bytes, as its link.put to C does.
    key = svc.keyring.keys_for(AGENT)[0]
    singles = {_decoded(r).payload["link"]["dst_id"]: _decoded(r).payload for r in to_c}
    for item in env.payload["links"]:
        payload = LinkPayload.from_mapping(item["link"])
        assert attest.verify(key, payload, item["signature"]) and item["signed_by"] == AGENT
        assert {k: v for k, v in singles[payload.dst_id].items() if k != "kind"} == item


async def test_links_per_envelope_bounds_what_one_links_put_carries(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "home", mesh={"peers": [{"agent_id": B, "url": "https://127.0.0.1:1/"}]},
                      federation={"links_per_envelope": 4})
    keys.generate_identity(cfg.keys_dir, AGENT)
    s = await open_service(cfg, require_identity=True)
    try:
        s.replicator.note_accepts(B, ["links.put"])
        ids = [(await s.memory_store(f"memory {i}"))["id"] for i in range(11)]
        await s.memory_link_many([{"src_id": ids[0], "dst_id": ids[i], "relation": "rel"} for i in range(1, 11)])
        to_b = await _queued_links(s, B)
        # 4 + 4 + 2, in the order made; a run of one would go as a link.put
        assert [(r.kind, len(_decoded(r).payload["links"])) for r in to_b] == [("links.put", n) for n in (4, 4, 2)]
        assert [item["link"]["dst_id"] for r in to_b for item in _decoded(r).payload["links"]] == ids[1:]
    finally:
        await s.close()


async def test_one_link_goes_as_a_link_put_even_to_a_peer_that_reads_links_put(svc) -> None:
    svc.replicator.note_accepts(B, ["links.put"])
    a, b = [(await svc.memory_store(f"m {i}"))["id"] for i in range(2)]
    await svc.memory_link_many([{"src_id": a, "dst_id": b, "relation": "alone"}])
    assert [r.kind for r in await _queued_links(svc, B)] == ["link.put"]


def _body(relation: str) -> dict:
    link = LinkPayload(src_id="s" * 36, dst_id="d" * 36, relation=relation, observed_by=AGENT, valid_from=1,
                       valid_until=None)
    return {"link": link.to_dict(), "signature": b"s" * 64, "signed_by": AGENT}


def test_chunks_stay_within_the_item_and_byte_bounds() -> None:
    assert [len(c) for c in link_chunks([_body("r")] * 250)] == [LINKS_PUT_MAX_ITEMS] * 2 + [50]
    big = [_body("é" * 4000)] * 40  # 8,000 bytes of relation each
    chunks = link_chunks(big)
    assert sum(len(c) for c in chunks) == 40 and [i for c in chunks for i in c] == list(range(40))
    for c in chunks:
        payload = {"kind": "links.put", "links": [big[i] for i in c]}
        assert len(cbor2.dumps(payload)) <= LINKS_PUT_MAX_BYTES
    assert link_chunks([_body("é" * 40_000)]) == [[0]]  # one link past the bound still travels, alone
    assert [len(c) for c in link_chunks([_body("r")] * 60, 25)] == [25, 25, 10]


def test_split_keeps_sender_recipient_and_expiry_and_refuses_other_kinds() -> None:
    env = new_envelope(AGENT, [B], {"kind": "links.put", "links": [_body("a"), _body("b")]}, 1_000, 60_000)
    parts = split_links_put(env.to_wire())
    assert len(parts) == 2 and len({cid for cid, _ in parts} | {env.correlation_id}) == 3
    for (cid, wire), rel in zip(parts, "ab", strict=True):
        one = decode_frame(wire, 1 << 20)
        assert isinstance(one, Envelope) and one.correlation_id == cid and one.kind == "link.put"
        assert (one.sender, one.recipients, one.expires_at) == (AGENT, (B,), 61_000)
        assert one.payload["link"]["relation"] == rel
    with pytest.raises(ProtocolError):
        split_links_put(new_envelope(AGENT, [B], {"kind": "ping"}, 1_000, 60_000).to_wire())


# ---- the outbox over real TLS ---------------------------------------------------------------------------------


async def _deliver_through(tmp_path: Path, apply, links: int) -> tuple[OutboxSender, Database, list[str], list[str]]:
    """Queue one links.put of ``links`` links for the server, run the real sender over a real TLS link until the
    outbox is empty; returns (sender, db, the kinds the server saw, the peers told 'no link batches')."""
    pki = make_pki(tmp_path / "pki")
    seen: list[str] = []

    async def recording(env: Envelope, sender: str):
        seen.append(env.kind)
        return await apply(env, sender)

    db = await Database.open(tmp_path / "memory.db", synchronous="normal")
    now = int(time.time() * 1000)
    env = new_envelope(CLIENT_ID, [SERVER_ID], {"kind": "links.put",
                                                "links": [_body(f"rel_{i}") for i in range(links)]}, now, 60_000)
    await db.write(outbox.enqueue, env.correlation_id, SERVER_ID, "links.put", env.to_wire(), env.expires_at, 0, now)
    listener = Acks()
    refused = listener.refused
    async with pair(pki, recording) as p:
        sender = OutboxSender(db, {SERVER_ID: p.link}, RetrySchedule(), lambda: int(time.time() * 1000), listener)
        task = asyncio.create_task(sender.run())
        try:
            depth: list[int] = [1]

            async def poll() -> None:
                while depth[0]:
                    depth[0] = await db.read(outbox.depth)
                    await asyncio.sleep(0.02)
            await asyncio.wait_for(poll(), 30)
        finally:
            sender.stop()
            await asyncio.wait_for(task, 5)
    return sender, db, seen, refused


async def test_a_peer_that_does_not_know_links_put_gets_each_link_alone(tmp_path: Path) -> None:
    async def older_node(env: Envelope, sender: str):
        if env.kind == "links.put":  # what a node before links.put answers: its kinds table has no such kind
            raise ProtocolError("unknown_kind", "payload.kind 'links.put' is not a known kind")
        return Ack.ok(env.correlation_id, SERVER_ID)

    sender, db, seen, refused = await _deliver_through(tmp_path, older_node, 5)
    try:
        assert seen == ["links.put"] + ["link.put"] * 5
        assert refused == [SERVER_ID] and sender.unpacked == 1
        assert sender.delivered == 5 and await db.read(outbox.dead_letter_count) == 0
    finally:
        await db.close()


async def test_a_link_refused_inside_links_put_is_dead_lettered_alone(tmp_path: Path) -> None:
    stored: set[str] = set()

    async def refuses_rel_2(env: Envelope, sender: str):
        items = env.payload["links"] if env.kind == "links.put" else [env.payload]
        code = None
        for item in items:
            if item["link"]["relation"] == "rel_2":
                code = "bad_signature"
            else:
                stored.add(item["link"]["relation"])
        return Ack.rejected(env.correlation_id, SERVER_ID, code) if code else Ack.ok(env.correlation_id, SERVER_ID)

    sender, db, seen, refused = await _deliver_through(tmp_path, refuses_rel_2, 4)
    try:
        assert seen == ["links.put"] + ["link.put"] * 4 and refused == []
        assert stored == {"rel_0", "rel_1", "rel_3"}
        [dead] = await db.read(outbox.dead_letters)
        assert dead.kind == "link.put" and dead.last_error == "rejected:bad_signature"
        one = decode_frame(dead.envelope, 1 << 20)
        assert isinstance(one, Envelope) and one.payload["link"]["relation"] == "rel_2"
        assert sender.delivered == 3
    finally:
        await db.close()
