"""A late joiner's catch-up over history signed with keys its signer has since rotated away from: such items are
parked as ``unknown_key`` (never skipped past), shown, and applied once the key history is imported; what is
known to be forged stays ``bad_signature``. The decision itself (``node.federation.verify.decide``) with plain
values; the parking and re-verification on a real store."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a import new_envelope
from mesh import keyhistory, keys, peerkeys
from node import attest
from node.assemble import open_service
from node.attest import AttestLevel, LinkPayload, MemoryPayload
from node.config import NodeConfig
from node.federation.codes import RejectCode
from node.federation.sync import PeerSync, PullSettings
from node.federation.verify import SignatureCheck, decide
from node.mcp.capabilities import capabilities
from node.mcp.peers import peer_rows
from node.metrics import NodeMetrics, PeerScrape, Scrape
from node.service import Service, now_ms
from node.trust import SignerHistory
from storage import changelog
from tests.node.conftest import AGENT, make_config
from tests.node.test_peer_sync import PageLink

PEER = "ai:peer-a@lab"
HOUR_MS = 3_600_000
NO_WAIT = PullSettings(page_limit=100, interval_s=60.0, fetch_timeout_s=5.0, rate_wait_s=0.0)
DEADLINE_S = 10.0
POLL_S = 0.05


# ---------------------------------------------------------------- the decision, as plain values

def _check(**over: Any) -> SignatureCheck:
    base = {"verified": False, "signed": True, "known": True, "signer_is_sender": True, "signer_is_self": False,
            "pulled": True, "history": SignerHistory(complete=False, since_ms=1_000), "claimed_at": 500}
    return SignatureCheck(**{**base, **over})


@pytest.mark.parametrize(("over", "verdict"), [
    ({}, RejectCode.UNKNOWN_KEY),  # pulled, older than the key trusted now, history not complete
    ({"pulled": False}, RejectCode.BAD_SIGNATURE),  # sent live by its signer: signed with the key it pins
    ({"claimed_at": 1_000}, RejectCode.BAD_SIGNATURE),  # from the time the current key is trusted: that key's
    ({"history": SignerHistory(complete=True, since_ms=1_000)}, RejectCode.BAD_SIGNATURE),  # every key is here
    ({"history": SignerHistory(complete=False, since_ms=None)}, RejectCode.BAD_SIGNATURE),
    ({"verified": True}, AttestLevel.PEER_ATTESTED),
    ({"verified": True, "signer_is_self": True}, AttestLevel.SELF_SIGNED),  # a restore brings its own back
    ({"known": False}, AttestLevel.UNSIGNED),  # a signer with no key here, sending its own
    ({"known": False, "signer_is_sender": False}, RejectCode.UNVERIFIED_RELAY),
    ({"signed": False, "signer_is_sender": False}, RejectCode.UNVERIFIED_RELAY),
])
def test_a_signature_no_key_here_verifies_is_an_unknown_key_only_for_older_pulled_history(over, verdict) -> None:
    assert decide(_check(**over)) == verdict


# ---------------------------------------------------------------- a peer that rotated, seen by a late joiner

class Rotated:
    """PEER's keys: it signed history with ``old`` an hour ago, then rotated to its current key; the node under
    test was given only the current .pub (it joined after the rotation)."""

    def __init__(self, tmp_path: Path, cfg: NodeConfig) -> None:
        self.keys_dir = tmp_path / "peer-keys"
        first = keys.generate_identity(self.keys_dir, PEER)
        self.old = first.private_key
        self.then = now_ms() - HOUR_MS
        os.utime(first.pub_path, ns=(self.then * 1_000_000 - 1, self.then * 1_000_000 - 1))  # made just before
        self.current, _ = keyhistory.rotate(self.keys_dir, PEER, now_ms() - HOUR_MS // 2)
        peerkeys.import_peer(cfg.peers_dir, self.current.pub_path)
        self.cfg = cfg

    def import_history(self) -> keyhistory.BundleImport:
        path = keyhistory.export_bundle(self.keys_dir, self.current, self.keys_dir.parent / "out", now_ms())
        return keyhistory.import_bundle(self.cfg.peers_dir, keyhistory.read_bundle(path), now_ms())


@pytest.fixture
def rotated(tmp_path: Path, cfg: NodeConfig) -> Rotated:
    return Rotated(tmp_path, cfg)


def _memory(ts: int) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "namespace": "default", "title": "", "content": f"written at {ts}", "tags": [],
            "priority": 5, "confidence": 1.0, "source": "", "origin": PEER, "writer": PEER, "version": 1,
            "created_at": ts, "updated_at": ts}


def _mput(seq: int, memory: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    return {"seq": seq, "kind": "memory.put", "memory": memory,
            "signature": attest.sign(key, MemoryPayload.from_mapping(memory)), "signed_by": PEER}


def _lput(seq: int, src: str, dst: str, ts: int, key: Ed25519PrivateKey) -> dict[str, Any]:
    link = LinkPayload(src_id=src, dst_id=dst, relation="related_to", observed_by=PEER, valid_from=ts,
                       valid_until=None)
    return {"seq": seq, "kind": "link.put", "link": link.to_dict(), "signature": attest.sign(key, link),
            "signed_by": PEER}


def _history(r: Rotated) -> list[dict[str, Any]]:
    """Two memories and a link between them, signed with the retired key an hour ago."""
    a, b = _memory(r.then), _memory(r.then)
    return [_mput(1, a, r.old), _mput(2, b, r.old), _lput(3, a["id"], b["id"], r.then, r.old)]


def _sync(svc: Service, link: PageLink, settings: PullSettings = NO_WAIT) -> PeerSync:
    fed = svc.replicator
    return PeerSync(PEER, {PEER: link}, fed.pulled, fed.accepts, svc.db, settings)  # type: ignore[union-attr]


def _page(items: list[dict[str, Any]], last: int) -> dict[str, Any]:
    return {"items": items, "next": last, "more": False}


async def _parked(svc: Service) -> int:
    return await svc.db.read(lambda c: changelog.parked_count(c, PEER, code=RejectCode.UNKNOWN_KEY))


async def test_history_signed_with_a_retired_key_is_parked_shown_and_applied_once_the_key_is_imported(
        svc: Service, rotated: Rotated) -> None:
    history = _history(rotated)
    link = PageLink(_page(history, 3))
    sync = _sync(svc, link)
    assert await sync.pull() == 0
    assert sync.stats["unknown_key"] == 3
    assert (await svc.db.read(changelog.get_peer_state, PEER)).last_sync_seq == 3  # the cursor moved on...
    assert await _parked(svc) == 3  # ...and nothing was skipped
    assert await svc.memory_list() == [] and await svc.links_list() == []
    [row] = [r for r in await peer_rows(svc) if r["agent_id"] == PEER]
    assert row["parked_unknown_key"] == 3 and row["parked"] == 3
    caps = await capabilities(svc, None)
    assert caps["sync_parked_unknown_key"] == 3 and caps["sync"]["parked_unknown_key"] == 3

    done = rotated.import_history()
    assert done.kept == (keys.fingerprint(rotated.old.public_key()),)
    link.answers.append(_page([], 3))
    assert await sync.pull() == 3  # verified again at the next round, before the pull
    assert await _parked(svc) == 0
    stored = await svc.memory_list()
    assert {m["attest_level"] for m in stored} == {"peer_attested"} and len(stored) == 2
    [stored_link] = await svc.links_list()
    assert stored_link["attest_level"] == "peer_attested"
    for ref in (stored[0]["id"], stored_link["link_id"]):
        assert (await svc.memory_verify(ref))["signature_verified"] is True
    assert (await svc.audit_verify())["ok"] is True


async def test_the_same_item_sent_live_is_refused_bad_signature_as_before(svc: Service, rotated: Rotated) -> None:
    item = _history(rotated)[0]
    payload = {k: v for k, v in item.items() if k != "seq"}
    ack = await svc.replicator.apply(new_envelope(PEER, [AGENT], payload, now_ms(), 60_000), PEER)
    assert ack.reason == "rejected:bad_signature"
    assert await _parked(svc) == 0


async def test_a_forgery_is_parked_as_unknown_key_until_the_whole_history_shows_it_forged(
        svc: Service, rotated: Rotated) -> None:
    forged = _mput(1, _memory(rotated.then), Ed25519PrivateKey.generate())
    recent = _mput(2, _memory(now_ms()), Ed25519PrivateKey.generate())  # after the current key was trusted
    outcome = await svc.replicator.apply_sync_items(PEER, [forged, recent])
    assert outcome == {"unknown_key": 1, "bad_signature": 1}
    rotated.import_history()
    checked = await svc.replicator.pulled.recheck_keys(PEER)  # type: ignore[union-attr]
    assert checked == {"bad_signature": 1}
    assert await _parked(svc) == 0 and await svc.memory_list() == []


async def test_a_full_parking_holds_the_cursor_before_the_page_and_nothing_is_skipped(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "home", federation={"sync_park_max": 2})
    keys.generate_identity(cfg.keys_dir, AGENT)
    rotated = Rotated(tmp_path, cfg)
    svc = await open_service(cfg, require_identity=True)
    try:
        history = _history(rotated)
        link = PageLink(_page(history[:1], 1), _page(history[1:], 3), _page(history[1:], 3), _page([], 3))
        sync = _sync(svc, link)
        await sync.pull()  # page 1: one item parked
        await sync.pull()  # page 2: one more fits, the link does not
        state = await svc.db.read(changelog.get_peer_state, PEER)
        assert state.last_sync_seq == 1 and await _parked(svc) == 2
        assert sync.stats["stalled"] == 1
        rotated.import_history()
        await sync.pull()  # the parked two apply; the page is read again from the cursor and the link applies
        assert [p["since"] for _, p in link.asked] == [0, 1, 1]
        assert (await svc.db.read(changelog.get_peer_state, PEER)).last_sync_seq == 3
        assert await _parked(svc) == 0 and len(await svc.links_list()) == 1
    finally:
        await svc.close()


async def test_a_running_pull_loop_applies_the_parked_items_within_a_second_of_the_import(
        svc: Service, rotated: Rotated) -> None:
    await svc.replicator.apply_sync_items(PEER, _history(rotated))
    assert await _parked(svc) == 3
    link = PageLink()
    link.state = link.state.DOWN  # no pulls: only the keyring watch runs
    sync = _sync(svc, link, PullSettings(page_limit=100, interval_s=60.0, fetch_timeout_s=5.0, key_check_s=0.05))
    task = asyncio.create_task(sync.run())
    try:
        rotated.import_history()
        deadline = time.monotonic() + DEADLINE_S
        for _ in range(int(DEADLINE_S / POLL_S)):  # polled, bounded: no timed assertion
            if not await _parked(svc) or time.monotonic() > deadline:
                break
            await asyncio.sleep(POLL_S)
        assert await _parked(svc) == 0 and len(await svc.links_list()) == 1
        assert link.asked == []
    finally:
        sync.stop()
        await asyncio.wait_for(task, 5)


async def test_metrics_show_each_peers_unknown_key_items() -> None:
    scrape = Scrape(peers={PEER: PeerScrape(state="up", outbox_depth=0, dead_letters=0, last_sync_seq=3, parked=3,
                                            parked_unknown_key=2, sync_last_pull_unix_s=1.0)},
                    rejections={}, hooks={}, mcp_calls={}, ready=True, writer_busy_s=0.0)

    async def current() -> Scrape:
        return scrape
    text = (await NodeMetrics(current).render())[0].decode()
    assert f'aimem_sync_parked_unknown_key{{peer="{PEER}"}} 2.0' in text
    assert f'aimem_sync_parked{{peer="{PEER}"}} 3.0' in text
