"""Federation policy: what goes to which peer, how inbound changes are applied, catch-up pages, quorum.

Outbound: each local write enqueues one envelope per target peer in its own transaction.
Inbound: ``apply(env, sender)`` validates the payload, verifies link signatures off the event loop
(in batches on a worker thread: Ed25519 verify holds the GIL for each ~70 us call, but the loop gets
the GIL back between calls, so a burst never stalls it for a whole batch), commits, then the ACK is sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from a2a import Ack, Envelope, ProtocolError, new_envelope, validate_payload
from a2a.envelope import RETRYABLE_REJECT_CODES
from node import attest
from node.attest import AttestLevel, LinkPayload
from node.errors import ServiceError
from node.kg import invalidation_wire
from node.service import Service, link_wire, memory_wire
from storage import changelog, events, graph, links, memories, outbox
from storage.errors import StorageError
from storage.links import LinkRow
from storage.memories import MemoryRow

log = logging.getLogger("node.federation")

# Most signatures verified in one hop to the thread pool.
VERIFY_BATCH_MAX = 256
# Quorum waits recheck the outbox at least this often (ACKs made by another process wake nobody here).
QUORUM_RECHECK_S = 0.05
# Payload kinds the change log carries (GET /a2a/v1/sync): a peer that synced to the end holds them all.
SYNCED_KINDS = ("memory.put", "link.put", "link.invalidate")
ORPHAN_RECHECK_S = 0.1


class VerifyBatcher:
    """Collects signature checks made in one loop turn and runs them as one batch on a thread."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.executor = executor
        self._queue: list[tuple[Ed25519PublicKey, LinkPayload, bytes | None, asyncio.Future[bool]]] = []
        self._scheduled = False
        self.batches = 0
        self.verified = 0

    async def verify(self, key: Ed25519PublicKey, payload: LinkPayload, signature: bytes | None) -> bool:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._queue.append((key, payload, signature, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._scheduled = False
        while self._queue:
            batch, self._queue = self._queue[:VERIFY_BATCH_MAX], self._queue[VERIFY_BATCH_MAX:]
            self.batches += 1
            self.verified += len(batch)
            work = asyncio.get_running_loop().run_in_executor(
                self.executor, attest.verify_many, [(k, p, s) for k, p, s, _ in batch])
            work.add_done_callback(lambda done, batch=batch: _settle(done, batch))


def _settle(done: asyncio.Future[list[bool]], batch: list) -> None:
    exc = done.exception()
    for i, (*_, fut) in enumerate(batch):
        if fut.done():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(done.result()[i])


class Federation:
    def __init__(self, service: Service) -> None:
        self.svc = service
        self.cfg = service.cfg
        self.peers = {p.agent_id: p for p in self.cfg.mesh.peers}
        self.counters: Counter[str] = Counter()
        # One worker: verification is GIL-bound, so more threads would add switching, not throughput.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
        self.verifier = VerifyBatcher(self._executor)
        self._ack_changed = asyncio.Condition()
        self._memory_arrived = asyncio.Condition()
        service.replicate = self.enqueue
        service.await_quorum = self.await_quorum

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- outbound -------------------------------------------------------------------------

    def targets(self, namespace: str) -> list[str]:
        """Peers a change in ``namespace`` goes to: the namespace's configured peers, else all."""
        policy = self.cfg.federation.namespaces.get(namespace)
        if policy is not None:
            return [p for p in policy.peers if p in self.peers]
        return list(self.peers)

    def enqueue(self, conn, payload: dict[str, Any], namespace: str, ts: int) -> list[tuple[str, str]]:
        """Inside the write transaction: one outbox row per target peer. Returns (peer, correlation_id)."""
        ttl_ms = int(self.cfg.a2a.ttl_s * 1000)
        queued = []
        for peer in self.targets(namespace):
            env = new_envelope(self.svc.agent_id, [peer], payload, ts, ttl_ms)
            outbox.enqueue(conn, env.correlation_id, peer, env.kind, env.to_wire(), env.expires_at, ts, ts)
            queued.append((peer, env.correlation_id))
        return queued

    async def record_ack(self, peer: str, correlation_id: str) -> None:
        async with self._ack_changed:
            self._ack_changed.notify_all()

    async def await_quorum(self, queued: list[tuple[str, str]], namespace: str) -> int:
        """Wait until the configured write quorum has ACKed (self counts as one); returns nodes that ACKed.

        A row leaves the outbox only on its peer's ACK, so "gone from the outbox" is the ACK, whichever
        process (this node or a CLI beside it) made the write.
        """
        nodes = 1 + len(self.targets(namespace))
        need = self.cfg.quorum_size(nodes)
        if need <= 1:
            return 1
        cids = [cid for _, cid in queued]
        timeout = self.cfg.federation.quorum_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            acked = 1 + len(cids) - await self.svc.db.read(outbox.undelivered_count, cids)
            if acked >= need:
                return acked
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ServiceError(
                    "quorum_not_reached",
                    f"{acked} of {need} required nodes ({nodes} in the federation for this namespace) ACKed "
                    f"within {timeout:g} s; the write is committed locally and keeps replicating")
            try:
                async with self._ack_changed:
                    await asyncio.wait_for(self._ack_changed.wait(), min(remaining, QUORUM_RECHECK_S))
            except TimeoutError:
                pass

    # ---- inbound --------------------------------------------------------------------------

    async def apply(self, env: Envelope, sender: str) -> Ack:
        """The mesh receiver's apply: commit the change, then answer Ack.ok / Ack.rejected(code)."""
        validate_payload(env.payload)
        me = self.svc.agent_id
        cid = env.correlation_id
        kind = env.kind
        if kind == "ping":
            return Ack.ok(cid, me)
        if kind == "memory.put":
            code = await self.apply_memory(env.payload["memory"], sender)
        elif kind == "link.put":
            code = await self.apply_link(env.payload, sender)
        elif kind == "link.invalidate":
            code = await self.svc.kg.apply_remote(env.payload, sender, self.verifier.verify)
        else:  # validate_payload knows the kind but this node has no handler for it
            code = "unsupported_kind"
        if code is None:
            return Ack.ok(cid, me)
        self.counters[f"rejected:{code}"] += 1
        return Ack.rejected(cid, me, code)

    async def apply_memory(self, m: dict[str, Any], sender: str) -> str | None:
        policy = self.cfg.federation.namespaces.get(m["namespace"])
        if policy is not None and sender not in policy.peers:
            log.warning("namespace_not_allowed", extra={"ev": {"peer": sender, "namespace": m["namespace"],
                                                               "memory_id": m["id"]}})
            return "namespace_not_allowed"
        row = MemoryRow(id=m["id"], namespace=m["namespace"], title=m["title"], content=m["content"],
                        tags=tuple(m["tags"]), priority=m["priority"], confidence=float(m["confidence"]),
                        source=m["source"], origin=m["origin"], version=m["version"], created_at=m["created_at"],
                        updated_at=m["updated_at"])

        def write(conn) -> str:
            result = memories.apply_remote(conn, row)
            if result in ("inserted", "updated"):
                changelog.append(conn, "memory", row.id, row.version, self.svc.clock())
                changelog.incr(conn, f"applied:memory.{result}")
            return result

        result = await self.svc.db.write(write)
        self.counters[f"memory:{result}"] += 1
        async with self._memory_arrived:
            self._memory_arrived.notify_all()
        return None

    async def apply_link(self, body: dict[str, Any], sender: str) -> str | None:
        """Verify and store one received link; returns None when stored (or already here), else a reject code."""
        try:
            payload = LinkPayload.from_mapping(body["link"])
        except attest.AttestError as e:
            raise ProtocolError("bad_payload", e.message) from None
        link_id = payload.link_id
        now = self.svc.clock()
        if payload.valid_until is not None and payload.valid_until < now:
            return "expired_link"
        if await self.svc.db.read(links.get, link_id) is not None:
            self.counters["link:duplicate"] += 1
            return None
        signature, signed_by = body["signature"], body["signed_by"]
        if signed_by is not None and signed_by != payload.observed_by:
            log.warning("signer_mismatch", extra={"ev": {"peer": sender, "link_id": link_id,
                                                         "signed_by": signed_by, "observed_by": payload.observed_by}})
            return "signer_mismatch"
        key = self.svc.key_for(payload.observed_by)
        level = AttestLevel.UNSIGNED
        if signature is not None and key is not None:
            if not await self.verifier.verify(key, payload, signature):
                self.counters["bad_signature"] += 1
                log.warning("bad_signature", extra={"ev": {"peer": sender, "link_id": link_id,
                                                           "claimed_signer": payload.observed_by}})
                await self.svc.db.write(changelog.incr, "rejected:bad_signature")
                return "bad_signature"
            level = AttestLevel.PEER_ATTESTED
        elif payload.observed_by != sender:
            # Relaying another node's link is only legitimate when its signature verifies here.
            log.warning("unverified_relay", extra={"ev": {"peer": sender, "link_id": link_id,
                                                          "observed_by": payload.observed_by}})
            return "unverified_relay"
        if not await self._memories_present({payload.src_id, payload.dst_id}):
            return "unknown_memory"
        row = LinkRow(link_id=link_id, **payload.to_dict(), confidence=body["link"].get("confidence"),
                      signature=signature if level is AttestLevel.PEER_ATTESTED else None,
                      attest_level=str(level), signed_by=signed_by if level is AttestLevel.PEER_ATTESTED else None,
                      received_from=sender, created_at=now)

        def write(conn) -> bool:
            if links.get(conn, link_id) is not None:
                return False
            links.insert(conn, row)
            events.append(conn, "link", link_id, payload.observed_by, link_id, row.signature, now)
            changelog.append(conn, "link", link_id, 1, now)
            changelog.incr(conn, f"applied:link.{level}")
            return True

        stored = await self.svc.db.write(write)
        self.counters[f"link:{level}" if stored else "link:duplicate"] += 1
        return None

    async def _memories_present(self, ids: set[str]) -> bool:
        """True once every id is stored; waits up to ``orphan_hold_s`` for memory.put still in flight."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.federation.orphan_hold_s
        while True:
            if await self.svc.db.read(memories.exists, ids) == ids:
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

    # ---- catch-up -------------------------------------------------------------------------

    async def sync_page(self, peer: str, since: int, limit: int) -> dict[str, Any]:
        """One page of this node's change log after ``since`` (served at GET /a2a/v1/sync)."""
        limit = min(limit, self.cfg.federation.sync_page_limit)

        def read(conn) -> dict[str, Any]:
            items = []
            rows = changelog.page(conn, since, limit)
            for r in rows:
                if r.kind == "memory":
                    m = memories.get(conn, r.ref_id)
                    if m is not None and self._shares(peer, m.namespace):
                        items.append({"seq": r.seq, "kind": "memory.put", "memory": memory_wire(m)})
                elif (inv := graph.get_invalidation(conn, r.ref_id)) is not None:
                    # A 'link' change is a link or an invalidation of one; it goes where its link went.
                    link = links.get(conn, inv.link_id)
                    src = memories.get(conn, link.src_id) if link is not None else None
                    if src is None or self._shares(peer, src.namespace):
                        items.append({"seq": r.seq, "kind": "link.invalidate", **invalidation_wire(inv)})
                else:
                    link = links.get(conn, r.ref_id)
                    src = memories.get(conn, link.src_id) if link is not None else None
                    # A link goes where its source memory's namespace goes (as on the live path).
                    if link is not None and (src is None or self._shares(peer, src.namespace)):
                        items.append({"seq": r.seq, "kind": "link.put", **link_wire(link)})
            last = rows[-1].seq if rows else since
            return {"items": items, "next": last, "more": len(rows) == limit}

        read_at = self.svc.clock()
        page = await self.svc.db.read(read)
        if not page["more"]:
            # Only changes the log carries are covered by the catch-up (a dead ping stays for replay), and
            # only letters dead before this page was read: a later one may carry a change made since.
            cleared = await self.svc.db.write(outbox.clear_dead_letters, peer, SYNCED_KINDS, read_at)
            if cleared:
                log.info("dead_letters_cleared", extra={"ev": {"peer": peer, "count": cleared,
                                                               "reason": "peer caught up through sync"}})
        return page

    def _shares(self, peer: str, namespace: str) -> bool:
        policy = self.cfg.federation.namespaces.get(namespace)
        return policy is None or peer in policy.peers

    async def apply_sync_items(self, peer: str, items: Iterable[Any]) -> SyncOutcome:
        """Apply one pulled page (memories first, so links find their memories).

        ``outcome.retry`` counts items that could not be stored now (storage trouble, a link whose memory
        is not here yet); the caller then keeps its place in the peer's log and fetches them again.
        """
        outcome = SyncOutcome()
        items = [i for i in items if isinstance(i, dict)]
        for item in sorted(items, key=lambda i: i.get("kind") != "memory.put"):
            payload = {k: v for k, v in item.items() if k != "seq"}
            try:
                validate_payload(payload)
                if payload["kind"] == "memory.put":
                    code = await self.apply_memory(payload["memory"], peer)
                elif payload["kind"] == "link.invalidate":
                    code = await self.svc.kg.apply_remote(payload, peer, self.verifier.verify)
                else:
                    code = await self.apply_link(payload, peer)
            except ProtocolError as e:
                code = e.code
            except StorageError as e:
                code = e.code
                outcome.retry += 1
            else:
                if code in RETRYABLE_REJECT_CODES:
                    outcome.retry += 1
            outcome[code or "applied"] += 1
        return outcome


class SyncOutcome(Counter):
    """How a pulled page's items went, by code; ``retry`` counts those to fetch again."""

    retry: int = 0
