"""The sharing list signed with the memory version (docs/protocol.md, "The sharing list and the version step").

Receiving: envelopes built by hand from the protocol document (signed set 2 is canonical CBOR of
``{type: "memory.version.v2", <the 13 fields>, share_with}``), applied to a real store. Sending: what a node queues
and serves to a peer that reads memory.put.v2 and to an older one that does not.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import cbor2
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a import Envelope, decode_frame, new_envelope
from mesh import keys, peerkeys
from node.assemble import open_service
from node.service import Service, now_ms
from storage import changelog, outbox
from tests.node.conftest import AGENT, make_config

ORIGIN = "ai:origin@lab"
RELAY = "ai:relay@lab"
WRITER = "ai:writer@lab"
NEW, OLD = "ai:new@lab", "ai:old@lab"
FIELDS = ("id", "namespace", "title", "content", "tags", "priority", "confidence", "source", "origin", "writer",
          "version", "created_at", "updated_at")


def signed_bytes_v2(m: dict) -> bytes:
    """What a memory.put.v2 signature covers, as docs/protocol.md states it (not the product's helper)."""
    body = {f: m[f] for f in FIELDS} | {"tags": list(m["tags"]), "confidence": float(m["confidence"]),
                                         "share_with": m["share_with"]}
    return cbor2.dumps({"type": "memory.version.v2", **body}, canonical=True)


def signed_bytes_v1(m: dict) -> bytes:
    body = {f: m[f] for f in FIELDS} | {"tags": list(m["tags"]), "confidence": float(m["confidence"])}
    return cbor2.dumps({"type": "memory.version", **body}, canonical=True)


def memory(origin: str = ORIGIN, **over: object) -> dict:
    ts = now_ms()
    m = {"id": str(uuid.uuid4()), "namespace": "team", "title": "", "content": "signed with its list", "tags": [],
         "priority": 5, "confidence": 1.0, "source": "", "origin": origin, "writer": origin, "version": 1,
         "created_at": ts, "updated_at": ts}
    return m | over


def put_v2(m: dict, key: Ed25519PrivateKey, share_with: list[str] | None, tamper: dict | None = None) -> dict:
    """A memory.put.v2 signed by ``key`` over ``share_with``; ``tamper`` changes the record after signing."""
    rec = {**m, "share_with": share_with}
    return {"kind": "memory.put.v2", "memory": {**rec, **(tamper or {})}, "signature": key.sign(signed_bytes_v2(rec)),
            "signed_by": m["writer"]}


@pytest.fixture
async def node(tmp_path: Path):
    """This node (AGENT), trusting ORIGIN, RELAY and WRITER; WRITER may write versions in ``team``."""
    cfg = make_config(tmp_path / "n", federation={"namespaces": {"team": {"peers": [ORIGIN, RELAY, WRITER],
                                                                          "writers": [WRITER]}}})
    keys.generate_identity(cfg.keys_dir, AGENT)
    pk = {}
    for agent in (ORIGIN, RELAY, WRITER):
        ident = keys.generate_identity(tmp_path / f"k-{agent}", agent)
        peerkeys.import_peer(cfg.peers_dir, ident.pub_path)
        pk[agent] = ident.private_key
    svc = await open_service(cfg, require_identity=True)
    yield svc, pk
    await svc.close()


async def apply(svc: Service, sender: str, payload: dict) -> str | None:
    ack = await svc.replicator.apply(new_envelope(sender, [AGENT], payload, now_ms(), 60_000), sender)
    return None if ack.accepted else ack.reason.removeprefix("rejected:")


async def test_a_relay_that_strips_or_alters_the_signed_list_is_refused_and_nothing_is_stored(node) -> None:
    svc, pk = node
    m = memory()
    listed = sorted([ORIGIN, AGENT])
    genuine = put_v2(m, pk[ORIGIN], listed)
    stripped_v1 = {"kind": "memory.put", "memory": {f: m[f] for f in FIELDS}, "signature": genuine["signature"],
                   "signed_by": ORIGIN}
    cases = {
        "list dropped to null": ("bad_signature", put_v2(m, pk[ORIGIN], listed, {"share_with": None})),
        "relay added to the list": ("bad_signature", put_v2(m, pk[ORIGIN], listed,
                                                            {"share_with": sorted([*listed, RELAY])})),
        "list narrowed by the relay": ("bad_signature", put_v2(m, pk[ORIGIN], listed, {"share_with": [ORIGIN]})),
        "sent as an old memory.put without the list": ("bad_signature", stripped_v1),
        "old memory.put with the list beside it": ("share_with_unsigned", {**stripped_v1, "share_with": listed}),
        "signature stripped": ("unverified_relay", {**genuine, "signature": None, "signed_by": None}),
    }
    got = {name: await apply(svc, RELAY, payload) for name, (_, payload) in cases.items()}
    assert got == {name: code for name, (code, _) in cases.items()}
    assert await svc.memory_list(limit=10) == []
    # The genuine relay is stored peer_attested with the origin's list, and re-served to no one outside it.
    assert await apply(svc, RELAY, genuine) is None
    row = await svc.memory_get(m["id"])
    assert (row["share_with"], row["signed_set"], row["attest_level"]) == (listed, 2, "peer_attested")
    assert (await svc.memory_verify(m["id"]))["signature_verified"] is True
    assert (await svc.replicator.sync_page(RELAY, 0, 100))["items"] == []


async def test_the_origin_is_always_a_member_of_its_own_list(node) -> None:
    svc, pk = node
    m = memory()
    assert await apply(svc, ORIGIN, put_v2(m, pk[ORIGIN], [AGENT])) == "share_with_without_origin"
    assert await svc.memory_list(limit=10) == []


async def test_the_origin_may_narrow_or_widen_its_list_and_another_writer_may_change_nothing(node) -> None:
    svc, pk = node
    m = memory()
    wide = sorted([AGENT, ORIGIN, RELAY, WRITER])
    narrow = sorted([AGENT, ORIGIN, WRITER])
    assert await apply(svc, ORIGIN, put_v2(m, pk[ORIGIN], wide)) is None

    def version(n: int, writer: str = ORIGIN) -> dict:
        return {**m, "version": n, "writer": writer, "updated_at": m["updated_at"] + n, "content": f"v{n}"}

    # The origin narrows: the relay is out, and no longer served the memory.
    assert await apply(svc, ORIGIN, put_v2(version(2), pk[ORIGIN], narrow)) is None
    assert (await svc.memory_get(m["id"]))["share_with"] == narrow
    assert (await svc.replicator.sync_page(RELAY, 0, 100))["items"] == []
    # A named writer may write versions but not change the list, either way; carrying it as stored is fine.
    for other in (wide, sorted([ORIGIN, WRITER]), None):
        payload = put_v2(version(3, WRITER), pk[WRITER], other)
        assert await apply(svc, WRITER, payload) == "share_with_changed", other
    assert await apply(svc, WRITER, put_v2(version(3, WRITER), pk[WRITER], narrow)) is None
    # An old-form version (no signed list) may not follow a restricted one, whoever sends it.
    old = version(4)
    assert await apply(svc, ORIGIN, {"kind": "memory.put", "memory": old, "signature": pk[ORIGIN].sign(
        signed_bytes_v1(old)), "signed_by": ORIGIN}) == "share_with_unsigned"
    # The origin widens again, up to lifting the restriction: its signature says so.
    assert await apply(svc, ORIGIN, put_v2(version(5), pk[ORIGIN], wide)) is None
    assert {i["memory"]["version"] for i in (await svc.replicator.sync_page(RELAY, 0, 100))["items"]} == {5}
    assert await apply(svc, ORIGIN, put_v2(version(6), pk[ORIGIN], None)) is None
    row = await svc.memory_get(m["id"])
    assert (row["version"], row["share_with"]) == (6, None)
    # An older version carrying an older list is stale: answered ok and judged by nothing (no dead letter).
    assert await apply(svc, WRITER, put_v2(version(3, WRITER), pk[WRITER], narrow)) is None
    assert (await svc.memory_get(m["id"]))["version"] == 6


async def test_an_older_nodes_unrestricted_memory_put_is_still_taken_and_keeps_verifying(node) -> None:
    svc, pk = node
    m = memory()
    payload = {"kind": "memory.put", "memory": m, "signature": pk[ORIGIN].sign(signed_bytes_v1(m)),
               "signed_by": ORIGIN}
    assert await apply(svc, RELAY, payload) is None
    row = await svc.memory_get(m["id"])
    assert (row["signed_set"], row["share_with"], row["attest_level"]) == (1, None, "peer_attested")
    assert (await svc.memory_verify(m["id"]))["signature_verified"] is True


# ---------------------------------------------------------------- sending: the version step


sender_keys: dict[str, Ed25519PrivateKey] = {}


@pytest.fixture
async def sender(tmp_path: Path):
    """This node with two peers: NEW lists memory.put.v2 in its sync pages, OLD's pages list nothing."""
    cfg = make_config(tmp_path / "s", mesh={"peers": [{"agent_id": NEW, "url": "https://127.0.0.1:1/"},
                                                      {"agent_id": OLD, "url": "https://127.0.0.1:2/"}]},
                      federation={"namespaces": {"secret": {"peers": [NEW, OLD]}}})
    ident = keys.generate_identity(cfg.keys_dir, AGENT)
    new = keys.generate_identity(tmp_path / "k-new", NEW)
    peerkeys.import_peer(cfg.peers_dir, new.pub_path)
    sender_keys[NEW] = new.private_key
    svc = await open_service(cfg, require_identity=True)
    svc.replicator.note_accepts(NEW, ["links.put", "memory.put.v2"])
    svc.replicator.note_accepts(OLD, None)  # an older node's page says nothing
    yield svc, ident.private_key.public_key()
    await svc.close()


async def test_a_process_beside_the_node_queues_the_form_the_node_heard_each_peer_reads(tmp_path: Path) -> None:
    """The CLI (a second service on the node's store) never pulled a page itself: it reads what the node recorded,
    so a restricted memory it writes goes out live to the peer that reads memory.put.v2."""
    cfg = make_config(tmp_path / "b", mesh={"peers": [{"agent_id": NEW, "url": "https://127.0.0.1:1/"}]},
                      federation={"namespaces": {"secret": {"peers": [NEW]}}})
    keys.generate_identity(cfg.keys_dir, AGENT)
    node = await open_service(cfg, require_identity=True)
    try:
        await node.db.write(changelog.set_peer_accepts, NEW, ["links.put", "memory.put.v2"])
        cli = await open_service(cfg, require_identity=True)
        try:
            made = await cli.memory_store("written by the CLI, restricted", namespace="secret")
            assert made["replicating_to"] == [NEW]
            assert [p["kind"] for p in await queued(cli, NEW)] == ["memory.put.v2"]
        finally:
            await cli.close()
    finally:
        await node.close()


async def queued(svc: Service, peer: str) -> list[dict]:
    rows = await svc.db.read(outbox.pending_for_peer, peer, 100)
    envs = [decode_frame(r.envelope, 1 << 20) for r in rows]
    return [e.payload for e in envs if isinstance(e, Envelope)]


async def test_a_restricted_memory_never_reaches_an_older_peer_and_the_sender_says_so_once(sender, caplog) -> None:
    svc, pub = sender
    caplog.set_level(logging.WARNING, "node.federation")
    first = await svc.memory_store("for new and old, restricted", namespace="secret")
    await svc.memory_store("another", namespace="secret")
    assert first["share_with"] == sorted([AGENT, NEW, OLD]) and first["signed_set"] == 2
    assert first["replicating_to"] == [NEW]
    to_new = await queued(svc, NEW)
    assert [p["kind"] for p in to_new] == ["memory.put.v2"] * 2
    put = to_new[0]
    pub.verify(put["signature"], signed_bytes_v2(put["memory"]))
    assert put["memory"]["share_with"] == first["share_with"] and "share_with" not in {*put} - {"memory"}
    assert await queued(svc, OLD) == []
    assert svc.replicator.counters["withheld:peer_must_upgrade"] == 2
    told = [r for r in caplog.records if r.getMessage() == "memory_withheld"]
    assert len(told) == 1 and told[0].ev["peer"] == OLD and told[0].ev["reason"] == "peer_must_upgrade"
    # Pages: the older puller (no accepts in its request) is not served it; an upgraded one is, as v2.
    assert (await svc.replicator.sync_page(OLD, 0, 100, reads=()))["items"] == []
    assert [i["kind"] for i in (await svc.replicator.sync_page(OLD, 0, 100))["items"]] == ["memory.put.v2"] * 2


async def test_an_unrestricted_memory_reaches_an_older_peer_as_memory_put_signed_over_the_old_fields(sender) -> None:
    svc, pub = sender
    mem = await svc.memory_store("for everyone")
    [to_new], [to_old] = await queued(svc, NEW), await queued(svc, OLD)
    assert to_new["kind"] == "memory.put.v2" and to_new["memory"]["share_with"] is None
    pub.verify(to_new["signature"], signed_bytes_v2(to_new["memory"]))
    assert to_old["kind"] == "memory.put" and "share_with" not in to_old and "share_with" not in to_old["memory"]
    pub.verify(to_old["signature"], signed_bytes_v1(to_old["memory"]))
    [item] = (await svc.replicator.sync_page(OLD, 0, 100, reads=()))["items"]
    assert item["kind"] == "memory.put" and item["signature"] == to_old["signature"]
    # What the node stores and verifies is its set-2 signature.
    assert (await svc.memory_verify(mem["id"]))["signature_verified"] is True
    updated = await svc.memory_update(mem["id"], content="edited")
    assert updated["signed_set"] == 2 and (await svc.memory_verify(mem["id"]))["signature_verified"] is True


async def test_another_writers_unrestricted_version_is_withheld_from_an_older_peer(sender) -> None:
    svc, _ = sender
    m = memory(origin=NEW, namespace="default")
    assert await apply(svc, NEW, put_v2(m, sender_keys[NEW], None)) is None
    assert (await svc.memory_get(m["id"]))["attest_level"] == "peer_attested"
    # Only NEW's key can sign the old form of NEW's version: the older peer gets it from NEW, not from here.
    assert (await svc.replicator.sync_page(OLD, 0, 100, reads=()))["items"] == []
    assert svc.replicator.counters["withheld:no_old_form"] == 1
    [item] = (await svc.replicator.sync_page(OLD, 0, 100))["items"]
    assert item["kind"] == "memory.put.v2" and item["signed_by"] == NEW
