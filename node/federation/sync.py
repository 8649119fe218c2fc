"""Catch-up in one place: serving this node's change log as pages (GET /a2a/v1/sync), applying the pages pulled
from a peer with the items that cannot be applied yet kept pending (then parked), and one ``PeerSync`` per peer
that owns its pull loop, its cursor, its stats and its "sync wanted" event (as Synapse keeps one
PerDestinationQueue per destination).

An item whose signature may be by a key of its signer this node was never given (``unknown_key``,
node/federation/verify.py) is parked at once, never skipped: it is verified again whenever the keyring changes
(an imported key history applies it), and a peer whose parked ``unknown_key`` items reach
``federation.sync_park_max`` is not read past the item that did not fit until there is room. A restore from
the mesh (node/federation/restore.py) reads each peer's log from its start, with this node's own writes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import groupby
from typing import Any, Protocol

import cbor2

from a2a import ProtocolError
from a2a.envelope import RETRYABLE_REJECT_CODES
from a2a.kinds import AGENT_DELEGATE, AGENT_KINDS, AGENT_REVOKE, MEMORY_PUT_V2
from mesh.errors import MeshError
from mesh.linkstate import LinkState
from mesh.routes import SYNC_PATH
from node.agents.book import AgentBook
from node.config import NodeConfig
from node.federation.codes import RejectCode
from node.federation.inbound import Inbound
from node.federation.inbound.common import Applied, Clock
from node.federation.outbound import ACCEPTS, PeerAccepts
from node.federation.restore import RestoreProgress
from node.federation.verify import KEYRING_RECHECK_S
from node.pause import StoragePause
from node.trust import Keyring
from storage import changelog
from storage.db import Database
from storage.errors import StorageError

log = logging.getLogger("node.federation")
# The pull loop's events (synced, sync_failed) keep the logger name they have always been logged under.
pull_log = logging.getLogger("node")

# Payload kinds the change log carries: a peer that synced to the end holds them all.
SYNCED_KINDS = ("memory.put", MEMORY_PUT_V2, "link.put", "links.put", "link.invalidate", "transcript.put",
                *AGENT_KINDS)
# Pulled items parked at once and verified again when a key or a delegation arrives (never skipped): signed by a key
# of its signer not known here yet; signed by an agent whose delegation is not here yet; a delegation of an agent
# another node holds a live delegation for here (free again once that one is revoked or over).
PARKED_UNTIL_KNOWN = (RejectCode.UNKNOWN_KEY, RejectCode.UNKNOWN_DELEGATION, RejectCode.AGENT_CLAIMED)
# Pending sync items retried per peer per pull round.
PENDING_RETRY_MAX = 1000
# Pulled items of one kind applied at once: their writes share the storage writer's group commits (one at a time,
# each item waited for its own commit: a restore ran at the disk's fsync rate).
APPLY_TOGETHER = 256
# Pages pulled per catch-up run; a longer backlog continues on the next reconnect or poll.
SYNC_MAX_PAGES = 10_000
# A sync page refused 429 (the peer's request budget for us): wait this long and ask again, at most this long a round.
SYNC_RATE_WAIT_S = 1.0
SYNC_RATE_WAIT_MAX_S = 60.0
# One page's GET may take at least this long, however short a2a.ack_timeout_s is (a page is up to 500 changes).
SYNC_FETCH_MIN_S = 10.0
# While a pull has more pages to read, sync_progress is logged at most this often (seconds).
SYNC_PROGRESS_LOG_S = 5.0
# A peer's first pull since start waits at most this long (seconds) while another peer's link is still connecting.
SYNC_LINKS_SETTLE_S = 5.0


class SyncOutcome(Counter[str]):
    """How a pulled page's items went, by code: ``applied`` changed something, ``unchanged`` did not,
    ``pending`` will be retried next round, ``parked`` gave up after ``sync_park_after`` rounds, ``unknown_key``
    parked until a key verifies it, ``stalled`` could not be parked (the peer's parking is full: the cursor must
    not move past the page). ``codes``: each item's own code (None: accepted), in the order given."""

    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        super().__init__(counts or {})
        self.codes: list[str | None] = []


class PulledPages:
    """Applies the pages pulled from peers (memories first, so links find their memories). An item that cannot
    be stored now (storage trouble, a link whose memory is not here yet) is kept in ``sync_pending`` and retried
    on the next rounds (``retry_pending``), parked after ``federation.sync_park_after`` rounds, so the cursor
    moves on. An ``unknown_key`` item is parked at once, at most ``park_max`` a peer (past that the page is
    ``stalled``), and verified again each time ``keyring`` changes (``recheck_keys``)."""

    def __init__(self, inbound: Inbound, db: Database, clock: Clock, park_after: int, keyring: Keyring,
                 park_max: int, agents: AgentBook) -> None:
        self.inbound = inbound
        self.db = db
        self.clock = clock
        self.park_after = park_after
        self.keyring = keyring
        self.park_max = park_max
        # The delegations held here: one arriving verifies again the items parked waiting for it.
        self.agents = agents
        # The keyring and delegation generations each peer's parked items were last verified against.
        self._checked: dict[str, tuple[int, int]] = {}

    async def apply(self, peer: str, items: Iterable[Any]) -> SyncOutcome:
        """Apply one pulled page's items."""
        good = [i for i in items if isinstance(i, dict) and isinstance(i.get("seq"), int)]
        outcome = await self._settle(peer, good)
        signers = Counter(signer_of(i) for i, code in zip(good, outcome.codes, strict=True)
                          if code == RejectCode.UNKNOWN_KEY)
        if signers:
            log.warning("unknown_key_parked", extra={"ev": {
                "peer": peer, "signers": dict(signers), "stalled": outcome["stalled"],
                "fix": "import each signer's key history: its operator runs `ai-memory identity export-pub "
                       "--with-retired`, you run `ai-memory identity import` on the file"}})
        return outcome

    async def retry_pending(self, peer: str) -> SyncOutcome:
        """Apply again the items from ``peer`` that could not be applied on earlier rounds."""
        waiting = await self.db.read(changelog.pending, peer, PENDING_RETRY_MAX)
        items = [_item_of(p) for p in waiting]
        unreadable = [p.seq for p, item in zip(waiting, items, strict=True) if item is None]
        if unreadable:
            await self.db.write(changelog.drop_pending_many, peer, unreadable)
        return await self._settle(peer, [item for item in items if item is not None])

    async def recheck_keys(self, peer: str) -> SyncOutcome | None:
        """When the keyring or the delegations held here changed since ``peer``'s parked items waiting for one
        (``unknown_key``, ``unknown_delegation``, ``agent_claimed``) were last verified (and once after start),
        verify them again: applied when a key now verifies one, refused (dropped) when it is now known to be
        forged, back among the pending items when it now waits for something else. None when neither changed."""
        generation = (self.keyring.refresh(), await self.agents.refresh())
        if self._checked.get(peer) == generation:
            return None
        outcome = SyncOutcome()
        for code in PARKED_UNTIL_KNOWN:
            await self._recheck(peer, code, outcome)
        self._checked[peer] = generation  # only once done: a check cut short by the store is made again
        if outcome:
            log.info("unknown_key_rechecked", extra={"ev": {"peer": peer, **outcome}})
        return outcome

    async def _recheck(self, peer: str, code: str, outcome: SyncOutcome) -> None:
        """``recheck_keys`` for the items parked with ``code``, a page of them at a time."""
        after = 0
        for _ in range(max(1, -(-self.park_max // PENDING_RETRY_MAX))):
            parked = await self.db.read(partial(changelog.parked, peer=peer, limit=PENDING_RETRY_MAX,
                                                code=code, after_seq=after))
            items = [_item_of(p) for p in parked]
            answers = await self._applied_all(peer, [item for item in items if item is not None])
            verdicts = iter(answers)
            drops: list[int] = []
            for p, item in zip(parked, items, strict=True):
                applied, retryable = (Applied(RejectCode.BAD_PAYLOAD), False) if item is None else next(verdicts)
                if applied.code in PARKED_UNTIL_KNOWN:
                    outcome[str(applied.code)] += 1
                elif applied.code is not None and retryable:
                    await self.db.write(changelog.unpark, peer, p.seq, applied.code, self.clock())
                    outcome["pending"] += 1
                else:
                    drops.append(p.seq)
                    outcome[applied.code or ("applied" if applied.changed else "unchanged")] += 1
            if drops:
                await self.db.write(changelog.drop_pending_many, peer, drops)
            if len(parked) < PENDING_RETRY_MAX:
                break
            after = parked[-1].seq

    async def _settle(self, peer: str, items: list[dict[str, Any]]) -> SyncOutcome:
        """Apply pulled items and keep the books: an ``unknown_key`` parked, a retryable refusal pending (then
        parked), anything else done (no longer pending). ``outcome.codes``: each item's code, in order."""
        outcome = SyncOutcome()
        done: list[int] = []
        unknown: dict[str, list[changelog.ParkItem]] = {}
        for item, (applied, retryable) in zip(items, await self._applied_all(peer, items), strict=True):
            outcome.codes.append(applied.code)
            if applied.code in PARKED_UNTIL_KNOWN:
                unknown.setdefault(str(applied.code), []).append(
                    (item["seq"], str(item.get("kind")), str(ref_of(item)), cbor2.dumps(item)))
            elif applied.code is not None and retryable:
                await self._note_pending(peer, item, applied.code, outcome)
            else:
                done.append(item["seq"])
                outcome[applied.code or ("applied" if applied.changed else "unchanged")] += 1
        if done:
            await self.db.write(changelog.drop_pending_many, peer, done)
        for code, parking in unknown.items():
            parked = await self.db.write(changelog.park_many, peer, parking, code, self.clock(), self.park_max)
            for fits in parked:
                outcome[code if fits else "stalled"] += 1
        return outcome

    async def _applied_all(self, peer: str, items: list[dict[str, Any]]) -> list[tuple[Applied, bool]]:
        """Each item applied (``_applied``), answers in the items' order: memories first, then links, then the
        rest (each finds what it refers to), up to APPLY_TOGETHER of one kind at once (links as one run of stages),
        so that their writes share the writer's commits and a link held for its memory does not hold up the others."""
        answers: list[tuple[Applied, bool] | None] = [None] * len(items)
        order = sorted(range(len(items)), key=lambda i: apply_order(items[i]))
        for _, phase in groupby(order, key=lambda i: apply_order(items[i])):
            idx = list(phase)
            for start in range(0, len(idx), APPLY_TOGETHER):
                chunk = idx[start:start + APPLY_TOGETHER]
                got: Sequence[tuple[Applied, bool] | BaseException]
                links_only = all(items[i].get("kind") == "link.put" for i in chunk)  # one run of stages
                got = await self._applied_links(peer, [items[i] for i in chunk]) if links_only else \
                    await asyncio.gather(*(self._applied(peer, items[i]) for i in chunk), return_exceptions=True)
                for i, answer in zip(chunk, got, strict=True):
                    if isinstance(answer, BaseException):
                        raise answer  # what no apply answers (a hook or the event sink failing): the round fails
                    answers[i] = answer
        return [a for a in answers if a is not None]

    async def _applied(self, peer: str, item: dict[str, Any]) -> tuple[Applied, bool]:
        """One pulled item applied, and whether a later round may cure its refusal (storage trouble, a retryable
        code); a malformed one answers its protocol code."""
        payload = {k: v for k, v in item.items() if k != "seq"}
        try:
            applied = await self.inbound.apply_payload(payload, peer, pulled=True)
        except ProtocolError as e:
            return Applied(e.code), False
        except StorageError as e:
            return Applied(e.code), True
        return applied, applied.code in RETRYABLE_REJECT_CODES

    async def _applied_links(self, peer: str, items: list[dict[str, Any]]) -> list[tuple[Applied, bool]]:
        """``_applied`` for a run of link.put items, applied as one run (``Inbound.apply_links``); storage trouble
        leaves each of them to a later round."""
        try:
            got = await self.inbound.apply_links([{k: v for k, v in i.items() if k != "seq"} for i in items], peer)
        except StorageError as e:
            return [(Applied(e.code), True)] * len(items)
        return [(Applied(a.code), False) if isinstance(a, ProtocolError) else (a, a.code in RETRYABLE_REJECT_CODES)
                for a in got]

    async def _note_pending(self, peer: str, item: dict[str, Any], code: str, outcome: SyncOutcome) -> None:
        kind = str(item.get("kind"))
        pending = await self.db.write(changelog.note_pending, peer, item["seq"], kind, str(ref_of(item)), code,
                                      cbor2.dumps(item), self.park_after, self.clock())
        if pending.parked:
            outcome["parked"] += 1
            log.warning("sync_item_parked", extra={"ev": {"peer": peer, "seq": item["seq"], "kind": kind,
                                                          "code": code, "rounds": pending.rounds}})
        else:
            outcome["pending"] += 1


class _PageAhead:
    """The one page a pull asks for before it has applied the page before it (so the peer reads the next page
    while this node applies the last): owned here until taken or dropped."""

    def __init__(self) -> None:
        self._task: asyncio.Task[dict[str, Any] | None] | None = None

    @property
    def asked(self) -> bool:
        return self._task is not None

    def ask(self, fetch: Coroutine[Any, Any, dict[str, Any] | None]) -> None:
        self._task = asyncio.get_running_loop().create_task(fetch)

    async def take(self) -> dict[str, Any] | None:
        """The page asked ahead (None: refused for the request budget, waited), its fetch's error raised here."""
        task, self._task = self._task, None
        return None if task is None else await task

    async def drop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@dataclass(slots=True)
class _RoundLog:
    """One pull round's progress lines: when it began (time.monotonic()), ``progress.pulled`` then, when the last
    line was logged, and whether one was."""

    began: float
    pulled_at_start: int
    logged_at: float = 0.0
    logged: bool = False

    def __post_init__(self) -> None:
        self.logged_at = self.began

    def figures(self, p: CatchUp) -> dict[str, Any]:
        items = p.pulled - self.pulled_at_start
        took_s = time.monotonic() - self.began
        return {"items": items, "cursor": p.cursor, "head": p.head, "percent": p.percent(),
                "items_per_s": round(items / took_s, 1) if took_s > 0 else None}


def ref_of(item: dict[str, Any]) -> Any:
    """What a pulled item names: its memory, transcript or link's first end (an invalidation: its link)."""
    memory_id = item.get("memory", {}).get("id")
    return {"memory.put": memory_id, MEMORY_PUT_V2: memory_id, "transcript.put": item.get("transcript", {}).get("id"),
            # An invalidation waits for the link it ends: that link names it.
            "link.invalidate": item.get("invalidation", {}).get("link_id"),
            AGENT_DELEGATE: item.get("delegation", {}).get("agent_id") if isinstance(item.get("delegation"), dict)
            else None,
            AGENT_REVOKE: item.get("revocation", {}).get("delegation_id"),
            }.get(str(item.get("kind")), item.get("link", {}).get("src_id"))


def signer_of(item: dict[str, Any]) -> str:
    """Who signed a pulled item (its writer, observer or agent)."""
    body = {"memory.put": ("memory", "writer"), MEMORY_PUT_V2: ("memory", "writer"),
            "link.put": ("link", "observed_by"),
            "link.invalidate": ("invalidation", "observed_by"), "transcript.put": ("transcript", "agent"),
            AGENT_DELEGATE: ("delegation", "issuer"), AGENT_REVOKE: ("revocation", "issuer")}
    part, field = body.get(str(item.get("kind")), ("", ""))
    inner = item.get(part)
    return str(inner.get(field)) if isinstance(inner, dict) else "?"


def _item_of(p: changelog.PendingItem) -> dict[str, Any] | None:
    try:
        item = cbor2.loads(p.item)
    except (cbor2.CBORDecodeError, ValueError):
        return None
    return item if isinstance(item, dict) else None


def apply_order(item: dict[str, Any]) -> int:
    """Within a pulled page: delegations, then memories, then links, then invalidations (each finds what it refers
    to: an agent's item its delegation)."""
    return {AGENT_DELEGATE: -1, AGENT_REVOKE: -1, "memory.put": 0, MEMORY_PUT_V2: 0,
            "link.put": 1}.get(str(item.get("kind")), 2)


@dataclass(slots=True)
class CatchUp:
    """How far this node's pulls of one peer's change log got, for ``status``, ``/metrics`` and the log:
    ``pulled`` items received in pages since start; ``cursor`` the last seq read; ``head`` the peer's last seq when
    it served the last page (None before the first page); ``base`` the cursor the current catch-up began at (the
    percentage counts from there: a log's seqs need not start at 1)."""

    pulled: int = 0
    cursor: int = 0
    head: int | None = None
    base: int = 0

    def lag(self) -> int | None:
        """Seqs of the peer's log not read yet (as of its last page); None before the first page."""
        return None if self.head is None else max(0, self.head - self.cursor)

    def percent(self) -> float | None:
        """How much of the current catch-up was read, 0..100 (floored: 100 only when caught up); None before the
        first page."""
        if self.head is None:
            return None
        if self.cursor >= self.head:
            return 100.0
        span = self.head - self.base
        return math.floor(1000.0 * (self.cursor - self.base) / span) / 10 if span > 0 else 0.0

    def snapshot(self) -> dict[str, Any]:
        return {"pulled": self.pulled, "cursor": self.cursor, "head": self.head, "lag_seqs": self.lag(),
                "percent": self.percent()}


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
    ``max_pages`` pages a round; the keyring is looked at every ``key_check_s`` between pulls."""

    page_limit: int
    interval_s: float
    fetch_timeout_s: float
    rate_wait_s: float = SYNC_RATE_WAIT_S
    rate_wait_max_s: float = SYNC_RATE_WAIT_MAX_S
    max_pages: int = SYNC_MAX_PAGES
    key_check_s: float = KEYRING_RECHECK_S
    progress_log_s: float = SYNC_PROGRESS_LOG_S
    links_settle_s: float = SYNC_LINKS_SETTLE_S

    @classmethod
    def of(cls, cfg: NodeConfig) -> PullSettings:
        return cls(page_limit=cfg.federation.sync_page_limit, interval_s=cfg.federation.sync_interval_s,
                   fetch_timeout_s=max(cfg.a2a.ack_timeout_s, SYNC_FETCH_MIN_S))


class PeerSync:
    """One peer's catch-up: pulls its change log after each (re)connect (``want``) and every ``interval_s``, from
    the last seq applied from it (its cursor, kept in peer_state); the interval heals a one-way outage that
    never drops our link to the peer. ``links``: every peer's link (writers linked to us directly are skipped:
    we get their changes from them). Every ``key_check_s`` it looks whether the keyring changed, to verify the
    parked ``unknown_key`` items again. ``restore``: a restore from the mesh in progress (its pulls ask for this
    node's own writes too, until this peer's log was read to its end once)."""

    def __init__(self, peer: str, links: Mapping[str, SyncLink], pulled: PulledPages, accepts: PeerAccepts,
                 db: Database, settings: PullSettings, restore: RestoreProgress | None = None) -> None:
        self.peer = peer
        self.link = links[peer]
        self.links = links
        self.pulled = pulled
        self.accepts = accepts
        self.db = db
        self.settings = settings
        self.restore = restore
        self.wanted = asyncio.Event()
        # How this peer's pulled items went, and the rounds that failed (sync_failed).
        self.stats: Counter[str] = Counter()
        # time.monotonic() of the last completed pull; None before the first.
        self.synced_at: float | None = None
        # How far the pulls got (status, /metrics, the log).
        self.progress = CatchUp()
        self._stopping = False
        # The peer's parking is full (a page stalled): logged once until a page goes through again.
        self._stalled = False
        self._recheck_failing = False
        # Rounds failing on our own database: logged once while it lasts (node/pause.py).
        self.pause = StoragePause(f"sync:{peer}", pull_log)

    def want(self) -> None:
        """Pull now (the link came up)."""
        self.wanted.set()

    def stop(self) -> None:
        """End the loop at its next wake-up (the node is draining)."""
        self._stopping = True
        self.wanted.set()

    async def run(self) -> None:
        """The pull loop, until ``stop``: whatever a peer or the disk does, a failed round is logged and counted,
        and the next round retries (after a round our own database refused, as soon as the pause is over)."""
        next_pull = time.monotonic() + self.settings.interval_s
        while not self._stopping:
            wait_s = min(self.settings.key_check_s, max(0.0, next_pull - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wanted.wait(), wait_s)
            if self._stopping:
                return
            if not self.wanted.is_set() and time.monotonic() < next_pull:
                await self._recheck_keys()
                continue
            self.wanted.clear()
            next_pull = time.monotonic() + self.settings.interval_s
            if self.link.state is not LinkState.UP:
                await self._recheck_keys()
                continue
            try:
                await self.pull()
            except StorageError as e:  # our database away, full or damaged: logged once while it lasts
                self.stats["sync_failed"] += 1
                next_pull = min(next_pull, time.monotonic() + self.pause.failed(e, "pull"))
            except Exception as e:  # the node keeps running; the next round retries
                self.stats["sync_failed"] += 1
                pull_log.warning("sync_failed", extra={"ev": {"peer": self.peer,
                                                              "error": f"{type(e).__name__}: {e}"}})
            else:
                self.pause.ok()

    async def _recheck_keys(self) -> None:
        """Verify the parked ``unknown_key`` items again if the keyring changed; a failure is logged once until
        a check goes through, and the next wake-up tries again."""
        try:
            checked = await self.pulled.recheck_keys(self.peer)
        except Exception as e:  # the node keeps running; the next wake-up retries
            if not self._recheck_failing:
                pull_log.warning("unknown_key_recheck_failed", extra={"ev": {"peer": self.peer,
                                                                             "error": f"{type(e).__name__}: {e}"}})
            self._recheck_failing = True
            return
        self._recheck_failing = False
        if checked:
            self.stats.update(checked)

    async def pull(self) -> int:
        """Verify the parked ``unknown_key`` items again if the keyring changed, retry what earlier rounds could
        not apply, then apply the peer's changes since our last sync seq.

        The cursor moves on past every page: an item that cannot be applied yet waits in ``sync_pending`` and is
        parked after ``federation.sync_park_after`` rounds, one that may be signed by an unknown key is parked at
        once; only a page with an ``unknown_key`` item this peer has no parking room left for holds the cursor
        before it. Returns how many items changed something here.
        """
        outcome = SyncOutcome(await self.pulled.recheck_keys(self.peer) or {})
        outcome.update(await self.pulled.retry_pending(self.peer))
        state = await self.db.read(changelog.get_peer_state, self.peer)
        since = state.last_sync_seq if state else 0
        await self._links_settled()
        skip = ",".join(sorted(p for p, other in self.links.items()
                               if p != self.peer and other.state is LinkState.UP))
        restoring = self.restore is not None and self.restore.wants(self.peer)
        waited_s, told = 0.0, 0  # told: the items applied this round the restore's progress counts already
        self.progress.cursor = self.progress.base = since
        round_log = _RoundLog(time.monotonic(), self.progress.pulled)
        ahead = _PageAhead()
        try:
            for _ in range(self.settings.max_pages):
                page = await (ahead.take() if ahead.asked else self._page(since, skip, waited_s, restoring))
                if page is None:  # refused for now: waited, ask again
                    waited_s += self.settings.rate_wait_s
                    continue
                if page["more"]:  # the next page is read by the peer while this one is applied here
                    ahead.ask(self._page(page["next"], skip, waited_s, restoring))
                if self.accepts.note(self.peer, page.get("accepts")):
                    await self.db.write(changelog.set_peer_accepts, self.peer, sorted(self.accepts.of(self.peer)))
                got = await self.pulled.apply(self.peer, page["items"])
                outcome.update(got)
                if self._held_at(since, got["stalled"]):
                    break
                if page["next"] > since:
                    since = page["next"]
                    await self.db.write(partial(changelog.set_peer_state, peer=self.peer, last_sync_seq=since))
                self._progressed(page, since, round_log)
                if restoring and self.restore is not None:
                    # Read to its end with nothing from it still waiting to be applied (a link ahead of its memory).
                    self.restore.page(self.peer, since, page.get("head"), outcome["applied"] - told,
                                      done=not page["more"] and not outcome["pending"], own=page.get("mine") is True)
                    told = outcome["applied"]
                if not page["more"]:
                    break
        finally:
            await ahead.drop()  # a page asked ahead of a round that ended (stalled, failed, or out of pages)
        self.stats.update(outcome)
        self.synced_at = time.monotonic()
        level = logging.INFO if outcome["applied"] or outcome["pending"] or outcome["parked"] \
            or outcome["unknown_key"] or outcome["stalled"] else logging.DEBUG
        pull_log.log(level, "synced", extra={"ev": {"peer": self.peer, "last_sync_seq": since, **outcome}})
        if round_log.logged:
            pull_log.info("sync_caught_up", extra={"ev": {"peer": self.peer, **round_log.figures(self.progress)}})
        return outcome["applied"]

    async def _links_settled(self) -> None:
        """Before this peer's first pull since start: wait, at most ``links_settle_s``, while another peer's link
        is still connecting. A writer linked to us directly is skipped in every other peer's pages
        only once its link is up; pulled before, a joining node would read each writer's changes from every peer
        that came up first (on a replicated mesh, most of the catch-up twice or more)."""
        if self.synced_at is not None:
            return
        step_s = 0.05
        for _ in range(max(1, int(self.settings.links_settle_s / step_s))):
            if not any(link.state is LinkState.CONNECTING for p, link in self.links.items() if p != self.peer):
                return
            await asyncio.sleep(step_s)

    def _progressed(self, page: dict[str, Any], since: int, round_log: _RoundLog) -> None:
        """Note one page in ``progress``; while more pages follow, log sync_progress every ``progress_log_s``."""
        p = self.progress
        items = page["items"]
        if p.pulled == round_log.pulled_at_start and p.base == 0 and items and isinstance(items[0], dict) \
                and isinstance(items[0].get("seq"), int):
            p.base = items[0]["seq"] - 1  # a first pull: count from the log's first seq (a restored log starts high)
        p.pulled += len(items)
        p.cursor = since
        head = page.get("head")
        # An older peer's page has no head: the page's end is as far as it says.
        p.head = max(head, since) if isinstance(head, int) and not isinstance(head, bool) else since
        now = time.monotonic()
        if page["more"] and now - round_log.logged_at >= self.settings.progress_log_s:
            round_log.logged_at, round_log.logged = now, True
            pull_log.info("sync_progress", extra={"ev": {"peer": self.peer, **round_log.figures(p)}})

    def _held_at(self, since: int, stalled: int) -> bool:
        """True when the page's ``unknown_key`` items found no parking room: the cursor stays at ``since`` (the
        page is read again next round); logged once per stall."""
        if stalled and not self._stalled:
            log.warning("sync_parking_full", extra={"ev": {
                "peer": self.peer, "held_at_seq": since, "parked_unknown_key_max": self.pulled.park_max,
                "effect": "this peer's change log is not read past this point until its parked unknown_key items "
                          "are applied (import the signers' key history) or federation.sync_park_max is raised"}})
        elif not stalled and self._stalled:
            log.info("sync_parking_room", extra={"ev": {"peer": self.peer, "seq": since}})
        self._stalled = bool(stalled)
        return self._stalled

    async def _page(self, since: int, skip: str, waited_s: float, mine: bool) -> dict[str, Any] | None:
        """One page after ``since`` (``mine``: with this node's own writes, for a restore), or None after waiting
        ``rate_wait_s`` when the peer refused it for our request budget (and ``rate_wait_max_s`` is not spent yet
        this round)."""
        s = self.settings
        # ``accepts``: what this node reads, so the page carries memory versions in the form it reads (an older
        # node's pages ignore it).
        params: dict[str, int | str] = {"since": since, "limit": s.page_limit, "skip": skip,
                                        "accepts": ",".join(ACCEPTS)}
        if mine:
            params["mine"] = 1  # a node older than the restore ignores it (and serves no "mine": true)
        try:
            body = await self.link.fetch(SYNC_PATH, params, timeout_s=s.fetch_timeout_s)
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
