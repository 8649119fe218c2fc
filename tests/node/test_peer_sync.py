"""One peer's catch-up (node/federation/sync.py ``PeerSync``) in process, over a link that answers canned sync
pages: the cursor, the pages refused for the request budget, a page of the wrong shape, the stats; and the
inbound table and reject codes it relies on."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import cbor2
import pytest

from a2a.kinds import KNOWN_KINDS
from mesh.errors import MeshError
from mesh.linkstate import LinkState
from mesh.routes import SYNC_PATH
from node.federation.codes import RejectCode
from node.federation.inbound.common import Applied
from node.federation.sync import SYNCED_KINDS, PeerSync, PullSettings
from node.service import Service
from storage import changelog

PEER = "ai:peer-a@lab"
MID = "11111111-1111-4111-8111-111111111111"
NO_WAIT = PullSettings(page_limit=100, interval_s=60.0, fetch_timeout_s=5.0, rate_wait_s=0.0)


class PageLink:
    """A peer link whose GETs answer ``answers`` in turn (a page, or an exception to raise); records each ask."""

    def __init__(self, *answers: dict[str, Any] | list[Any] | Exception) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, dict[str, int | str]]] = []
        self.fetched = asyncio.Event()
        self.state = LinkState.UP

    async def fetch(self, path: str, params: Mapping[str, int | str], *, timeout_s: float) -> bytes:
        self.asked.append((path, dict(params)))
        self.fetched.set()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return cbor2.dumps(answer)


def _memory_put(seq: int) -> dict[str, Any]:
    memory = {"id": MID, "namespace": "default", "title": "", "content": "from the peer", "tags": [], "priority": 5,
              "confidence": 1.0, "source": "", "origin": PEER, "writer": PEER, "version": 1, "created_at": 1_000,
              "updated_at": 1_000}
    return {"seq": seq, "kind": "memory.put", "memory": memory, "signature": None, "signed_by": None}


def _peer_sync(svc: Service, link: PageLink) -> PeerSync:
    fed = svc.replicator
    return PeerSync(PEER, {PEER: link}, fed.pulled, fed.accepts, svc.db, NO_WAIT)  # type: ignore[union-attr]


async def test_a_pull_applies_each_page_moves_the_cursor_and_notes_what_the_peer_accepts(svc: Service) -> None:
    link = PageLink({"items": [_memory_put(1)], "next": 1, "more": True, "accepts": ["links.put"]},
                    {"items": [], "next": 7, "more": False, "accepts": ["links.put"]})
    sync = _peer_sync(svc, link)
    assert await sync.pull() == 1
    assert [(path, params["since"]) for path, params in link.asked] == [(SYNC_PATH, 0), (SYNC_PATH, 1)]
    # Each request says what this node reads, so the page carries memory versions in the form it reads.
    assert {params["accepts"] for _, params in link.asked} == {"links.put,memory.put.v2,agent.delegate,agent.revoke"}
    assert (await svc.db.read(changelog.get_peer_state, PEER)).last_sync_seq == 7
    assert svc.replicator.accepts.takes_link_batches(PEER)  # type: ignore[union-attr]
    assert not svc.replicator.accepts.reads_signed_sharing(PEER)  # type: ignore[union-attr]
    # Recorded in the store, for every process that writes to it (the CLI beside the node).
    assert await svc.db.read(changelog.peer_accepts) == {PEER: ["links.put"]}
    assert sync.stats == {"applied": 1} and sync.synced_at is not None
    assert (await svc.memory_get(MID))["content"] == "from the peer"
    # The next round starts from the cursor, and the item already here changes nothing.
    link.answers.append({"items": [_memory_put(1)], "next": 7, "more": False})
    assert await sync.pull() == 0
    assert link.asked[-1][1]["since"] == 7 and sync.stats == {"applied": 1, "unchanged": 1}


async def test_a_page_refused_for_the_request_budget_is_asked_again_from_the_same_cursor(svc: Service) -> None:
    link = PageLink(MeshError("rate_limited", "HTTP 429"), {"items": [_memory_put(1)], "next": 1, "more": False})
    assert await _peer_sync(svc, link).pull() == 1
    assert [params["since"] for _, params in link.asked] == [0, 0]


async def test_the_next_page_asked_while_one_is_applied_fails_the_round_only_after_that_one_is_kept(
        svc: Service) -> None:
    link = PageLink({"items": [_memory_put(1)], "next": 1, "more": True}, MeshError("peer_gone", "link down"))
    with pytest.raises(MeshError):
        await _peer_sync(svc, link).pull()
    assert [params["since"] for _, params in link.asked] == [0, 1]
    assert (await svc.db.read(changelog.get_peer_state, PEER)).last_sync_seq == 1
    assert (await svc.memory_get(MID))["content"] == "from the peer"


async def test_a_page_of_the_wrong_shape_fails_the_round_and_the_loop_counts_it(svc: Service) -> None:
    link = PageLink(["not", "a", "page"])
    sync = _peer_sync(svc, link)
    with pytest.raises(MeshError) as err:
        await sync.pull()
    assert err.value.code == "bad_sync_page"
    link.answers.append(["still", "not", "a", "page"])
    link.fetched.clear()
    task = asyncio.create_task(sync.run())
    sync.want()
    await asyncio.wait_for(link.fetched.wait(), 5)  # the round ran to its end before this wakes
    sync.stop()
    await asyncio.wait_for(task, 5)
    assert sync.stats == {"sync_failed": 1} and sync.synced_at is None


async def test_a_link_that_is_down_is_not_pulled(svc: Service) -> None:
    link = PageLink()
    link.state = LinkState.DOWN
    sync = _peer_sync(svc, link)
    task = asyncio.create_task(sync.run())
    sync.want()
    await asyncio.sleep(0.05)
    sync.stop()
    await asyncio.wait_for(task, 5)
    assert link.asked == [] and sync.stats == {}


def test_every_kind_the_change_log_carries_has_an_apply_and_the_table_knows_only_wire_kinds(svc: Service) -> None:
    routes = svc.replicator.inbound.routes  # type: ignore[union-attr]
    assert set(SYNCED_KINDS) <= set(routes) <= KNOWN_KINDS


def test_reject_codes_are_the_strings_peers_have_always_been_sent() -> None:
    assert RejectCode.UNKNOWN_MEMORY == "unknown_memory" and f"rejected:{RejectCode.RATE_LIMITED}" == \
        "rejected:rate_limited"
    applied = Applied(RejectCode.BAD_SIGNATURE)
    assert applied.code == "bad_signature" and type(applied.code) is str  # stored by value, never by name


class GatedLink(PageLink):
    """A PageLink that holds its ``gate_at``-th GET (1-based) until ``gate`` is set: the pull is mid-way."""

    def __init__(self, gate_at: int, *answers: dict[str, Any]) -> None:
        super().__init__(*answers)
        self.gate_at = gate_at
        self.gate = asyncio.Event()
        self.held = asyncio.Event()

    async def fetch(self, path: str, params: Mapping[str, int | str], *, timeout_s: float) -> bytes:
        if len(self.asked) + 1 == self.gate_at:
            self.held.set()
            await asyncio.wait_for(self.gate.wait(), 10)
        return await super().fetch(path, params, timeout_s=timeout_s)


def _nth_memory_put(seq: int) -> dict[str, Any]:
    item = _memory_put(seq)
    return {**item, "memory": {**item["memory"], "id": f"11111111-1111-4111-8111-{seq:012d}"}}


def _pages(total: int, per_page: int, head: int) -> list[dict[str, Any]]:
    return [{"items": [_nth_memory_put(s) for s in range(start, min(start + per_page, total + 1))],
             "next": min(start + per_page - 1, total), "more": start + per_page <= total, "head": head}
            for start in range(1, total + 1, per_page)]


async def _rendered(sync: PeerSync) -> str:
    from node.metrics import NodeMetrics, PeerScrape, Scrape

    peer = PeerScrape(state="up", outbox_depth=0, dead_letters=0, last_sync_seq=sync.progress.cursor, parked=0,
                      parked_unknown_key=0, sync_last_pull_unix_s=None, sync_lag_seqs=sync.progress.lag(),
                      sync_pulled=sync.progress.pulled)

    async def scrape() -> Scrape:
        return Scrape(peers={PEER: peer}, rejections={}, hooks={}, mcp_calls={}, ready=True, writer_busy_s=0.0)
    body, _ = await NodeMetrics(scrape).render()
    return body.decode()


async def test_a_catch_up_over_several_pages_shows_its_percentage_while_behind_and_100_when_caught_up(
        svc: Service, caplog: pytest.LogCaptureFixture) -> None:
    link = GatedLink(3, *_pages(total=10, per_page=4, head=10))
    settings = PullSettings(page_limit=4, interval_s=60.0, fetch_timeout_s=5.0, progress_log_s=0.0)
    fed = svc.replicator
    sync = PeerSync(PEER, {PEER: link}, fed.pulled, fed.accepts, svc.db, settings)  # type: ignore[union-attr]
    assert sync.progress.snapshot() == {"pulled": 0, "cursor": 0, "head": None, "lag_seqs": None, "percent": None}
    caplog.set_level("INFO", logger="node")
    pull = asyncio.create_task(sync.pull())
    await asyncio.wait_for(link.held.wait(), 10)  # two pages of three read, the third held
    # The third page is asked for while the second is applied: its answer held, the two before it are applied.
    for _ in range(1000):
        if sync.progress.pulled == 8:
            break
        await asyncio.sleep(0.01)
    behind = sync.progress.snapshot()
    assert behind == {"pulled": 8, "cursor": 8, "head": 10, "lag_seqs": 2, "percent": 80.0}
    metrics = await _rendered(sync)
    assert f'aimem_sync_lag_seqs{{peer="{PEER}"}} 2.0' in metrics
    assert f'aimem_sync_pulled_items_total{{peer="{PEER}"}} 8.0' in metrics
    link.gate.set()
    assert await asyncio.wait_for(pull, 10) == 10
    assert sync.progress.snapshot() == {"pulled": 10, "cursor": 10, "head": 10, "lag_seqs": 0, "percent": 100.0}
    assert f'aimem_sync_lag_seqs{{peer="{PEER}"}} 0.0' in await _rendered(sync)
    events = [(r.msg, getattr(r, "ev", {})) for r in caplog.records if r.msg in ("sync_progress", "sync_caught_up")]
    # A line per page while more follow (progress_log_s 0), then one when caught up.
    assert [(msg, ev["items"], ev["percent"]) for msg, ev in events] == [
        ("sync_progress", 4, 40.0), ("sync_progress", 8, 80.0), ("sync_caught_up", 10, 100.0)]
    assert all(ev["peer"] == PEER and "items_per_s" in ev for _, ev in events)


def test_a_catch_up_counts_from_where_it_began_and_floors_below_100_until_caught_up() -> None:
    from node.federation.sync import CatchUp

    restored = CatchUp(pulled=500, cursor=1_700_000_000_000_500, head=1_700_000_000_001_000,
                       base=1_700_000_000_000_000)
    assert restored.percent() == 50.0 and restored.lag() == 500
    assert CatchUp(cursor=99_999, head=100_000).percent() == 99.9
    assert CatchUp(cursor=7, head=7, base=7).percent() == 100.0


async def test_the_first_pull_waits_for_the_other_links_to_settle_so_their_writers_are_skipped(svc: Service) -> None:
    """A joining node's first pull: a writer whose own link is still connecting would be pulled from this peer too;
    the pull waits (bounded) until that link is up, and then skips it."""
    other = PageLink()
    other.state = LinkState.CONNECTING
    link = PageLink({"items": [], "next": 0, "more": False}, {"items": [], "next": 0, "more": False})
    fed = svc.replicator
    settings = PullSettings(page_limit=100, interval_s=60.0, fetch_timeout_s=5.0, rate_wait_s=0.0,
                            links_settle_s=5.0)
    sync = PeerSync(PEER, {PEER: link, "ai:other@lab": other}, fed.pulled, fed.accepts,  # type: ignore[union-attr]
                    svc.db, settings)
    pulling = asyncio.create_task(sync.pull())
    await asyncio.sleep(0.2)
    assert link.asked == []  # waiting for the other link
    other.state = LinkState.UP
    await asyncio.wait_for(pulling, 5)
    assert link.asked[0][1]["skip"] == "ai:other@lab"
    # Later rounds do not wait: a link that is down or connecting is not skipped.
    other.state = LinkState.CONNECTING
    await asyncio.wait_for(sync.pull(), 5)
    assert link.asked[1][1]["skip"] == ""
