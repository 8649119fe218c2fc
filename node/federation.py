"""Federation policy: what goes to which peer, how inbound changes are applied, catch-up pages, quorum.

Outbound: each local write enqueues one envelope per target peer in its own transaction.
Inbound: ``apply(env, sender)`` validates the payload, bounds it as a local write is bounded, checks who
may write what (a memory version by its creator or a named writer, signed; a link where the sender may
see both ends), verifies signatures off the event loop (in batches on a worker thread: Ed25519 verify
holds the GIL for each ~70 us call, but the loop gets the GIL back between calls, so a burst never
stalls it for a whole batch), commits, then the ACK is sent.

Nothing here imports the service: the node builds both (``node.assemble``) and the service reaches
this module only through its ``Replicator`` protocol.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import cbor2
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from a2a import Ack, Envelope, ProtocolError, validate_payload
from a2a.envelope import RETRYABLE_REJECT_CODES
from a2a.kinds import LINKS_PUT_MAX_BYTES, LINKS_PUT_MAX_ITEMS
from node import attest, priority
from node.attest import AttestLevel, InvalidationPayload, LinkPayload, MemoryPayload, TranscriptPayload
from node.config import NodeConfig
from node.errors import ServiceError
from node.hooks import HookError, HookEvent, Hooks, NoHooks
from node.kg import invalidation_wire
from node.limits import check_confidence, check_db_budget, check_memory_fields, check_text
from node.permissions.gate import Gate, refusal
from node.permissions.rules import Operation
from node.ratelimit import RateLimiter
from node.transcripts import inbound_row, scope_of, spans_of, transcript_wire
from node.trust import Keyring
from node.wire import envelope_wires, link_dict, link_wire, memory_dict, memory_put_body
from storage import changelog, events, graph, links, memories, outbox, transcripts
from storage.db import Database
from storage.errors import StorageError
from storage.graph import InvalidationRow
from storage.links import LinkRow
from storage.memories import MemoryRow, Reach

log = logging.getLogger("node.federation")

I = TypeVar("I")  # noqa: E741 - a batched call's item
R = TypeVar("R")

Clock = Callable[[], int]
# The outbox rows a write enqueued, one per peer (node.service.Queued).
Queued = list[outbox.OutboxRow]
# A signature to check: the signer's keys, the signed payload, the signature.
VerifyItem = tuple[tuple[Ed25519PublicKey, ...], LinkPayload | MemoryPayload, bytes | None]

# Most signatures verified in one hop to the thread pool.
VERIFY_BATCH_MAX = 256
# A links.put's links taken through each stage of their apply between two turns of the loop (a ping's read
# waits behind at most this many links' parsing, checks or hooks, not a whole envelope's).
APPLY_SLICE = 16
# Quorum waits recheck the outbox at least this often (ACKs made by another process wake nobody here).
QUORUM_RECHECK_S = 0.05
# Payload kinds the change log carries (GET /a2a/v1/sync): a peer that synced to the end holds them all.
SYNCED_KINDS = ("memory.put", "link.put", "links.put", "link.invalidate", "transcript.put")
# Payload kinds this node reads beyond the ones every node reads, listed in its sync pages (``accepts``): a peer
# sends it such a payload only once a page said so (an older node's pages say nothing, so it gets one link per
# envelope).
ACCEPTS = ("links.put",)
# Most bytes of transcript frames one sync page carries; past it the page ends early (more = true).
SYNC_PAGE_TRANSCRIPT_BYTES = 8 * 1024 * 1024
ORPHAN_RECHECK_S = 0.1
# An inbound signature is checked against the keyring as last read when it was read less than this long ago
# (as the WebSocket membership check: a removed .pub stops verifying within a second); an unknown signer or a
# signature that does not verify always reads the key directories again first.
KEYRING_RECHECK_S = 1.0
# Pending sync items retried per peer per pull round.
PENDING_RETRY_MAX = 1000


@dataclass(frozen=True, slots=True)
class Applied:
    """How an inbound change went: ``code`` None is accepted (ACK ok), else the reject code;
    ``changed`` is True only when something was stored (not for duplicates, stale or hidden versions)."""

    code: str | None
    changed: bool = False


OK_UNCHANGED = Applied(None)
OK_CHANGED = Applied(None, True)


class TurnBatch(Generic[I, R]):
    """Calls made in one loop turn, run together as one ``run(items) -> results`` (one reader or writer hop
    for the links of a batch frame instead of one per link). A failed run fails each of its calls."""

    def __init__(self, run: Callable[[list[I]], Awaitable[list[R]]], max_items: int = VERIFY_BATCH_MAX) -> None:
        self.run = run
        self.max_items = max_items
        self._queue: list[tuple[I, asyncio.Future[R]]] = []
        self._scheduled = False
        # The runs in progress (owned here until they finish).
        self._running: set[asyncio.Task[None]] = set()
        self.runs = 0

    async def __call__(self, item: I) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._queue.append((item, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._scheduled = False
        while self._queue:
            batch, self._queue = self._queue[:self.max_items], self._queue[self.max_items:]
            self.runs += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[tuple[I, asyncio.Future[R]]]) -> None:
        try:
            results = await self.run([item for item, _ in batch])
        except BaseException as e:  # noqa: BLE001 - each caller gets it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)


class VerifyBatcher:
    """Runs signature checks as batches on a thread: those made in one loop turn together (``verify``), or a
    run's list in one hop (``verify_many``)."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.executor = executor
        self._turn: TurnBatch[VerifyItem, bool] = TurnBatch(self._hop)
        self._runs = 0
        self.verified = 0

    @property
    def batches(self) -> int:
        return self._turn.runs + self._runs

    async def verify(self, item: VerifyItem) -> bool:
        """True when the item's signature verifies under one of its keys (a signer's keyring), checked with
        the other checks of this loop turn."""
        return await self._turn(item)

    async def verify_many(self, items: list[VerifyItem]) -> list[bool]:
        """Each item's ``verify`` answer, in one hop to the thread."""
        self._runs += 1
        return await self._hop(items)

    async def _hop(self, items: list[VerifyItem]) -> list[bool]:
        self.verified += len(items)
        return await asyncio.get_running_loop().run_in_executor(self.executor, attest.verify_many, items)


@dataclass(frozen=True, slots=True)
class _LinkLookup:
    """What an inbound link needs read first: is it stored already, and its ends as stored here."""

    stored: bool
    ends: dict[str, Reach]


@dataclass(slots=True)
class _InboundLink:
    """One received link on its way through the apply stages (``Federation._apply_link_run``)."""

    body: dict[str, Any]  # the link.put body: link, signature, signed_by
    payload: LinkPayload
    link_id: str
    ids: frozenset[str]  # its two ends
    now: int  # when it was taken in (unix ms): its bounds' clock and its row's created_at
    ends: dict[str, Reach] = field(default_factory=dict)  # as read with its lookup (or after its hold)
    level: AttestLevel = AttestLevel.UNSIGNED
    hook_payload: dict[str, Any] = field(default_factory=dict)

    @property
    def signature(self) -> bytes | None:
        sig: bytes | None = self.body["signature"]
        return sig

    def attested(self, level: AttestLevel, sender: str) -> None:
        """Verified as ``level``: what its hooks are told."""
        self.level = level
        self.hook_payload = {"sender": sender, "link": self.body["link"], "signed_by": self.body["signed_by"],
                             "attest_level": str(level)}

    def row(self, sender: str) -> LinkRow:
        """The row it is stored as, once attested."""
        signature, signed_by = self.body["signature"], self.body["signed_by"]
        attested = self.level is AttestLevel.PEER_ATTESTED
        # confidence is outside the signature: taken only from the link's own observer, never from a relay.
        confidence = self.body["link"].get("confidence") if sender == self.payload.observed_by else None
        return LinkRow(link_id=self.link_id, **self.payload.to_dict(),
                       confidence=None if confidence is None else float(confidence),
                       signature=signature if attested else None, attest_level=str(self.level),
                       signed_by=signed_by if attested else None, received_from=sender, created_at=self.now)


@dataclass(frozen=True, slots=True)
class _LinkHops:
    """How a run of inbound links reaches the reader, the verify thread and the writer: a links.put's links
    directly, one hop each for the run; a link.put through the loop turn's TurnBatch (one hop shared with the
    turn's other envelopes)."""

    lookup: Callable[[list[tuple[str, frozenset[str]]]], Awaitable[list[_LinkLookup]]]
    verify: Callable[[list[VerifyItem]], Awaitable[list[bool]]]
    write: Callable[[list[tuple[LinkRow, str]]], Awaitable[list[bool]]]


async def _sliced(items: Iterable[I]) -> AsyncIterator[I]:
    """``items``, letting the loop turn after every APPLY_SLICE of them."""
    for n, item in enumerate(items):
        if n and not n % APPLY_SLICE:
            await asyncio.sleep(0)
        yield item


async def _each(call: Callable[[I], Awaitable[R]], items: Sequence[I], *, together: bool) -> list[R | BaseException]:
    """``call`` on each item, each outcome (its result or its exception) in order: one after another, the loop
    turning every APPLY_SLICE items, or all at once (one task each) when ``together`` (e.g. each may wait on a
    hook program)."""
    if together:
        return await asyncio.gather(*(call(item) for item in items), return_exceptions=True)
    out: list[R | BaseException] = []
    async for item in _sliced(items):
        try:
            out.append(await call(item))
        except Exception as e:  # noqa: BLE001 - the item's outcome, as gather's return_exceptions gives it
            out.append(e)
    return out


def _one_at_a_time(call: Callable[[I], Awaitable[R]]) -> Callable[[list[I]], Awaitable[list[R]]]:
    """A list hop made of a single-item one (a TurnBatch's call)."""
    async def run(items: list[I]) -> list[R]:
        return [await call(item) for item in items]
    return run


class Federation:
    """The node's replication policy; the service's ``Replicator``."""

    def __init__(self, cfg: NodeConfig, db: Database, keyring: Keyring, clock: Clock,
                 hooks: Hooks | None = None, gate: Gate | None = None) -> None:
        self.cfg = cfg
        # The same permission gate as local operations: a peer's write is admitted as a local one is.
        self.gate = gate
        # limits.peer_requests_per_second: live messages per peer (None = no limit).
        rate = cfg.limits.peer_requests_per_second
        self.peer_rate = RateLimiter(rate) if rate else None
        # Told of each stored inbound memory and link as (event, data), e.g. the webhooks' publish.
        self.sinks: list[Callable[[str, dict[str, Any]], Awaitable[None]]] = []
        # Operator hooks on inbound changes (pre/post_federated_*, docs/hooks.md).
        self.hooks: Hooks = hooks if hooks is not None else NoHooks()
        self.db = db
        self.keyring = keyring
        self.clock = clock
        self.peers = {p.agent_id: p for p in cfg.mesh.peers}
        self.counters: Counter[str] = Counter()
        # One worker: verification is GIL-bound, so more threads would add switching, not throughput.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify",
                                            initializer=priority.lower_this_thread,
                                            initargs=(cfg.federation.background_nice,))
        self.verifier = VerifyBatcher(self._executor)
        # The inbound links of one loop turn (a batch frame's) share one read and one write.
        self._link_lookups: TurnBatch[tuple[str, frozenset[str]], _LinkLookup] = TurnBatch(self._lookup_links)
        self._link_writes: TurnBatch[tuple[LinkRow, str], bool] = TurnBatch(self._write_links)
        self._turn_hops = _LinkHops(_one_at_a_time(self._link_lookups), _one_at_a_time(self.verifier.verify),
                                    _one_at_a_time(self._link_writes))
        self._run_hops = _LinkHops(self._lookup_links, self.verifier.verify_many, self._write_links)
        self._ack_changed = asyncio.Condition()
        self._memory_arrived = asyncio.Condition()
        # Set by the running node: gives its outbox sender the rows a write enqueued, once committed.
        self.on_enqueued: Callable[[Queued], None] | None = None
        self._keyring_read_at = float("-inf")
        # What each peer's last sync page said it accepts beyond the common kinds (ACCEPTS); none until then.
        self.peer_accepts: dict[str, frozenset[str]] = {}

    @property
    def agent_id(self) -> str:
        return self.keyring.agent_id

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- who sees what --------------------------------------------------------------------

    def shares(self, peer: str, namespace: str) -> bool:
        """This node's own policy lets ``peer`` see ``namespace``."""
        policy = self.cfg.federation.namespaces.get(namespace)
        return policy is None or peer in policy.peers

    def visible_to(self, peer: str, m: MemoryRow | Reach) -> bool:
        """``peer`` may see memory ``m``: by this node's policy and by the list that travelled with it."""
        return self.shares(peer, m.namespace) and (m.share_with is None or peer in m.share_with)

    def may_write(self, writer: str, origin: str, namespace: str) -> bool:
        """A version of a memory created by ``origin`` may be written by ``writer``."""
        policy = self.cfg.federation.namespaces.get(namespace)
        return writer == origin or (policy is not None and writer in policy.writers)

    # ---- outbound (the service's Replicator) ----------------------------------------------

    def enqueue(self, conn: Any, payload: dict[str, Any], scope: Sequence[MemoryRow], ts: int) -> Queued:
        """Inside the write transaction: one outbox row per peer that may see every memory in ``scope``
        (a memory version: itself; a link: both its ends). Returns the rows queued."""
        return self._enqueue_to(conn, self._audience(scope), payload, ts, int(self.cfg.a2a.ttl_s * 1000))

    def enqueue_links(self, conn: Any, items: Sequence[tuple[dict[str, Any], Sequence[MemoryRow]]],
                      ts: int) -> list[Queued]:
        """Inside the write transaction: the link.put bodies of one batch of links (each with its scope, both
        ends), queued per peer that may see them; returns each item's rows (a row may carry several items).
        A peer that accepts ``links.put`` gets its links packed into as few envelopes as the bounds allow (one
        outbox row and one ACK for up to ``federation.links_per_envelope`` links); any other peer gets one link.put
        each."""
        ttl_ms = int(self.cfg.a2a.ttl_s * 1000)
        per_item: list[Queued] = [[] for _ in items]
        alone: dict[int, list[str]] = {}  # item -> the peers that get it as a link.put of its own
        packed: dict[str, list[int]] = {}  # peer -> the items it gets in links.put envelopes
        for i, (_, scope) in enumerate(items):
            for peer in self._audience(scope):
                if self.takes_link_batches(peer):
                    packed.setdefault(peer, []).append(i)
                else:
                    alone.setdefault(i, []).append(peer)
        groups: dict[tuple[int, ...], list[str]] = {}  # peers that get the same items share their envelopes' encoding
        for peer, idx in packed.items():
            groups.setdefault(tuple(idx), []).append(peer)
        for idx, peers in groups.items():
            for chunk in _link_chunks([items[i][0] for i in idx], self.cfg.federation.links_per_envelope):
                if len(chunk) == 1:
                    alone.setdefault(idx[chunk[0]], []).extend(peers)
                    continue
                payload = {"kind": "links.put", "links": [items[idx[c]][0] for c in chunk]}
                rows = self._enqueue_to(conn, peers, payload, ts, ttl_ms)
                for c in chunk:
                    per_item[idx[c]].extend(rows)
        for i, peers in alone.items():
            per_item[i].extend(self._enqueue_to(conn, peers, {"kind": "link.put", **items[i][0]}, ts, ttl_ms))
        return per_item

    def _enqueue_to(self, conn: Any, peers: Sequence[str], payload: dict[str, Any], ts: int, ttl_ms: int) -> Queued:
        wires = envelope_wires(self.agent_id, peers, payload, ts, ttl_ms)  # validated and encoded once
        queued = []
        for peer, (cid, wire) in zip(peers, wires, strict=True):
            row = outbox.enqueue_row(conn, cid, peer, str(payload["kind"]), wire, ts + ttl_ms, ts, ts)
            if row is not None:  # a fresh correlation id: always, unless uuid4 collided
                queued.append(row)
        return queued

    def takes_link_batches(self, peer: str) -> bool:
        """``peer`` said (in its last sync page) that it reads ``links.put``."""
        return "links.put" in self.peer_accepts.get(peer, ())

    def note_accepts(self, peer: str, accepts: Any) -> None:
        """What ``peer``'s sync page listed under ``accepts`` (absent on an older node: nothing beyond the
        common kinds)."""
        listed = accepts if isinstance(accepts, list) else []
        self.peer_accepts[peer] = frozenset(k for k in listed if isinstance(k, str) and k in ACCEPTS)

    def refuses_link_batches(self, peer: str) -> None:
        """``peer`` answered a links.put ``unknown_kind`` (e.g. rolled back to an older version): one link per
        envelope from now on, until its sync pages list ``links.put`` again."""
        self.peer_accepts[peer] = self.peer_accepts.get(peer, frozenset()) - {"links.put"}

    def _audience(self, scope: Sequence[MemoryRow]) -> list[str]:
        """Configured peers that may see every memory in ``scope`` (by policy and by ``share_with``)."""
        return [p for p in self.peers if all(self.visible_to(p, m) for m in scope)]

    def hand_off(self, queued: Queued) -> None:
        """After the commit: the rows go to the running node's sender in memory (the database stays the
        truth: rows nobody takes here, e.g. written by the CLI, are found by the sender's poll)."""
        if self.on_enqueued is not None:
            self.on_enqueued(queued)

    async def record_ack(self, peer: str, correlation_ids: Sequence[str]) -> None:
        async with self._ack_changed:
            self._ack_changed.notify_all()

    async def await_quorum(self, queued: Queued, scope: Sequence[MemoryRow]) -> int:
        """Wait until the configured write quorum has ACKed (self counts as one); returns nodes that ACKed.

        A row leaves the outbox only on its peer's ACK, so "gone from the outbox" is the ACK, whichever
        process (this node or a CLI beside it) made the write.
        """
        nodes = 1 + len(self._audience(scope))
        need = self.cfg.quorum_size(nodes)
        if need <= 1:
            return 1
        cids = [q.correlation_id for q in queued]
        timeout = self.cfg.federation.quorum_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            acked = 1 + len(cids) - await self.db.read(outbox.undelivered_count, cids)
            if acked >= need:
                return acked
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ServiceError(
                    "quorum_not_reached",
                    f"{acked} of {need} required nodes ({nodes} in the federation for this write) ACKed "
                    f"within {timeout:g} s; the write is committed locally and keeps replicating")
            try:
                async with self._ack_changed:
                    await asyncio.wait_for(self._ack_changed.wait(), min(remaining, QUORUM_RECHECK_S))
            except TimeoutError:
                pass

    # ---- inbound --------------------------------------------------------------------------

    async def apply(self, env: Envelope, sender: str) -> Ack:
        """The mesh receiver's apply: commit the change, then answer Ack.ok / Ack.rejected(code)."""
        limited = self._rate_limited(env, sender)
        if limited is not None:
            return limited
        applied = await self.apply_payload(env.payload, sender)
        if applied.code is None:
            return Ack.ok(env.correlation_id, self.agent_id)
        return Ack.rejected(env.correlation_id, self.agent_id, applied.code)

    def apply_now(self, env: Envelope, sender: str) -> Ack | None:
        """``apply`` for a ping, without a coroutine (a ping stores nothing and waits for nothing): the same
        rate limit, payload check and ACK, or the same ProtocolError. None for every other kind (``apply``
        then runs)."""
        if env.payload.get("kind") != "ping":
            return None
        limited = self._rate_limited(env, sender)
        if limited is not None:
            return limited
        validate_payload(env.payload)
        return Ack.ok(env.correlation_id, self.agent_id)

    def _rate_limited(self, env: Envelope, sender: str) -> Ack | None:
        """Spend ``sender``'s token for ``env`` (a links.put spends one per link); the rate_limited ACK when
        none is left."""
        if self.peer_rate is None:
            return None
        if self.peer_rate.wait_s(sender):
            self.counters["rejected:rate_limited"] += 1
            return Ack.rejected(env.correlation_id, self.agent_id, "rate_limited")
        packed = env.payload.get("links") if env.payload.get("kind") == "links.put" else None
        if isinstance(packed, list):
            # A links.put is as many messages as it carries links: the envelope got in on one token,
            # the rest is charged now (into debt, so the peer's next messages wait for it).
            self.peer_rate.charge(sender, len(packed) - 1)
        return None

    async def apply_payload(self, payload: Any, sender: str) -> Applied:
        """Validate and apply one payload from ``sender`` (live or pulled); ProtocolError when malformed."""
        validate_payload(payload)
        kind = payload["kind"]
        if kind == "ping":
            return OK_UNCHANGED
        if kind == "memory.put":
            applied = await self.apply_memory(payload, sender)
        elif kind == "link.put":
            applied = await self.apply_link(payload, sender)
        elif kind == "links.put":
            return await self.apply_links(payload, sender)  # each link's rejection counted on its own
        elif kind == "link.invalidate":
            applied = await self.apply_invalidation(payload, sender)
        elif kind == "transcript.put":
            applied = await self.apply_transcript(payload, sender)
        else:  # validate_payload knows the kind but this node has no handler for it
            applied = Applied("unsupported_kind")
        if applied.code is not None:
            self.counters[f"rejected:{applied.code}"] += 1
        return applied

    async def apply_memory(self, body: dict[str, Any], sender: str) -> Applied:
        """Bound, authorise, verify and store one memory version; see docs/security.md for the rules."""
        m = body["memory"]
        code = self._memory_out_of_bounds(m) or self._memory_not_allowed(body, sender)
        if code is not None:
            return self._refused(code, sender, m)
        level = await self._attest(MemoryPayload.from_mapping(m), body["signature"], m["writer"], sender,
                                   what=m["id"])
        if isinstance(level, Applied):
            return level
        stored = await self.db.read(memories.get, m["id"])
        if stored is not None and not self.visible_to(sender, stored):
            # Answered exactly as if absent: an ACK never tells a peer whether a memory it may not see exists.
            return await self._as_if_absent(m, sender)
        operation = Operation.STORE if stored is None else Operation.UPDATE
        code = (_against_stored(stored, m, self.cfg.federation.max_version_step)
                or await self._gate_code(sender, m["namespace"], operation)
                or (await self._quota_code(m) if stored is None else None))
        if code is not None:
            return self._refused(code, sender, m)
        row = _memory_row(body, level, sender)
        try:
            check_db_budget(self.cfg, self.db.bytes_used())
            await self.hooks.fire(HookEvent.PRE_FEDERATED_MEMORY, {"sender": sender, "memory": m})
        except (ServiceError, HookError) as e:  # a hook refusal is permanent and carries the hook's code
            return self._refused(e.code, sender, m)
        applied = await self._store_memory(row, sender)
        await self.hooks.fire(HookEvent.POST_FEDERATED_MEMORY, {"sender": sender, "memory": m,
                                                                "stored": applied.changed})
        return applied

    async def _as_if_absent(self, m: dict[str, Any], sender: str) -> Applied:
        """The answer an unknown id would get, without storing anything (the id is one ``sender`` may not see)."""
        code = _against_stored(None, m, self.cfg.federation.max_version_step)
        if code is None:
            try:
                check_db_budget(self.cfg, self.db.bytes_used())
                await self.hooks.fire(HookEvent.PRE_FEDERATED_MEMORY, {"sender": sender, "memory": m})
            except (ServiceError, HookError) as e:
                code = e.code
        if code is not None:
            return self._refused(code, sender, m)
        log.warning("hidden_id_conflict", extra={"ev": {"peer": sender, "memory_id": m["id"]}})
        self.counters["memory:hidden_conflict"] += 1
        return OK_UNCHANGED

    def _memory_out_of_bounds(self, m: dict[str, Any]) -> str | None:
        """The same limits as a local write, and times within ``max_clock_skew_s`` of this node's clock."""
        try:
            check_memory_fields(self.cfg.limits, m["content"], m["title"], m["namespace"], m["tags"],
                                m["priority"], m["confidence"], m["source"])
            for name in ("origin", "writer"):
                check_text(name, m[name], self.cfg.limits.max_id_chars, allow_empty=False)
        except ServiceError as e:
            return e.code
        skew_ms = int(self.cfg.federation.max_clock_skew_s * 1000)
        if m["created_at"] > m["updated_at"] or m["updated_at"] > self.clock() + skew_ms:
            return "clock_skew"
        return None

    def _memory_not_allowed(self, body: dict[str, Any], sender: str) -> str | None:
        m = body["memory"]
        if not self.shares(sender, m["namespace"]):
            return "namespace_not_allowed"
        if body["signed_by"] is not None and body["signed_by"] != m["writer"]:
            return "signer_mismatch"
        if not self.may_write(m["writer"], m["origin"], m["namespace"]):
            return "writer_not_allowed"
        return None

    def _refused(self, code: str, sender: str, m: dict[str, Any]) -> Applied:
        log.warning("memory_refused", extra={"ev": {"peer": sender, "code": code, "memory_id": m.get("id"),
                                                    "writer": m.get("writer"), "origin": m.get("origin")}})
        return Applied(code)

    async def _attest(self, payload: LinkPayload | MemoryPayload, signature: bytes | None, signer: str,
                      sender: str, *, what: str) -> AttestLevel | Applied:
        """PEER_ATTESTED when ``signature`` verifies under ``signer``'s keyring; UNSIGNED when the signer
        is unknown here (or did not sign) and sent it itself; otherwise the rejection."""
        keys, fresh = self._signer_keys(signer)
        verified = signature is not None and bool(keys) and await self.verifier.verify((keys, payload, signature))
        return await self._attest_level(verified, keys, fresh, payload, signature, signer, sender, what=what)

    def _signer_keys(self, signer: str) -> tuple[tuple[Ed25519PublicKey, ...], bool]:
        """``signer``'s keys, and True when the keyring was read just now (a failed check then looks no
        further)."""
        fresh = self._keyring_due()
        keys = self.keyring.keys_for(signer, reload=fresh)
        if not keys and not fresh:
            keys, fresh = self.keyring.keys_for(signer), True
        return keys, fresh

    async def _attest_level(self, verified: bool, keys: tuple[Ed25519PublicKey, ...], fresh: bool,
                            payload: LinkPayload | MemoryPayload, signature: bytes | None, signer: str, sender: str,
                            *, what: str) -> AttestLevel | Applied:
        """``_attest``'s answer once ``signature`` was checked against ``keys`` (``verified``; False when there
        was nothing to check)."""
        if verified:
            return AttestLevel.PEER_ATTESTED
        if signature is not None and keys:
            if not fresh:  # the key may have been rotated since the last read: look again before refusing
                generation = self.keyring.generation
                again = self.keyring.keys_for(signer)
                if self.keyring.generation != generation and again and \
                        await self.verifier.verify((again, payload, signature)):
                    return AttestLevel.PEER_ATTESTED
            self.counters["bad_signature"] += 1
            log.warning("bad_signature", extra={"ev": {"peer": sender, "id": what, "claimed_signer": signer}})
            await self.db.write(changelog.incr, "rejected:bad_signature")
            return Applied("bad_signature")
        if signer != sender:
            # Relaying another node's change is only legitimate when its signature verifies here.
            log.warning("unverified_relay", extra={"ev": {"peer": sender, "id": what, "signer": signer}})
            return Applied("unverified_relay")
        return AttestLevel.UNSIGNED

    def _keyring_due(self) -> bool:
        """True (and the clock restarts) when the keyring was last read KEYRING_RECHECK_S ago or more: a
        stat of the key directories per inbound signature was ~4% of a receiving node's CPU."""
        now = time.monotonic()
        if now - self._keyring_read_at < KEYRING_RECHECK_S:
            return False
        self._keyring_read_at = now
        return True

    async def _store_memory(self, row: MemoryRow, sender: str) -> Applied:
        step = self.cfg.federation.max_version_step
        kept: list[MemoryRow] = []

        def write(conn: Any) -> Applied:
            # Checked again inside the transaction: another version may have landed since the read.
            stored = memories.get(conn, row.id)
            if stored is not None and not self.visible_to(sender, stored):
                return OK_UNCHANGED
            code = _against_stored(stored, memory_wire_fields(row), step)
            if code is not None:
                return Applied(code)
            row_ = row if stored is None else _share_with_after(row, stored, self.agent_id)
            result = memories.apply_remote(conn, row_)
            if result not in ("inserted", "updated"):
                return OK_UNCHANGED
            kept.append(row_)
            now = self.clock()
            events.append(conn, "memory", None, row_.author, MemoryPayload.of(row_).version_hash,
                          row_.signature, now)
            changelog.append(conn, "memory", row_.id, row_.version, now)
            changelog.incr(conn, f"applied:memory.{result}")
            return OK_CHANGED

        applied = await self.db.write(write)
        self.counters["memory:stored" if applied.changed else "memory:unchanged"] += 1
        if applied.changed:
            async with self._memory_arrived:
                self._memory_arrived.notify_all()
            await self._tell("memory.stored", memory_dict(kept[-1]))
        return applied

    async def _tell(self, event: str, data: dict[str, Any]) -> None:
        for sink in self.sinks:
            await sink(event, data)

    async def apply_link(self, body: dict[str, Any], sender: str) -> Applied:
        """Verify and store one received link; stored only where the sender may see both its ends. The run of
        one link: its read, verify and write share their hops with the other link.put envelopes of the same
        loop turn (a batch frame's)."""
        [answer] = await self._apply_link_run([body], sender, self._turn_hops)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def apply_links(self, body: dict[str, Any], sender: str) -> Applied:
        """Each link of a links.put applied on its own, exactly as a link.put of its own (its signature verified
        alone; the links share one lookup read, one verify hop and one write). A rejected link does not stop the
        others. The one ACK: accepted when every link is stored (or was); else a retryable code when any link
        may be retried (the sender resends the envelope; the stored links come back as duplicates), else the
        first link's permanent code (the sender then resends the links one per envelope, so that each gets its
        own answer and only the refused ones are dead-lettered)."""
        self.counters["links.put"] += 1
        answers = await self._apply_link_run(body["links"], sender, self._run_hops)
        codes: list[str] = []
        changed = False
        for answer in answers:
            if isinstance(answer, ProtocolError):
                answer = Applied(answer.code)
            elif isinstance(answer, BaseException):
                raise answer  # storage trouble: no ACK, the sender retries the envelope
            changed = changed or answer.changed
            if answer.code is not None:
                self.counters[f"rejected:{answer.code}"] += 1
                codes.append(answer.code)
        code = next((c for c in codes if c in RETRYABLE_REJECT_CODES), codes[0] if codes else None)
        return Applied(code, changed)

    async def _apply_link_run(self, bodies: Sequence[dict[str, Any]], sender: str,
                              hops: _LinkHops) -> list[Applied | BaseException]:
        """Apply received links (link.put bodies) as one run of stages over all of them, with no task per link:
        parse and bounds, one lookup read, one verify hop, the pre_federated_link hooks and the checks of the
        ends, one write, then post hooks and sinks. Each stage lets the loop turn every APPLY_SLICE links, so a
        ping's read never waits behind a whole envelope's links. Each link's answer in order: an Applied, a
        ProtocolError when it is malformed, or what a hook or sink raised (the caller raises it: no ACK); a failed
        read or write is raised at once. A link whose ends are missing or hidden waits for them
        (``_ends_visible``) in a task of its own, without holding up the others."""
        answers: list[Applied | BaseException | None] = [None] * len(bodies)
        parsed: list[tuple[int, _InboundLink]] = []
        async for i, body in _sliced(enumerate(bodies)):
            try:
                got = self._inbound_link(body)
            except ProtocolError as e:
                answers[i] = e
                continue
            if isinstance(got, Applied):
                answers[i] = got
            else:
                parsed.append((i, got))
        held: list[tuple[int, asyncio.Task[Applied]]] = []
        try:
            await self._apply_parsed(parsed, sender, hops, answers, held)
        except BaseException:
            for _, task in held:
                task.cancel()
            await asyncio.gather(*(task for _, task in held), return_exceptions=True)
            raise
        for (i, _), result in zip(held, await asyncio.gather(*(task for _, task in held), return_exceptions=True),
                                  strict=True):
            answers[i] = result
        return [a if a is not None else OK_UNCHANGED for a in answers]

    async def _apply_parsed(self, parsed: list[tuple[int, _InboundLink]], sender: str, hops: _LinkHops,
                            answers: list[Applied | BaseException | None],
                            held: list[tuple[int, asyncio.Task[Applied]]]) -> None:
        """``_apply_link_run``'s stages after parsing: fills ``answers`` and ``held`` (the links waiting for
        their ends, each in its own task)."""
        looks = await hops.lookup([(x.link_id, x.ids) for _, x in parsed]) if parsed else []
        checked: list[tuple[int, _InboundLink, tuple[Ed25519PublicKey, ...], bool]] = []
        async for (i, x), look in _sliced(zip(parsed, looks, strict=True)):
            x.ends = look.ends
            code = self._link_not_new(x, look.stored, sender)
            if code is not None:
                answers[i] = code
            else:
                checked.append((i, x, *self._signer_keys(x.payload.observed_by)))
        # A check for each link that carries a signature and whose signer has keys here (None: nothing to check).
        items = [(keys, x.payload, x.signature) if x.signature is not None and keys else None
                 for _, x, keys, _ in checked]
        asked: list[VerifyItem] = [item for item in items if item is not None]
        verdicts = iter(await hops.verify(asked) if asked else [])
        attested: list[tuple[int, _InboundLink]] = []
        async for (i, x, keys, fresh), item in _sliced(zip(checked, items, strict=True)):
            verified = item is not None and next(verdicts)
            level = await self._attest_level(verified, keys, fresh, x.payload, x.signature, x.payload.observed_by,
                                             sender, what=x.link_id)
            if isinstance(level, Applied):
                answers[i] = level
            else:
                x.attested(level, sender)
                attested.append((i, x))
        fired = await _each(lambda ix: self.hooks.fire(HookEvent.PRE_FEDERATED_LINK, ix[1].hook_payload), attested,
                            together=self.hooks.attached(HookEvent.PRE_FEDERATED_LINK))
        ready: list[tuple[int, _InboundLink]] = []
        async for (i, x), hook in _sliced(zip(attested, fired, strict=True)):
            if isinstance(hook, BaseException):  # a hook refusal is permanent and carries the hook's code
                answers[i] = Applied(hook.code) if isinstance(hook, HookError) else hook
            elif not self._all_visible(sender, set(x.ids), x.ends):
                held.append((i, asyncio.get_running_loop().create_task(self._held_link(x, sender))))
            elif (refused := await self._gate_codes(sender, x.ends)) is not None:
                answers[i] = Applied(refused)
            else:
                ready.append((i, x))
        writes = [(x, x.row(sender)) for _, x in ready]
        stored = await hops.write([(row, str(x.level)) for x, row in writes]) if writes else []
        done = await _each(lambda item: self._link_stored(*item[0], item[1]), list(zip(writes, stored, strict=True)),
                           together=self.hooks.attached(HookEvent.POST_FEDERATED_LINK))
        for (i, _), answer in zip(ready, done, strict=True):
            answers[i] = answer

    def _inbound_link(self, body: dict[str, Any]) -> _InboundLink | Applied:
        """A received link parsed (ProtocolError when malformed) and bounded as a local one is, or its rejection."""
        try:
            payload = LinkPayload.from_mapping(body["link"])
        except attest.AttestError as e:
            raise ProtocolError("bad_payload", e.message) from None
        now = self.clock()
        code = self._link_out_of_bounds(payload, body["link"].get("confidence"), now)
        if code is not None:
            return Applied(code)
        return _InboundLink(body, payload, payload.link_id, frozenset({payload.src_id, payload.dst_id}), now)

    def _link_not_new(self, x: _InboundLink, stored: bool, sender: str) -> Applied | None:
        """Once looked up: the answer of a link stored already (a duplicate) or signed by another than its
        observer; None for one to verify."""
        if stored:
            self.counters["link:duplicate"] += 1
            return OK_UNCHANGED
        signed_by = x.body["signed_by"]
        if signed_by is not None and signed_by != x.payload.observed_by:
            log.warning("signer_mismatch", extra={"ev": {"peer": sender, "link_id": x.link_id, "signed_by": signed_by,
                                                         "observed_by": x.payload.observed_by}})
            return Applied("signer_mismatch")
        return None

    async def _held_link(self, x: _InboundLink, sender: str) -> Applied:
        """The rest of a link whose ends were missing or hidden at its lookup: held until they are here for the
        sender (``unknown_memory`` after ``orphan_hold_s``), then checked and written as any other."""
        ids = set(x.ids)
        if not await self._ends_visible(sender, ids):
            return Applied("unknown_memory")
        x.ends = await self.db.read(memories.reach_many, ids)
        code = await self._gate_codes(sender, x.ends)
        if code is not None:
            return Applied(code)
        row = x.row(sender)
        return await self._link_stored(x, row, await self._link_writes((row, str(x.level))))

    async def _link_stored(self, x: _InboundLink, row: LinkRow, stored: bool) -> Applied:
        """After the write: the counters, the post_federated_link hooks and the sinks (``stored`` False for a
        link stored meanwhile)."""
        self.counters[f"link:{x.level}" if stored else "link:duplicate"] += 1
        await self.hooks.fire(HookEvent.POST_FEDERATED_LINK, {**x.hook_payload, "stored": stored})
        if stored:
            await self._tell("link.attested", link_dict(row))
        return OK_CHANGED if stored else OK_UNCHANGED

    async def _lookup_links(self, asked: list[tuple[str, frozenset[str]]]) -> list[_LinkLookup]:
        """One read for the links of a turn: which are stored, and their ends."""
        def read(conn: Any) -> list[_LinkLookup]:
            ends = memories.reach_many(conn, set().union(*(ids for _, ids in asked)))
            here = links.stored_ids(conn, [link_id for link_id, _ in asked])
            return [_LinkLookup(link_id in here, {i: ends[i] for i in ids if i in ends}) for link_id, ids in asked]
        return await self.db.read(read)

    async def _write_links(self, rows: list[tuple[LinkRow, str]]) -> list[bool]:
        """One writer job for the verified links of a turn: each row with its audit event and change-log entry
        (False for one stored meanwhile); the applied counters once per level."""
        def write(conn: Any) -> list[bool]:
            stored: list[bool] = []
            applied: Counter[str] = Counter()
            here = links.stored_ids(conn, [row.link_id for row, _ in rows])  # one read for the batch
            fresh: list[LinkRow] = []
            for row, level in rows:
                if row.link_id in here:
                    stored.append(False)
                    continue
                here.add(row.link_id)  # the same link twice in one batch: the second is a duplicate
                fresh.append(row)
                applied[level] += 1
                stored.append(True)
            # Each table's rows in one statement: a links.put's hundred links cost three, not three hundred.
            links.insert_many(conn, fresh)
            events.append_many(conn, "link", [(row.link_id, row.observed_by, row.link_id, row.signature,
                                               row.created_at) for row in fresh])
            changelog.append_many(conn, "link", [(row.link_id, 1, row.created_at) for row in fresh])
            for level, n in sorted(applied.items()):
                changelog.incr(conn, f"applied:link.{level}", n)
            return stored
        return await self.db.write(write)

    def _link_out_of_bounds(self, payload: LinkPayload, confidence: Any, now: int) -> str | None:
        lim = self.cfg.limits
        try:
            for name in ("src_id", "dst_id", "observed_by"):
                check_text(name, getattr(payload, name), lim.max_id_chars, allow_empty=False)
            check_text("relation", payload.relation, lim.max_relation_chars, allow_empty=False)
            if confidence is not None:
                check_confidence(confidence)
        except ServiceError as e:
            return e.code
        if payload.valid_from > now + int(self.cfg.federation.max_clock_skew_s * 1000):
            return "clock_skew"
        if payload.valid_until is not None and payload.valid_until < now:
            return "expired_link"
        return None

    async def _gate_codes(self, sender: str, ends: dict[str, Reach]) -> str | None:
        """The permission gate's answer to ``sender`` linking memories in the namespaces of ``ends``."""
        if self.gate is not None:
            for ns in sorted({m.namespace for m in ends.values()}):
                code = await self._gate_code(sender, ns, Operation.LINK)
                if code is not None:
                    return code
        return None

    async def _quota_code(self, m: dict[str, Any]) -> str | None:
        """A new memory past its writer's storage quota is refused, as a local one is."""
        if self.gate is None:
            return None
        return await self.gate.quota_code(m["writer"], len(m["content"].encode()) + len(m["title"].encode()))

    async def _gate_code(self, sender: str, namespace: str, operation: Operation) -> str | None:
        """The reject code when the permission gate stops ``sender``'s write, as it would a local one."""
        if self.gate is None:
            return None
        stop = refusal(await self.gate.admit(sender, namespace, operation))
        return None if stop is None else stop[0]

    def _all_visible(self, sender: str, ids: set[str], found: dict[str, Reach]) -> bool:
        return {i for i, m in found.items() if self.visible_to(sender, m)} == ids

    async def _ends_visible(self, sender: str, ids: set[str]) -> bool:
        """True once every id is stored and ``sender`` may see it; waits up to ``orphan_hold_s`` for a
        memory.put still in flight. A memory the sender may not see answers exactly as a missing one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.federation.orphan_hold_s
        while True:
            found = await self.db.read(memories.reach_many, ids)
            # A memory the sender may not see counts as missing, also in time: it waits the same hold.
            if self._all_visible(sender, ids, found):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            # Woken by each applied memory; the short cap also covers a wake-up missed between check and wait.
            try:
                async with self._memory_arrived:
                    await asyncio.wait_for(self._memory_arrived.wait(), min(remaining, ORPHAN_RECHECK_S))
            except TimeoutError:
                pass

    async def apply_invalidation(self, body: dict[str, Any], sender: str) -> Applied:
        """Verify and store one received link invalidation (as links are); only where the sender may see
        the link's both ends (otherwise, as for a link not here: ``unknown_link``, retryable)."""
        try:
            payload = InvalidationPayload.from_mapping(body["invalidation"])
        except attest.AttestError as e:
            raise ProtocolError("bad_payload", e.message) from None
        inval_id = payload.inval_id
        if await self.db.read(graph.get_invalidation, inval_id) is not None:
            return OK_UNCHANGED
        signed_by = body["signed_by"]
        if signed_by is not None and signed_by != payload.observed_by:
            log.warning("signer_mismatch", extra={"ev": {"peer": sender, "inval_id": inval_id,
                                                         "signed_by": signed_by, "observed_by": payload.observed_by}})
            return Applied("signer_mismatch")
        level = await self._attest(payload, body["signature"], payload.observed_by, sender, what=inval_id)
        if isinstance(level, Applied):
            return level
        code = await self._admit_invalidation(payload.link_id, sender)
        if code is not None:
            return Applied(code)
        now = self.clock()
        attested = level is AttestLevel.PEER_ATTESTED
        row = InvalidationRow(inval_id=inval_id, link_id=payload.link_id, observed_by=payload.observed_by,
                              valid_until=payload.valid_until, signature=body["signature"] if attested else None,
                              attest_level=str(level), signed_by=signed_by if attested else None,
                              received_from=sender, created_at=now)

        def write(conn: Any) -> Applied:
            link = links.get(conn, payload.link_id)
            if link is None or not self._link_visible(conn, sender, link):
                return Applied("unknown_link")
            if graph.get_invalidation(conn, inval_id) is not None:
                return OK_UNCHANGED
            graph.insert_invalidation(conn, row)
            events.append(conn, "link_invalidation", payload.link_id, payload.observed_by, inval_id,
                          row.signature, now)
            changelog.append(conn, "link", inval_id, 1, now)
            changelog.incr(conn, f"applied:link.invalidate.{level}")
            return OK_CHANGED

        return await self.db.write(write)

    async def _admit_invalidation(self, link_id: str, sender: str) -> str | None:
        """The gate's ``link`` in both of the link's ends' namespaces, as for a link.put (a local invalidation
        asks the same); a link ``sender`` may not see is left to the write's ``unknown_link``."""
        if self.gate is None:
            return None

        def ends(conn: Any) -> list[str]:
            link = links.get(conn, link_id)
            if link is None or not self._link_visible(conn, sender, link):
                return []
            return sorted({m.namespace for m in memories.get_many(conn, {link.src_id, link.dst_id}).values()})

        for ns in await self.db.read(ends):
            code = await self._gate_code(sender, ns, Operation.LINK)
            if code is not None:
                return code
        return None

    async def apply_transcript(self, body: dict[str, Any], sender: str) -> Applied:
        """Verify and store one received transcript (node/transcripts.py): only in a namespace this node keeps
        and replicates transcripts for and ``sender`` may see, within its size limits, signed by its agent,
        and once every memory it cites is here and visible to ``sender`` (else ``unknown_memory``, retryable)."""
        try:
            payload = TranscriptPayload.from_mapping(body["transcript"])
        except attest.AttestError as e:
            raise ProtocolError("bad_payload", e.message) from None
        policy = self.cfg.transcripts.policy(payload.namespace)
        code = self._transcript_not_allowed(payload, body["signed_by"], sender)
        if code is not None:
            return Applied(code)
        if await self.db.read(transcripts.get, payload.id) is not None:
            return OK_UNCHANGED
        level = await self._attest(payload, body["signature"], payload.agent, sender, what=payload.id)
        if isinstance(level, Applied):
            return level
        row = await asyncio.to_thread(inbound_row, payload, body["body"], policy, signature=body["signature"],
                                      level=level, sender=sender)
        if isinstance(row, str):
            return Applied(row)
        spans = spans_of(payload)
        if not await self._ends_visible(sender, {s.memory_id for s in spans}):
            return Applied("unknown_memory")
        code = await self._gate_code(sender, payload.namespace, Operation.STORE)
        if code is not None:
            return Applied(code)
        now = self.clock()

        def write(conn: Any) -> Applied:
            if transcripts.get(conn, payload.id) is not None:
                return OK_UNCHANGED
            transcripts.insert(conn, row, spans)
            events.append(conn, "transcript", payload.id, payload.agent, payload.record_hash, row.signature, now)
            changelog.append(conn, "link", payload.id, 1, now)  # served on by sync, as links are
            changelog.incr(conn, f"applied:transcript.{level}")
            return OK_CHANGED

        return await self.db.write(write)

    def _transcript_not_allowed(self, payload: TranscriptPayload, signed_by: str | None, sender: str) -> str | None:
        policy = self.cfg.transcripts.policy(payload.namespace)
        if not (policy.enabled and policy.replicate):
            return "transcripts_disabled"
        if not self.shares(sender, payload.namespace):
            return "namespace_not_allowed"
        if signed_by is not None and signed_by != payload.agent:
            return "signer_mismatch"
        return None

    def _link_visible(self, conn: Any, peer: str, link: LinkRow) -> bool:
        """``peer`` may see both memories ``link`` joins."""
        ends = memories.get_many(conn, {link.src_id, link.dst_id})
        return len(ends) == len({link.src_id, link.dst_id}) and all(self.visible_to(peer, m) for m in ends.values())

    # ---- catch-up: serving ----------------------------------------------------------------

    async def sync_page(self, peer: str, since: int, limit: int, skip: Sequence[str] = ()) -> dict[str, Any]:
        """One page of this node's change log after ``since`` (served at GET /a2a/v1/sync).

        Only what ``peer`` may see (a link only where it may see both ends), and nothing written by
        ``peer`` itself or by the agents in ``skip`` (the puller gets those from their writers).
        """
        limit = min(limit, self.cfg.federation.sync_page_limit)
        if self.peer_rate is not None:
            # A page reads up to ``limit`` changes, each one a message's worth of work: they come out of the
            # peer's limits.peer_requests_per_second budget, as live messages do. A short budget gives a
            # short page (the peer asks again from ``next``); none at all refuses the page, retryably.
            limit, wait = self.peer_rate.take_up_to(peer, limit)
            if not limit:
                self.counters["rejected:rate_limited"] += 1
                raise ServiceError("rate_limited", f"sync pages from {peer} are past limits.peer_requests_per_second "
                                                   f"({self.cfg.limits.peer_requests_per_second}); retry in "
                                                   f"{wait * 1000:.0f} ms")
        omit = {peer, *skip}
        read_rows = 0

        def read(conn: Any) -> dict[str, Any]:
            nonlocal read_rows
            rows = changelog.page(conn, since, limit)
            read_rows = len(rows)
            items: list[dict[str, Any]] = []
            budget, last = SYNC_PAGE_TRANSCRIPT_BYTES, since
            for r in rows:
                item = self._sync_item(conn, peer, omit, r)
                last = r.seq
                if item is not None:
                    items.append(item)
                    budget -= len(item.get("body", b""))
                if budget < 0:
                    break  # transcripts filled the page: the rest comes on the next one
            return {"items": items, "next": last, "more": len(rows) == limit or (bool(rows) and last != rows[-1].seq),
                    "accepts": list(ACCEPTS)}

        read_at = self.clock()
        try:
            page = await self.db.read(read)
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

    def _sync_item(self, conn: Any, peer: str, omit: set[str], r: changelog.ChangeRow) -> dict[str, Any] | None:
        if r.kind == "memory":
            m = memories.get(conn, r.ref_id)
            if m is None or m.author in omit or not self.visible_to(peer, m):
                return None
            return {"seq": r.seq, "kind": "memory.put", **memory_put_body(m)}
        inv = graph.get_invalidation(conn, r.ref_id)
        # A 'link' change is a link or an invalidation of one; either goes where the link may go.
        link = links.get(conn, inv.link_id if inv is not None else r.ref_id)
        if link is None and inv is None:
            return self._sync_transcript(conn, peer, omit, r)
        author = inv.observed_by if inv is not None else link.observed_by if link is not None else None
        if link is None or author in omit or not self._link_visible(conn, peer, link):
            return None
        if inv is not None:
            return {"seq": r.seq, "kind": "link.invalidate", **invalidation_wire(inv)}
        return {"seq": r.seq, "kind": "link.put", **link_wire(link)}

    def _sync_transcript(self, conn: Any, peer: str, omit: set[str], r: changelog.ChangeRow) -> dict[str, Any] | None:
        """A 'link' change that is neither a link nor an invalidation is a replicated transcript: served where
        its namespace still replicates and ``peer`` may see the namespace and every memory it cites."""
        t = transcripts.get(conn, r.ref_id)
        if t is None or t.agent in omit or not self.cfg.transcripts.policy(t.namespace).replicate:
            return None
        spans = transcripts.spans_of_transcript(conn, t.id)
        ids = {s.memory_id for s in spans}
        cited = memories.get_many(conn, ids)
        if len(cited) != len(ids) or not all(self.visible_to(peer, m) for m in [scope_of(t.namespace, None),
                                                                               *cited.values()]):
            return None
        return {"seq": r.seq, "kind": "transcript.put", **transcript_wire(t, spans)}

    # ---- catch-up: pulling ----------------------------------------------------------------

    async def apply_sync_items(self, peer: str, items: Iterable[Any]) -> SyncOutcome:
        """Apply one pulled page (memories first, so links find their memories).

        An item that cannot be stored now (storage trouble, a link whose memory is not here yet) is kept
        in ``sync_pending`` and retried on the next rounds (``retry_pending``), so the cursor moves on.
        """
        outcome = SyncOutcome()
        good = [i for i in items if isinstance(i, dict) and isinstance(i.get("seq"), int)]
        for item in sorted(good, key=_apply_order):
            await self._apply_sync_item(peer, item, outcome)
        return outcome

    async def retry_pending(self, peer: str) -> SyncOutcome:
        """Apply again the items from ``peer`` that could not be applied on earlier rounds."""
        outcome = SyncOutcome()
        waiting = await self.db.read(changelog.pending, peer, PENDING_RETRY_MAX)
        for p in sorted(waiting, key=lambda p: _apply_order({"kind": p.kind})):
            try:
                item = cbor2.loads(p.item)
            except (cbor2.CBORDecodeError, ValueError):
                await self.db.write(changelog.drop_pending, peer, p.seq)
                continue
            await self._apply_sync_item(peer, item, outcome)
        return outcome

    async def _apply_sync_item(self, peer: str, item: dict[str, Any], outcome: SyncOutcome) -> None:
        payload = {k: v for k, v in item.items() if k != "seq"}
        try:
            applied = await self.apply_payload(payload, peer)
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
        ref = {"memory.put": item.get("memory", {}).get("id"), "transcript.put": item.get("transcript", {}).get("id"),
               # An invalidation waits for the link it ends: that link names it.
               "link.invalidate": item.get("invalidation", {}).get("link_id"),
               }.get(kind, item.get("link", {}).get("src_id"))
        pending = await self.db.write(changelog.note_pending, peer, item["seq"], kind, str(ref), code,
                                      cbor2.dumps(item), self.cfg.federation.sync_park_after, self.clock())
        if pending.parked:
            outcome["parked"] += 1
            log.warning("sync_item_parked", extra={"ev": {"peer": peer, "seq": item["seq"], "kind": kind,
                                                          "code": code, "rounds": pending.rounds}})
        else:
            outcome["pending"] += 1


def _link_chunks(bodies: Sequence[dict[str, Any]], most: int = LINKS_PUT_MAX_ITEMS) -> list[list[int]]:
    """Positions of ``bodies`` (link.put bodies) in runs of at most ``most`` links whose encoded size stays
    under LINKS_PUT_MAX_BYTES (each body's size bounded from above: its strings' UTF-8 bytes plus the keys,
    integers and signature of a link.put, which take under 200 bytes)."""
    chunks: list[list[int]] = []
    run: list[int] = []
    size = 0
    for i, body in enumerate(bodies):
        link = body["link"]
        n = 200 + sum(len(v.encode()) for v in (link["src_id"], link["dst_id"], link["relation"],
                                                 link["observed_by"], body["signed_by"] or ""))
        if run and (len(run) == most or size + n > LINKS_PUT_MAX_BYTES):
            chunks.append(run)
            run, size = [], 0
        run.append(i)
        size += n
    if run:
        chunks.append(run)
    return chunks


def _apply_order(item: dict[str, Any]) -> int:
    """Within a pulled page: memories, then links, then invalidations (each finds what it refers to)."""
    return {"memory.put": 0, "link.put": 1}.get(str(item.get("kind")), 2)


class SyncOutcome(Counter[str]):
    """How a pulled page's items went, by code: ``applied`` changed something, ``unchanged`` did not,
    ``pending`` will be retried next round, ``parked`` gave up after ``sync_park_after`` rounds."""


def _against_stored(stored: MemoryRow | None, m: dict[str, Any], step: int) -> str | None:
    """Why version ``m`` may not follow ``stored`` (a remote write never changes origin or namespace)."""
    if stored is None:
        return "version_out_of_range" if m["version"] > step else None
    if stored.origin != m["origin"]:
        return "origin_mismatch"
    if stored.namespace != m["namespace"]:
        return "namespace_mismatch"
    if m["version"] > stored.version + step:
        return "version_out_of_range"
    return None


def memory_wire_fields(row: MemoryRow) -> dict[str, Any]:
    return {f: getattr(row, f) for f in attest.MEMORY_SIGNED_FIELDS}


def _memory_row(body: dict[str, Any], level: AttestLevel, sender: str) -> MemoryRow:
    m = body["memory"]
    attested = level is AttestLevel.PEER_ATTESTED
    share = body.get("share_with")
    return MemoryRow(id=m["id"], namespace=m["namespace"], title=m["title"], content=m["content"],
                     tags=tuple(m["tags"]), priority=m["priority"], confidence=float(m["confidence"]),
                     source=m["source"], origin=m["origin"], writer=m["writer"], version=m["version"],
                     created_at=m["created_at"], updated_at=m["updated_at"],
                     signature=body["signature"] if attested else None,
                     signed_by=body["signed_by"] if attested else None, attest_level=str(level),
                     share_with=None if share is None else tuple(share), received_from=sender)


def _share_with_after(row: MemoryRow, stored: MemoryRow, me: str) -> MemoryRow:
    """Who may see a memory is the origin's to say: on the origin its own policy stands; elsewhere only a
    version written by the origin may change the list, and only to narrow it. A relay or another writer
    can neither lift nor tighten the restriction."""
    if stored.origin == me or row.writer != row.origin:
        return replace(row, share_with=stored.share_with)
    if stored.share_with is None or row.share_with is None:
        return replace(row, share_with=row.share_with if stored.share_with is None else stored.share_with)
    return replace(row, share_with=tuple(a for a in row.share_with if a in stored.share_with))
