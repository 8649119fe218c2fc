"""transcript.put on a real store: outbound only where the namespace replicates and only to peers that may see
it; inbound verified against the writer's keyring, bounded by the namespace's limits, refused clearly."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mesh import keys, peerkeys
from node import attest
from node.assemble import open_service
from node.attest import TranscriptPayload
from node.config import NamespacePolicy, NodeConfig, PeerConfig
from node.errors import ServiceError
from node.federation import pages
from node.service import now_ms
from storage import outbox, transcripts

PEER, OTHER = "ai:peer-a@lab", "ai:peer-c@lab"
TEXT = "user: où est le café? ☕\nassistant: rue de la Paix 🙂\n"


@pytest.fixture
def fcfg(cfg: NodeConfig) -> NodeConfig:
    base = cfg.transcripts.default
    policies = {"shared": dataclasses.replace(base, enabled=True, replicate=True, max_bytes=4096),
                "local": dataclasses.replace(base, enabled=True)}
    fed = dataclasses.replace(cfg.federation, namespaces={"shared": NamespacePolicy(peers=(PEER,)),
                                                                "theirs": NamespacePolicy(peers=(OTHER,))})
    mesh = dataclasses.replace(cfg.mesh, peers=(PeerConfig(PEER, "https://127.0.0.1:1"),
                                                PeerConfig(OTHER, "https://127.0.0.1:2")))
    return dataclasses.replace(cfg, transcripts=dataclasses.replace(cfg.transcripts, namespaces=policies),
                               federation=fed, mesh=mesh)


@pytest.fixture
def peer_key(fcfg: NodeConfig, tmp_path: Path) -> Ed25519PrivateKey:
    ident = keys.generate_identity(tmp_path / "peer-keys", PEER)
    peerkeys.import_peer(fcfg.peers_dir, ident.pub_path)
    return ident.private_key


@pytest.fixture
async def fsvc(fcfg: NodeConfig):
    s = await open_service(fcfg, require_identity=True)
    yield s
    await s.close()


def _put(key: Ed25519PrivateKey | None, text: str = TEXT, *, namespace: str = "shared", spans: list | None = None,
         signer: str = PEER, raw_bytes: int | None = None, body: bytes | None = None) -> dict:
    frame, size, digest = transcripts.compress(text)
    payload = TranscriptPayload(id=str(uuid.uuid4()), namespace=namespace, agent=PEER, created_at=now_ms(),
                                content_hash=digest, raw_bytes=size if raw_bytes is None else raw_bytes,
                                spans=tuple(tuple(s) for s in spans or ()))
    sig = attest.sign(key, payload) if key else None
    return {"kind": "transcript.put", "transcript": payload.to_dict(), "body": frame if body is None else body,
            "signature": sig, "signed_by": signer if key else None}


async def test_store_replicates_only_where_the_namespace_says_and_only_to_its_peers(fsvc):
    shared = await fsvc.transcripts.store(TEXT, namespace="shared")
    assert shared["replicating_to"] == [PEER]
    local = await fsvc.transcripts.store(TEXT, namespace="local")
    assert "replicating_to" not in local
    assert await fsvc.db.read(outbox.depth) == 1


async def test_a_signed_transcript_from_its_writer_is_stored_peer_attested(fsvc, peer_key):
    mid = (await fsvc.memory_store("m", namespace="shared"))["id"]
    body = _put(peer_key, spans=[[mid, 0, 4]])
    assert (await fsvc.replicator.apply_payload(body, PEER)).changed
    row = await fsvc.db.read(transcripts.get, body["transcript"]["id"])
    assert row is not None and row.attest_level == "peer_attested" and transcripts.decompress(row) == TEXT
    assert (await fsvc.transcripts.replay(mid))["transcripts"][0]["spans"][0]["text"] == "user"
    again = await fsvc.replicator.apply_payload(body, PEER)
    assert again.code is None and not again.changed


@pytest.mark.parametrize(("case", "code"), [
    ("forged", "bad_signature"),
    ("local namespace", "transcripts_disabled"),
    ("namespace the peer may not see", "namespace_not_allowed"),
    ("oversize", "too_large"),
    ("damaged frame", "transcript_corrupt"),
    ("size that does not match", "transcript_corrupt"),
    ("span past the end", "span_out_of_range"),
    ("unknown memory", "unknown_memory"),
])
async def test_bad_inbound_transcripts_are_refused_and_nothing_is_stored(fcfg, peer_key, case, code):
    fcfg = dataclasses.replace(fcfg, federation=dataclasses.replace(fcfg.federation, orphan_hold_s=0.0))
    other = Ed25519PrivateKey.generate()
    frame = transcripts.compress(TEXT)[0]
    body = {
        "forged": lambda: _put(other),
        "local namespace": lambda: _put(peer_key, namespace="local"),
        "namespace the peer may not see": lambda: _put(peer_key, namespace="elsewhere"),
        "oversize": lambda: _put(peer_key, "x" * 5000),
        "damaged frame": lambda: _put(peer_key, body=frame[:-6] + bytes(6)),
        "size that does not match": lambda: _put(peer_key, raw_bytes=len(TEXT.encode()) - 1),
        "span past the end": lambda: _put(peer_key, spans=[[str(uuid.uuid4()), 0, len(TEXT) + 1]]),
        "unknown memory": lambda: _put(peer_key, spans=[[str(uuid.uuid4()), 0, 4]]),
    }[case]()
    if case == "namespace the peer may not see":
        fcfg = dataclasses.replace(fcfg, federation=dataclasses.replace(
            fcfg.federation, namespaces={**fcfg.federation.namespaces, "elsewhere": NamespacePolicy(peers=(OTHER,))}),
            transcripts=dataclasses.replace(fcfg.transcripts, namespaces={
                **fcfg.transcripts.namespaces, "elsewhere": fcfg.transcripts.namespaces["shared"]}))
    fsvc = await open_service(fcfg, require_identity=True)
    try:
        applied = await fsvc.replicator.apply_payload(body, PEER)
        assert applied.code == code
        assert await fsvc.db.read(transcripts.counts) == {"hot": 0, "archived": 0, "links": 0}
    finally:
        await fsvc.close()


async def test_a_transcript_goes_only_where_every_memory_it_cites_may_go(fsvc):
    anywhere = (await fsvc.memory_store("seen by all"))["id"]
    stored = await fsvc.transcripts.store(TEXT, namespace="shared", spans=[{"memory_id": anywhere, "start": 0,
                                                                            "end": 4}])
    assert stored["replicating_to"] == [PEER]
    # PEER may see "shared" but not "theirs": a transcript citing a memory of "theirs" goes nowhere.
    hidden = (await fsvc.memory_store("for the other peer only", namespace="theirs"))["id"]
    stored = await fsvc.transcripts.store(TEXT, namespace="shared", spans=[{"memory_id": hidden, "start": 0,
                                                                            "end": 4}])
    assert "replicating_to" not in stored


async def test_a_replicated_transcript_must_fit_one_message(fcfg):
    small = dataclasses.replace(fcfg, a2a=dataclasses.replace(fcfg.a2a, max_message_bytes=64 * 1024 + 100))
    fsvc = await open_service(small, require_identity=True)
    noise = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1300))  # ~3.9 KB that barely compresses
    try:
        with pytest.raises(ServiceError) as err:
            await fsvc.transcripts.store(noise, namespace="shared")
        assert err.value.code == "too_large" and "a2a.max_message_bytes" in err.value.message
        assert (await fsvc.transcripts.store(noise, namespace="local"))["namespace"] == "local"
    finally:
        await fsvc.close()


async def test_sync_serves_a_replicated_transcript_only_to_peers_that_may_see_it(fsvc):
    shared = await fsvc.transcripts.store(TEXT, namespace="shared")
    await fsvc.transcripts.store(TEXT, namespace="local")
    page = await fsvc.replicator.sync_page(PEER, 0, 100)
    assert [(i["kind"], i["transcript"]["id"]) for i in page["items"]] == [("transcript.put", shared["id"])]
    assert page["items"][0]["body"] == (await fsvc.db.read(transcripts.get, shared["id"])).body
    assert (await fsvc.replicator.sync_page(OTHER, 0, 100))["items"] == []


async def test_a_sync_page_ends_early_once_transcripts_fill_its_byte_budget(fsvc, monkeypatch):
    monkeypatch.setattr(pages, "SYNC_PAGE_TRANSCRIPT_BYTES", 1)
    first = await fsvc.transcripts.store(TEXT, namespace="shared")
    second = await fsvc.transcripts.store(TEXT, namespace="shared")
    page = await fsvc.replicator.sync_page(PEER, 0, 100)
    assert [i["transcript"]["id"] for i in page["items"]] == [first["id"]] and page["more"] is True
    rest = await fsvc.replicator.sync_page(PEER, page["next"], 100)
    assert [i["transcript"]["id"] for i in rest["items"]] == [second["id"]] and rest["more"] is False


async def test_the_permission_gate_refuses_a_peers_transcript_as_it_would_a_memory(fcfg, peer_key):
    fcfg.home.mkdir(parents=True, exist_ok=True)
    fcfg.permissions_path.write_text(f'mode = "enforce"\n[[rules]]\nagent = "{PEER}"\nnamespace = "shared"\n'
                                     'operations = ["store"]\naction = "deny"\n', encoding="utf-8")
    svc = await open_service(fcfg, require_identity=True)
    try:
        applied = await svc.replicator.apply_payload(_put(peer_key), PEER)
        assert applied.code == "permission_denied" and not applied.changed
        assert (await svc.db.read(transcripts.counts))["hot"] == 0
    finally:
        await svc.close()
