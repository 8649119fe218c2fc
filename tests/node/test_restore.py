"""Restore from the mesh, in process: the sync pages that give a puller back what it wrote itself, the start that
refuses a store holding anything, the change log restarted past the peers' cursors, the progress, and a store
rebuilt from a peer's pages (its own items self_signed and verifying, the audit chain whole)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from mesh import keys, peerkeys
from node.assemble import open_service
from node.config import NamespacePolicy, NodeConfig
from node.errors import ServiceError
from node.federation.restore import SEQ_PER_MS, RestoreProgress, marker_path, prepare
from node.federation.sync import PeerSync, PullSettings
from node.service import Service, now_ms
from storage import changelog
from tests.node.conftest import AGENT, make_config
from tests.node.test_peer_sync import PageLink

PEER = "ai:peer-a@lab"
OTHER = "ai:peer-c@lab"
PEERS = [{"agent_id": PEER, "url": "https://127.0.0.1:1/"}]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _with_peer(cfg: NodeConfig, tmp_path: Path) -> NodeConfig:
    """``cfg`` with PEER as its one peer, and the namespace "secret" shared with PEER alone (so what it writes
    there travels with share_with = [PEER], which does not name the writer itself)."""
    return replace(cfg, mesh=make_config(tmp_path, mesh={"peers": PEERS}).mesh,
                   federation=replace(cfg.federation, namespaces={"secret": NamespacePolicy(peers=(PEER,))}))


@pytest.fixture
async def origin(tmp_path: Path, cfg: NodeConfig) -> AsyncIterator[Service]:
    """The node under test (AGENT) on each backend, with PEER as its peer."""
    svc = await open_service(_with_peer(cfg, tmp_path), require_identity=True)
    yield svc
    await svc.close()


@pytest.fixture
async def holder(tmp_path: Path, cfg: NodeConfig) -> AsyncIterator[Service]:
    """PEER's store, holding what the node under test (AGENT, ``cfg``'s keys) wrote and sent it."""
    peer_cfg = replace(make_config(tmp_path / "peer"), agent_id=PEER)
    keys.generate_identity(peer_cfg.keys_dir, PEER)
    peerkeys.import_peer(peer_cfg.peers_dir, cfg.keys_dir / f"{AGENT}.pub")
    svc = await open_service(peer_cfg, require_identity=True)
    yield svc
    await svc.close()


async def _written_by(svc: Service, holder: Service) -> dict[str, list]:
    """AGENT writes two memories (one in a namespace it shares with PEER alone) and a link, and sends them to
    PEER; returns what AGENT holds."""
    a = await svc.memory_store("mine, shared", title="a")
    b = await svc.memory_store("mine, in a namespace the holder keeps to itself", namespace="secret")
    await svc.memory_link(a["id"], b["id"], "related_to")
    page = await svc.replicator.sync_page(PEER, 0, 100)
    outcome = await holder.replicator.apply_sync_items(AGENT, page["items"])
    assert outcome["applied"] == 3, outcome
    return {"memories": await svc.memory_list(), "links": await svc.links_list()}


async def test_a_page_asked_with_mine_gives_the_puller_back_what_it_wrote(origin: Service, holder: Service) -> None:
    await _written_by(origin, holder)
    without = await holder.replicator.sync_page(AGENT, 0, 100)
    assert without["items"] == [] and "mine" not in without
    page = await holder.replicator.sync_page(AGENT, 0, 100, [], True)
    assert page["mine"] is True and page["head"] == await holder.db.read(changelog.last_seq)
    # All three, the secret one too: its share_with names PEER alone, and AGENT gets it back because it wrote it;
    # its memory versions in the form with the signed sharing list, which the restoring node reads.
    assert sorted(i["kind"] for i in page["items"]) == ["link.put", "memory.put.v2", "memory.put.v2"]


async def test_a_store_rebuilt_from_a_peers_pages_holds_its_own_writes_self_signed_and_verifying(
        tmp_path: Path, cfg: NodeConfig, origin: Service, holder: Service) -> None:
    had = await _written_by(origin, holder)
    lost = _with_peer(make_config(tmp_path / "restored"), tmp_path)
    shutil.copytree(cfg.keys_dir, lost.keys_dir)
    peerkeys.import_peer(lost.peers_dir, holder.identity.pub_path)
    restored = await open_service(lost, require_identity=True)
    try:
        progress = await prepare(lost, restored.db, requested=True, now_ms=now_ms())
        assert progress is not None and progress.wants(PEER)
        page = await holder.replicator.sync_page(AGENT, 0, 100, [], True)
        outcome = await restored.replicator.apply_sync_items(PEER, page["items"])
        assert outcome == {"applied": 3}, outcome
        memories = await restored.memory_list()
        assert {(m["id"], m["content"], m["version"]) for m in memories} == \
            {(m["id"], m["content"], m["version"]) for m in had["memories"]}
        assert {m["attest_level"] for m in memories} == {"self_signed"}
        [link] = await restored.links_list()
        assert link["link_id"] == had["links"][0]["link_id"] and link["attest_level"] == "self_signed"
        for ref in [m["id"] for m in memories] + [link["link_id"]]:
            assert (await restored.memory_verify(ref))["signature_verified"] is True
        assert (await restored.audit_verify())["ok"] is True
    finally:
        await restored.close()


async def test_a_restore_is_refused_on_a_store_that_holds_anything(origin: Service) -> None:
    await origin.memory_store("still here")
    with pytest.raises(ServiceError) as err:
        await prepare(origin.cfg, origin.db, requested=True, now_ms=now_ms())
    assert err.value.code == "store_not_empty" and "memories: 1" in err.value.message
    assert not marker_path(origin.cfg).exists()


async def test_a_restore_starts_the_change_log_past_every_cursor_the_peers_kept(origin: Service) -> None:
    cfg = origin.cfg
    started = now_ms()
    progress = await prepare(cfg, origin.db, requested=True, now_ms=started)
    assert progress is not None and marker_path(cfg).exists()
    await origin.memory_store("the first write after the restore began")
    assert await origin.db.read(changelog.last_seq) > started * SEQ_PER_MS
    # A node stopped mid-restore resumes it at its next start, with or without --restore.
    again = await prepare(cfg, origin.db, requested=False, now_ms=now_ms())
    assert again is not None and again.started_at == started and again.wants(PEER)


def test_progress_counts_items_and_the_share_of_the_peers_logs_read_and_ends_with_the_last_peer(
        tmp_path: Path) -> None:
    marker = tmp_path / "data" / "restore.json"
    clock = Clock()
    progress = RestoreProgress(marker, [PEER, OTHER], started_at=1, clock=clock)
    progress.save()
    assert progress.percent() is None and progress.reason()["code"] == "restoring"
    progress.page(PEER, 50, 100, applied=40, done=False, own=True)
    progress.page(OTHER, 100, 300, applied=60, done=False, own=True)
    assert progress.items == 100 and progress.percent() == 37.5
    progress.page(PEER, 100, 100, applied=10, done=True, own=True)
    assert RestoreProgress.read(marker, [PEER, OTHER]).done == {PEER}
    assert progress.wants(OTHER) and not progress.wants(PEER) and progress.active
    progress.page(OTHER, 300, 300, applied=1, done=True, own=False)  # an older peer: none of our own writes
    assert not progress.active and progress.percent() == 100.0 and progress.reason() is None
    snap = progress.snapshot()
    assert snap["state"] == "done" and snap["items"] == 111 and snap["peers"][OTHER]["own_writes"] is False
    assert not marker.exists()


async def test_a_restoring_pull_asks_for_its_own_writes_until_the_peers_log_was_read_to_its_end(
        tmp_path: Path, svc: Service) -> None:
    progress = RestoreProgress(tmp_path / "restore.json", [PEER], started_at=1)
    link = PageLink({"items": [], "next": 5, "more": True, "head": 9, "mine": True},
                    {"items": [], "next": 9, "more": False, "head": 9, "mine": True},
                    {"items": [], "next": 9, "more": False})
    fed = svc.replicator
    sync = PeerSync(PEER, {PEER: link}, fed.pulled, fed.accepts, svc.db,  # type: ignore[union-attr]
                    PullSettings(page_limit=100, interval_s=60.0, fetch_timeout_s=5.0), progress)
    await sync.pull()
    await sync.pull()
    assert [p.get("mine") for _, p in link.asked] == [1, 1, None]
    assert not progress.active and progress.read_to == {PEER: 9}
