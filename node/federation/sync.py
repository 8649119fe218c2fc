"""Catch-up in one place: serving this node's change log as pages (GET /a2a/v1/sync), applying the pages pulled
from a peer with the items that cannot be applied yet kept pending (then parked), and one ``PeerSync`` per peer
that owns its pull loop, its cursor, its stats and its "sync wanted" event (as Synapse keeps one
PerDestinationQueue per destination)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import cbor2

from a2a import ProtocolError
from a2a.envelope import RETRYABLE_REJECT_CODES
from a2a.kinds import MEMORY_PUT_V2
from mesh.errors import MeshError
from mesh.link import LinkState
from mesh.routes import SYNC_PATH
from node.config import NodeConfig
from node.errors import ServiceError
from node.federation.codes import RejectCode
from node.federation.forms import MemoryForms
from node.federation.inbound import Inbound
from node.federation.inbound.common import Applied, Clock
from node.federation.outbound import ACCEPTS, PeerAccepts
from node.federation.policy import Policy
from node.kg import invalidation_wire
from node.ratelimit import RateLimiter
from node.transcripts import scope_of, transcript_wire
from node.wire import link_wire
from storage import changelog, graph, links, memories, outbox, transcripts
from storage.db import Database
from storage.errors import StorageError

log = logging.getLogger("node.federation")
# The pull loop's events (synced, sync_failed) keep the logger name they have always been logged under.
pull_log = logging.getLogger("node")

# Payload kinds the change log carries: a peer that synced to the end holds them all.
SYNCED_KINDS = ("memory.put", MEMORY_PUT_V2, "link.put", "links.put", "link.invalidate", "transcript.put")
# Most bytes of transcript frames one sync page carries; past it the page ends early (more = true).
SYNC_PAGE_TRANSCRIPT_BYTES = 8 * 1024 * 1024
# Pending sync items retried per peer per pull round.
PENDING_RETRY_MAX = 1000
# Pages pulled per catch-up run; a longer backlog continues on the next reconnect or poll.
SYNC_MAX_PAGES = 10_000
# A sync page refused 429 (the peer's request budget for us): wait this long and ask again, at most this long a round.
SYNC_RATE_WAIT_S = 1.0
SYNC_RATE_WAIT_MAX_S = 60.0
# One page's GET may take at least this long, however short a2a.ack_timeout_s is (a page is up to 500 changes).
SYNC_FETCH_MIN_S = 10.0


class SyncOutcome(Counter[str]):
    """How a pulled page's items went, by code: ``applied`` changed something, ``unchanged`` did not,
    ``pending`` will be retried next round, ``parked`` gave up after ``sync_park_after`` rounds."""


class SyncPages:
    """Serves this node's change log to its peers: what each may see, within its request budget (``peer_rate``:
    a page's changes are messages' worth of work; None = no limit), each memory version in the form the puller
    reads (``forms``)."""

    def __init__(self, cfg: NodeConfig, db: Database, policy: Policy, clock: Clock, peer_rate: RateLimiter | None,
                 counters: Counter[str], forms: MemoryForms) -> None:
        self.cfg = cfg
        self.db = db
        self.policy = policy
        self.clock = clock
        self.peer_rate = peer_rate
        self.counters = counters
        self.forms = forms

    async def page(self, peer: str, since: int, limit: int, skip: Sequence[str] = (),
                   reads: Sequence[str] = ACCEPTS) -> dict[str, Any]:
        """One page of this node's change log after ``since`` (served at GET /a2a/v1/sync).

        Only what ``peer`` may see (a link only where it may see both ends), and nothing written by
        ``peer`` itself or by the agents in ``skip`` (the puller gets those from their writers); memory
        versions in the form ``reads`` (the kinds the request listed in ``accepts``) allows.
        """
        reads_v2 = MEMORY_PUT_V2 in reads
        limit = self._granted(peer, min(limit, self.cfg.federation.sync_page_limit))
        read_rows = 0

        def read(conn: Any) -> dict[str, Any]:
            nonlocal read_rows
            rows = changelog.page(conn, since, limit)
            read_rows = len(rows)
            return self._page_of(conn, peer, {peer, *skip}, since, rows, limit, reads_v2)

        read_at = self.clock()
        try:
            page: dict[str, Any] = await self.db.read(read)
        finally:
            if self.peer_rate is not None:
                self.peer_rate.give_back(peer, limit - read_rows)  # a short log used fewer than granted
        if not page["more"]:
            # Only changes the log carries are covered by the catch-up (a dead ping stays for replay), and
            # only letters dead before this page was read: a later one may carry a change made since.
            cleared = await self.db.write(outbox.clear_dead_letters, peer, SYNCED_KINDS, read_at)
            if cleared:
                log.info("dead_letters_cleared", extra={"ev": {"peer": peer, "count": cleared,
                                                               "reason": "peer caught up through sync"}})
        return page

    def _granted(self, peer: str, limit: int) -> int:
        """How many changes ``peer`` may read now: a page reads up to ``limit`` changes, each one a message's worth
        of work, out of the peer's limits.peer_requests_per_second budget as live messages are. A short budget
        gives a short page (the peer asks again from ``next``); none at all refuses the page, retryably."""
        if self.peer_rate is None:
            return limit
        limit, wait = self.peer_rate.take_up_to(peer, limit)
        if not limit:
            self.counters[f"rejected:{RejectCode.RATE_LIMITED}"] += 1
            raise ServiceError(RejectCode.RATE_LIMITED.value,
                               f"sync pages from {peer} are past limits.peer_requests_per_second "
                               f"({self.cfg.limits.peer_requests_per_second}); retry in {wait * 1000:.0f} ms")
        return limit

    def _page_of(self, conn: Any, peer: str, omit: set[str], since: int, rows: list[changelog.ChangeRow],
                 limit: int, reads_v2: bool) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        budget, last = SYNC_PAGE_TRANSCRIPT_BYTES, since
        for r in rows:
            item = self._item(conn, peer, omit, r, reads_v2)
            last = r.seq
            if item is not None:
                items.append(item)
                budget -= len(item.get("body", b""))
            if budget < 0:
                break  # transcripts filled the page: the rest comes on the next one
        return {"items": items, "next": last, "more": len(rows) == limit or (bool(rows) and last != rows[-1].seq),
                "accepts": list(ACCEPTS)}

    def _item(self, conn: Any, peer: str, omit: set[str], r: changelog.ChangeRow,
              reads_v2: bool) -> dict[str, Any] | None:
        if r.kind == "memory":
            m = memories.get(conn, r.ref_id)
            if m is None or m.author in omit or not self.policy.visible_to(peer, m):
                return None
            payload = self.forms.payload(m, peer, reads_v2)
            return None if payload is None else {"seq": r.seq, **payload}
        inv = graph.get_invalidation(conn, r.ref_id)
        # A 'link' change is a link or an invalidation of one; either goes where the link may go.
        link = links.get(conn, inv.link_id if inv is not None else r.ref_id)
        if link is None and inv is None:
            return self._transcript(conn, peer, omit, r)
        author = inv.observed_by if inv is not None else link.observed_by if link is not None else None
        if link is None or author in omit or not self.policy.link_visible(conn, peer, link):
            return None
        if inv is not None:
            return {"seq": r.seq, "kind": "link.invalidate", **invalidation_wire(inv)}
        return {"seq": r.seq, "kind": "link.put", **link_wire(link)}

    def _transcript(self, conn: Any, peer: str, omit: set[str], r: changelog.ChangeRow) -> dict[str, Any] | None:
        """A 'link' change that is neither a link nor an invalidation is a replicated transcript: served where
        its namespace still replicates and ``peer`` may see the namespace and every memory it cites."""
        t = transcripts.get(conn, r.ref_id)
        if t is None or t.agent in omit or not self.cfg.transcripts.policy(t.namespace).replicate:
            return None
        spans = transcripts.spans_of_transcript(conn, t.id)
        ids = {s.memory_id for s in spans}
        cited = memories.get_many(conn, ids)
        if len(cited) != len(ids) or not all(self.policy.visible_to(peer, m)
                                             for m in [scope_of(t.namespace, None), *cited.values()]):
            return None
        return {"seq": r.seq, "kind": "transcript.put", **transcript_wire(t, spans)}


class PulledPages:
    """Applies the pages pulled from peers (memories first, so links find their memories). An item that cannot
    be stored now (storage trouble, a link whose memory is not here yet) is kept in ``sync_pending`` and retried
    on the next rounds (``retry_pending``), parked after ``federation.sync_park_after`` rounds, so the cursor
    moves on."""

    def __init__(self, inbound: Inbound, db: Database, clock: Clock, park_after: int) -> None:
        self.inbound = inbound
        self.db = db
        self.clock = clock
        self.park_after = park_after

    async def apply(self, peer: str, items: Iterable[Any]) -> SyncOutcome:
        """Apply one pulled page's items."""
        outcome = SyncOutcome()
        good = [i for i in items if isinstance(i, dict) and isinstance(i.get("seq"), int)]
        for item in sorted(good, key=apply_order):
            await self._apply_item(peer, item, outcome)
        return outcome

    async def retry_pending(self, peer: str) -> SyncOutcome:
        """Apply again the items from ``peer`` that could not be applied on earlier rounds."""
        outcome = SyncOutcome()
        waiting = await self.db.read(changelog.pending, peer, PENDING_RETRY_MAX)
        for p in sorted(waiting, key=lambda p: apply_order({"kind": p.kind})):
            try:
                item = cbor2.loads(p.item)
            except (cbor2.CBORDecodeError, ValueError):
                await self.db.write(changelog.drop_pending, peer, p.seq)
                continue
            await self._apply_item(peer, item, outcome)
        return outcome

    async def _apply_item(self, peer: str, item: dict[str, Any], outcome: SyncOutcome) -> None:
        payload = {k: v for k, v in item.items() if k != "seq"}
        try:
            applied = await self.inbound.apply_payload(payload, peer)
        except ProtocolError as e:
            applied, retryable = Applied(e.code), False
        except StorageError as e:
            applied, retryable = Applied(e.code), True
        else:
            retryable = applied.code in RETRYABLE_REJECT_CODES
        if applied.code is not None and retryable:
            await self._note_pending(peer, item, applied.code, outcome)
            return
        await self.db.write(changelog.drop_pending, peer, item["seq"])
        outcome[applied.code or ("applied" if applied.changed else "unchanged")] += 1

    async def _note_pending(self, peer: str, item: dict[str, Any], code: str, outcome: SyncOutcome) -> None:
        kind = str(item.get("kind"))
        memory_id = item.get("memory", {}).get("id")
        ref = {"memory.put": memory_id, MEMORY_PUT_V2: memory_id,
               "transcript.put": item.get("transcript", {}).get("id"),
               # An invalidation waits for the link it ends: that link names it.
               "link.invalidate": item.get("invalidation", {}).get("link_id"),
               }.get(kind, item.get("link", {}).get("src_id"))
        pending = await self.db.write(changelog.note_pending, peer, item["seq"], kind, str(ref), code,
                                      cbor2.dumps(item), self.park_after, self.clock())
        if pending.parked:
            outcome["parked"] += 1
            log.warning("sync_item_parked", extra={"ev": {"peer": peer, "seq": item["seq"], "kind": kind,
                                                          "code": code, "rounds": pending.rounds}})
        else:
            outcome["pending"] += 1


def apply_order(item: dict[str, Any]) -> int:
    """Within a pulled page: memories, then links, then invalidations (each finds what it refers to)."""
    return {"memory.put": 0, MEMORY_PUT_V2: 0, "link.put": 1}.get(str(item.get("kind")), 2)


class SyncLink(Protocol):
    """What a pull needs of a peer link (``mesh.link.PeerLink``)."""

    @property
    def state(self) -> LinkState: ...

    async def fetch(self, path: str, params: Mapping[str, int | str], *, timeout_s: float) -> bytes: ...


@dataclass(frozen=True, slots=True)
class PullSettings:
    """How a peer's change log is pulled: ``page_limit`` changes a page (federation.sync_page_limit), a pull
    every ``interval_s`` besides each reconnect (federation.sync_interval_s), ``fetch_timeout_s`` per page's GET;
    a page refused 429 is asked again after ``rate_wait_s``, for at most ``rate_wait_max_s`` a round; at most
    ``max_pages`` pages a round."""

    page_limit: int
    interval_s: float
    fetch_timeout_s: float
    rate_wait_s: float = SYNC_RATE_WAIT_S
    rate_wait_max_s: float = SYNC_RATE_WAIT_MAX_S
    max_pages: int = SYNC_MAX_PAGES

    @classmethod
    def of(cls, cfg: NodeConfig) -> PullSettings:
        return cls(page_limit=cfg.federation.sync_page_limit, interval_s=cfg.federation.sync_interval_s,
                   fetch_timeout_s=max(cfg.a2a.ack_timeout_s, SYNC_FETCH_MIN_S))


class PeerSync:
    """One peer's catch-up: pulls its change log after each (re)connect (``want``) and every ``interval_s``, from
    the last seq applied from it (its cursor, kept in peer_state); the interval heals a one-way outage that
    never drops our link to the peer. ``links``: every peer's link (writers linked to us directly are skipped:
    we get their changes from them)."""

    def __init__(self, peer: str, links: Mapping[str, SyncLink], pulled: PulledPages, accepts: PeerAccepts,
                 db: Database, settings: PullSettings) -> None:
        self.peer = peer
        self.link = links[peer]
        self.links = links
        self.pulled = pulled
        self.accepts = accepts
        self.db = db
        self.settings = settings
        self.wanted = asyncio.Event()
        # How this peer's pulled items went, and the rounds that failed (sync_failed).
        self.stats: Counter[str] = Counter()
        # time.monotonic() of the last completed pull; None before the first.
        self.synced_at: float | None = None
        self._stopping = False

    def want(self) -> None:
        """Pull now (the link came up)."""
        self.wanted.set()

    def stop(self) -> None:
        """End the loop at its next wake-up (the node is draining)."""
        self._stopping = True
        self.wanted.set()

    async def run(self) -> None:
        """The pull loop, until ``stop``: whatever a peer or the disk does, a failed round is logged and counted,
        and the next round retries."""
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wanted.wait(), self.settings.interval_s)
            self.wanted.clear()
            if self._stopping:
                return
            if self.link.state is not LinkState.UP:
                continue
            try:
                await self.pull()
            except Exception as e:  # the node keeps running; the next round retries
                self.stats["sync_failed"] += 1
                pull_log.warning("sync_failed", extra={"ev": {"peer": self.peer,
                                                              "error": f"{type(e).__name__}: {e}"}})

    async def pull(self) -> int:
        """Retry what earlier rounds could not apply, then apply the peer's changes since our last sync seq.

        The cursor always moves on: an item that cannot be applied yet waits in ``sync_pending`` and is
        parked after ``federation.sync_park_after`` rounds. Returns how many items changed something here.
        """
        outcome = await self.pulled.retry_pending(self.peer)
        state = await self.db.read(changelog.get_peer_state, self.peer)
        since = state.last_sync_seq if state else 0
        skip = ",".join(sorted(p for p, other in self.links.items()
                               if p != self.peer and other.state is LinkState.UP))
        waited_s = 0.0
        for _ in range(self.settings.max_pages):
            page = await self._page(since, skip, waited_s)
            if page is None:  # refused for now: waited, ask again
                waited_s += self.settings.rate_wait_s
                continue
            self.accepts.note(self.peer, page.get("accepts"))
            outcome.update(await self.pulled.apply(self.peer, page["items"]))
            if page["next"] > since:
                since = page["next"]
                await self.db.write(partial(changelog.set_peer_state, peer=self.peer, last_sync_seq=since))
            if not page["more"]:
                break
        self.stats.update(outcome)
        self.synced_at = time.monotonic()
        level = logging.INFO if outcome["applied"] or outcome["pending"] or outcome["parked"] else logging.DEBUG
        pull_log.log(level, "synced", extra={"ev": {"peer": self.peer, "last_sync_seq": since, **outcome}})
        return outcome["applied"]

    async def _page(self, since: int, skip: str, waited_s: float) -> dict[str, Any] | None:
        """One page after ``since``, or None after waiting ``rate_wait_s`` when the peer refused it for our
        request budget (and ``rate_wait_max_s`` is not spent yet this round)."""
        s = self.settings
        try:
            # ``accepts``: what this node reads, so the page carries memory versions in the form it reads
            # (an older node's pages ignore it).
            body = await self.link.fetch(SYNC_PATH, {"since": since, "limit": s.page_limit, "skip": skip,
                                                     "accepts": ",".join(ACCEPTS)}, timeout_s=s.fetch_timeout_s)
        except MeshError as e:
            # The peer charges the changes we read to our limits.peer_requests_per_second: wait for the
            # budget and go on from the cursor, up to rate_wait_max_s a round (then the next round).
            if e.code != "rate_limited" or waited_s >= s.rate_wait_max_s:
                raise
            await asyncio.sleep(s.rate_wait_s)
            return None
        page = cbor2.loads(body)
        if not isinstance(page, dict) or not isinstance(page.get("items"), list) \
                or not isinstance(page.get("next"), int) or not isinstance(page.get("more"), bool):
            raise MeshError("bad_sync_page", f"{self.peer} answered a sync page of the wrong shape")
        return page
