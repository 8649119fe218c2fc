"""The service layer: the node's operations, used by the CLI, MCP and inbound federation alike.

Each write is one storage transaction holding the row, its signed_event, its change-log entry
and its outbox entries, so a crash loses nothing and a commit means all of it happened. The checks a
write passes on its way (fields, hooks, the gate, approvals, quota, replication) are the ``WritePath``
(node/writepath.py), which the knowledge graph and the transcripts receive too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from mesh.keys import Identity
from node import attest
from node.agents.acting import acting_as
from node.agents.book import AgentBook
from node.attest import SIGNED_SET_SHARED, AttestLevel, LinkPayload, MemoryPayload
from node.config import NodeConfig
from node.errors import ServiceError, describe, is_project_error
from node.events.webhooks import Webhooks
from node.hooks import HookEvent, Hooks
from node.limits import check_confidence
from node.permissions import approvals as approval
from node.permissions.approvals import APPROVED, Approvals
from node.permissions.gate import Gate
from node.permissions.rules import Operation
from node.trust import Keyring
from node.wire import link_dict, link_wire, memory_dict
from node.writepath import Queued, Replicator, WritePath
from storage import changelog, events, links, memories
from storage.db import Database
from storage.links import LinkRow
from storage.memories import MemoryRow

if TYPE_CHECKING:
    from node.agents.local import LocalAgents
    from node.kg import KnowledgeGraph
    from node.transcripts import TranscriptRoom

Clock = Callable[[], int]
# SQLite INTEGER is signed 64-bit: a version or time at the top cannot be moved past.
INT64_MAX = 2**63 - 1
# A planned link: its signed row and the approved action it runs as (None outside an approval).
Planned = tuple[LinkRow, approval.Approved | None]
# A made link of memory_link_many: its item index, its row, its ends and the outbox rows that carry it.
Made = tuple[int, LinkRow, tuple[list[MemoryRow], Queued]]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _item_error(exc: BaseException) -> dict[str, Any]:
    """One batch item's failure, as the MCP edge reports a whole call's."""
    d = describe(exc)
    return {"error": {"code": d.code, "message": d.message}}


@dataclass(slots=True)
class _LinkJob:
    """One memory_link_many write job's running state: the link ids stored (read once, then each one made)
    and the audit event appended last (the next one chains to it without reading the head)."""

    stored: set[str]
    event: events.EventRow | None = None
    # The made links' link.put bodies and scopes, queued together at the end of the job (enqueue_links), or
    # None to queue each link as it is made.
    outgoing: list[tuple[dict[str, Any], list[MemoryRow]]] | None = None


class Service:
    """Operations on one node's store. Built by ``node.assemble.open_service(cfg)``; close with ``close()``.

    ``writes`` is the store's write path (its hooks, gate, approvals and replicator); ``webhooks`` the
    subscriptions the CLI manages and the node delivers (None = none: events go to ``writes``' sink only)."""

    def __init__(self, writes: WritePath, *, clock: Clock = now_ms, webhooks: Webhooks | None = None,
                 agents: AgentBook | None = None) -> None:
        self.writes = writes
        self.clock = clock
        self.webhooks = webhooks
        self._book = agents if agents is not None else AgentBook(writes.db, writes.keyring)
        # Which words are in half the memories (recall leaves them out of the ranking), shared by the readers.
        self.doc_freqs = memories.DocFreqs()

    # The rooms a command may not use are built (and imported) at first use: a CLI recall or store needs none.

    @cached_property
    def agents(self) -> LocalAgents:
        """This node's agents (node/agents/local.py): the principal an MCP client names, made on first use."""
        from node.agents.local import LocalAgents

        return LocalAgents(self.writes, self._book, self.clock)

    @cached_property
    def kg(self) -> KnowledgeGraph:
        """memory_kg_query / memory_find_paths / memory_kg_timeline / memory_kg_invalidate (node/kg.py)."""
        from node.kg import KnowledgeGraph

        return KnowledgeGraph(self.writes, self.clock)

    @cached_property
    def transcripts(self) -> TranscriptRoom:
        """memory_transcript_store / memory_replay and the archive-then-prune lifecycle (node/transcripts.py); a
        transcript's proposed memories are stored as memory_store stores any."""
        from node.transcripts import TranscriptRoom

        return TranscriptRoom(self.writes, self.clock, self.memory_store)

    async def close(self) -> None:
        await self.hooks.close()
        if self.replicator is not None:
            self.replicator.close()
        await self.db.close()

    # The write path's collaborators, read through it (one object each per store).
    @property
    def cfg(self) -> NodeConfig:
        return self.writes.cfg

    @property
    def db(self) -> Database:
        return self.writes.db

    @property
    def keyring(self) -> Keyring:
        return self.writes.keyring

    @property
    def identity(self) -> Identity | None:
        return self.writes.identity

    @property
    def agent_id(self) -> str:
        return self.writes.agent_id

    @property
    def hooks(self) -> Hooks:
        return self.writes.hooks

    @property
    def gate(self) -> Gate | None:
        return self.writes.gate

    @property
    def approvals(self) -> Approvals | None:
        return self.writes.approvals

    @property
    def replicator(self) -> Replicator | None:
        return self.writes.replicator

    @property
    def peer_keys(self) -> dict[str, Ed25519PublicKey]:
        """Trusted peer keys, re-read when <home>/peers changes (an `identity import` takes effect live)."""
        return self.keyring.peer_keys

    # ---- memories -------------------------------------------------------------------------

    async def memory_store(self, content: str, *, title: str = "", namespace: str = "default",
                           tags: Sequence[str] = (), priority: int = 5, confidence: float = 1.0,
                           source: str = "") -> dict[str, Any]:
        """Store a new memory; returns it with its minted UUIDv4 ``id`` and times in unix ms."""
        w = self.writes
        w.check_memory_fields(content, title, namespace, tags, priority, confidence, source)
        w.check_db_budget()
        memory_id = str(uuid.uuid4())
        call = {"method": "memory_store", "args": {
            "content": content, "title": title, "namespace": namespace, "tags": list(tags), "priority": priority,
            "confidence": confidence, "source": source}}
        p = await w.fire_pre(HookEvent.PRE_STORE, {
            "id": memory_id, "content": content, "title": title, "namespace": namespace, "tags": list(tags),
            "priority": priority, "confidence": confidence, "source": source, "agent_id": self.agent_id},
            Operation.STORE, namespace, call)
        content, title, namespace, tags, priority, confidence, source = (
            p[k] for k in ("content", "title", "namespace", "tags", "priority", "confidence", "source"))
        w.check_memory_fields(content, title, namespace, tags, priority, confidence, source)
        await w.permit(namespace, Operation.STORE, call)
        await w.check_quota(len(content.encode()) + len(title.encode()))
        approved = APPROVED.get()
        ts = self.clock()
        proposed = await self._admitted_links(namespace, self._proposed_link_rows(memory_id, p.get("links", ()), ts))
        linked: list[dict[str, Any]] = []
        row = self._signed(MemoryRow(
            id=memory_id, namespace=namespace, title=title, content=content, tags=tuple(tags),
            priority=priority, confidence=float(confidence), source=source, origin=self.agent_id,
            writer=self.agent_id, version=1, created_at=ts, updated_at=ts, share_with=w.share_with(namespace),
            signed_set=SIGNED_SET_SHARED))

        def write(conn: Any) -> Queued:
            w.claim(conn, approved, ts)
            memories.insert(conn, row)
            return self._record_version(conn, row, ts) + self._insert_proposed_links(conn, row, proposed, ts, linked)

        queued = await self.db.write(write)
        await self.hooks.fire(HookEvent.POST_STORE, {"memory": memory_dict(row)})
        await w.publish("memory.stored", memory_dict(row))
        for link in linked:  # links a pre_store hook proposed are this node's links as memory_link's are
            await w.publish("link.attested", link)
        made = {"links": linked} if linked else {}
        return {**memory_dict(row), **made, **await w.after_write(queued, [row])}

    async def memory_update(self, memory_id: str, *, content: str | None = None, title: str | None = None,
                            tags: Sequence[str] | None = None, priority: int | None = None,
                            confidence: float | None = None, source: str | None = None) -> dict[str, Any]:
        """Change the given fields as a new signed version (version + 1, ``updated_at`` in unix ms) and
        replicate it. Only the memory's creator, or an agent its namespace's ``writers`` names, may."""
        w = self.writes
        w.check_id("id", memory_id)
        given: dict[str, Any] = {k: v for k, v in {"content": content, "title": title, "tags": tags,
                                                   "priority": priority, "confidence": confidence,
                                                   "source": source}.items() if v is not None}
        if not given:
            raise ServiceError("bad_input", "nothing to update: give at least one field")
        current = await self.db.read(memories.get, memory_id)
        if current is None:
            raise ServiceError("not_found", f"no memory with id {memory_id!r}")
        fields = ("content", "title", "tags", "priority", "confidence", "source")
        call = {"method": "memory_update", "args": {"memory_id": memory_id, **given}}
        p = await w.fire_pre(HookEvent.PRE_UPDATE, {"id": memory_id, "current": memory_dict(current),
                                                    **{k: given.get(k) for k in fields}},
                             Operation.UPDATE, current.namespace, call)
        given = {k: p[k] for k in fields if p[k] is not None}
        await w.permit(current.namespace, Operation.UPDATE, call)
        approved = APPROVED.get()
        merged = {**memory_dict(current), **given}
        w.check_memory_fields(merged["content"], merged["title"], merged["namespace"], merged["tags"],
                              merged["priority"], merged["confidence"], merged["source"])
        ts = self.clock()

        def write(conn: Any) -> tuple[MemoryRow, Queued]:
            old = memories.get(conn, memory_id)
            if old is None:
                raise ServiceError("not_found", f"no memory with id {memory_id!r}")
            self._check_may_write(old)
            w.claim(conn, approved, ts)
            row = self._signed(self._next_version(old, ts, given))
            memories.overwrite(conn, row)
            return row, self._record_version(conn, row, ts)

        row, queued = await self.db.write(write)
        await self.hooks.fire(HookEvent.POST_UPDATE, {"memory": memory_dict(row)})
        return {**memory_dict(row), **await w.after_write(queued, [row])}

    async def memory_get(self, memory_id: str) -> dict[str, Any]:
        self.writes.check_id("id", memory_id)
        row = await self.db.read(memories.get, memory_id)
        if row is None:
            raise ServiceError("not_found", f"no memory with id {memory_id!r}")
        await self.writes.permit(row.namespace, Operation.GET)
        return memory_dict(row)

    async def memory_list(self, *, namespace: str | None = None, limit: int = 50,
                          offset: int = 0) -> list[dict[str, Any]]:
        self._check_limit(limit)
        if offset < 0:
            raise ServiceError("bad_input", f"offset must be >= 0, got {offset}")
        if namespace is not None:
            await self.writes.permit(namespace, Operation.LIST)
        rows = await self.db.read(memories.list_, namespace, limit, offset)
        readable = await self.writes.readable({r.namespace for r in rows}, Operation.LIST)
        return [memory_dict(r) for r in rows if r.namespace in readable]

    async def memory_recall(self, query: str, *, limit: int = 10,
                            namespace: str | None = None) -> list[dict[str, Any]]:
        """Full-text recall ranked by BM25 (SQLite) or ts_rank (Postgres), best first, each hit's ``score`` on
        ``relative_scores``' scale; any user string is safe as a query."""
        p = await self.hooks.fire(HookEvent.PRE_RECALL, {"query": query, "limit": limit, "namespace": namespace})
        query, limit, namespace = p["query"], p["limit"], p["namespace"]
        if not isinstance(query, str) or not query.strip():
            raise ServiceError("bad_input", "query must be a non-empty string")
        if len(query) > self.cfg.limits.max_query_chars:
            raise ServiceError("too_large",
                               f"query is {len(query)} chars, the limit is {self.cfg.limits.max_query_chars}")
        self._check_limit(limit)
        if namespace is not None:
            await self.writes.permit(namespace, Operation.RECALL)
        hits = await self.db.read(memories.recall, query, limit, namespace, self.doc_freqs)
        readable = await self.writes.readable({r.namespace for r, _ in hits}, Operation.RECALL)
        shown = [(r, score) for r, score in hits if r.namespace in readable]
        results = [{**memory_dict(r), "score": score}
                   for (r, _), score in zip(shown, relative_scores([s for _, s in shown]), strict=True)]
        await self.hooks.fire(HookEvent.POST_RECALL, {"query": query, "limit": limit, "namespace": namespace,
                                                      "results": results})
        return results

    # ---- links ----------------------------------------------------------------------------

    async def memory_link(self, src_id: str, dst_id: str, relation: str, *, valid_until: int | None = None,
                          confidence: float | None = None) -> dict[str, Any]:
        """Link two stored memories; signed with the node key (self_signed) when it has one."""
        row, approved = await self._plan_link(src_id, dst_id, relation, valid_until, confidence)

        def write(conn: Any) -> tuple[list[MemoryRow], Queued]:
            return self._write_link(conn, row, approved)

        scope, queued = await self.db.write(write)
        return {**await self._link_made(row), **await self.writes.after_write(queued, scope)}

    async def memory_link_many(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Make up to ``limits.max_links_per_call`` links in one call, each exactly as ``memory_link`` makes one
        (pre/post hooks, the permission gate, signature, audit event, change log, outbox), all stored in one
        writer job. Items are independent: one that fails gets its own error and the others are still made.
        Returns ``results`` in item order, each ``{"ok": link}`` or ``{"error": {code, message}}``."""
        top = self.cfg.limits.max_links_per_call
        if not isinstance(items, Sequence) or isinstance(items, str | bytes) or not items:
            raise ServiceError("bad_input", "links must be a non-empty list of {src_id, dst_id, relation}")
        if len(items) > top:
            raise ServiceError("too_large", f"links has {len(items)} items, the limit is {top} "
                                            "(limits.max_links_per_call)")
        results: list[dict[str, Any]] = [{} for _ in items]
        planned = await self._plan_links(items, results)
        made = await self.db.write(self._write_links, planned, results) if planned else []
        queued: Queued = list({q.id: q for _, _, (_, rows) in made for q in rows}.values())  # a row carries many
        for i, row, _ in made:
            results[i] = {"ok": await self._link_made(row)}
        out: dict[str, Any] = {"made": len(made), "failed": len(items) - len(made), "results": results}
        if self.writes.hand_off(queued):
            out["replicating_to"] = sorted({q.peer for q in queued})
            if self.writes.waits_for_quorum:
                await self._quorum_each(made, results)
        return out

    async def links_list(self, *, attest_level: str | None = None, limit: int = 50,
                         offset: int = 0) -> list[dict[str, Any]]:
        if attest_level is not None and attest_level not in {str(a) for a in AttestLevel}:
            raise ServiceError("bad_input",
                               f"attest_level must be one of {', '.join(map(str, AttestLevel))}, got {attest_level!r}")
        self._check_limit(limit)
        rows = await self.db.read(links.list_, attest_level, limit, offset)
        return [link_dict(r) for r in rows]

    # ---- verification ---------------------------------------------------------------------

    async def memory_verify(self, id: str) -> dict[str, Any]:
        """Re-derive the signed payload from the stored row (a link by link_id, a memory's current version
        by memory id) and check its id and signature against the signer's keyring."""
        self.writes.check_id("id", id)
        await self.hooks.fire(HookEvent.PRE_VERIFY, {"id": id})
        result = await self._verify(id)
        await self.hooks.fire(HookEvent.POST_VERIFY, {"id": id, "result": result})
        return result

    async def audit_verify(self) -> dict[str, Any]:
        """Walk the signed_events hash chain; names the first bad seq when broken."""
        report = await self.db.read(events.verify_chain)
        return {"ok": report.ok, "checked": report.checked, "first_bad_seq": report.first_bad_seq,
                "reason": report.reason}

    # ---- approvals ------------------------------------------------------------------------

    async def approval_list(self, *, status: str | None = "pending", limit: int = 100) -> list[dict[str, Any]]:
        """Pending actions (or those of another status), oldest first; times in unix ms."""
        return await self._approvals().list(status, limit)

    async def approval_decide(self, action_id: str, choice: str, *, decided_by: str = "local",
                              remember: str = "once") -> dict[str, Any]:
        """Approve (the parked write runs now, exactly once) or deny a pending action. ``remember = forever``
        with an approval adds a runtime rule answering the same ask from now on."""
        self.writes.check_id("id", action_id)
        if remember not in ("once", "forever"):
            raise ServiceError("bad_input", f"remember must be once or forever, got {remember!r}")
        decided = await self._approvals().decide(action_id, choice, decided_by, self._replay)
        if remember == "forever" and choice == approval.APPROVE and self.gate is not None:
            if not decided["namespace"]:
                # A rule for every namespace would answer far more asks than this one: not remembered.
                return {**decided, "remembered": None,
                        "not_remembered": "the action names no namespace; approve each such ask once"}
            rule = await self.gate.add_rule({"agent": decided["agent"], "namespace": decided["namespace"],
                                             "operations": [decided["operation"]], "action": "approved"},
                                            decided_by, self.clock())
            decided = {**decided, "remembered": rule.summary()}
        return decided

    # ---- how a memory version is written ---------------------------------------------------

    def _signed(self, row: MemoryRow) -> MemoryRow:
        """``row`` signed by this node's key (self_signed), or left unsigned when the node has no key."""
        s = self.writes.sign(MemoryPayload.of(row))
        return replace(row, signature=s.signature, signed_by=s.signed_by, attest_level=s.attest_level)

    def _next_version(self, old: MemoryRow, ts: int, given: dict[str, Any]) -> MemoryRow:
        """The version after ``old`` written here, signed over set 2 (the sharing list inside the signature). The
        list is the origin's: on the origin it is the namespace's list as configured now (a version may narrow
        or widen it); a named writer carries the stored list unchanged, as its peers require
        (``share_with_changed``)."""
        nxt = memories.next_version(old, writer=self.agent_id, updated_at=ts, **given)
        if old.origin == self.agent_id:
            share = self.writes.share_with(old.namespace)
        else:
            share = None if old.share_with is None else tuple(sorted(set(old.share_with)))
        return replace(nxt, share_with=share, signed_set=SIGNED_SET_SHARED)

    def _record_version(self, conn: Any, row: MemoryRow, ts: int) -> Queued:
        """In the write's transaction: the audit event, the change-log entry and the outbox rows."""
        events.append(conn, "memory", None, row.author, MemoryPayload.of(row).version_hash, row.signature, ts)
        changelog.append(conn, "memory", row.id, row.version, ts, row.author)
        return self.writes.replicate_memory(conn, row, ts)

    def _check_may_write(self, old: MemoryRow) -> None:
        """Versions of a memory are written by its creator or by a writer its namespace names; and a
        version or time at the int64 top (stored before inbound bounds existed) cannot be moved past."""
        policy = self.cfg.federation.namespaces.get(old.namespace)
        if self.agent_id != old.origin and (policy is None or self.agent_id not in policy.writers):
            raise ServiceError("writer_not_allowed",
                               f"memory {old.id!r} was created by {old.origin!r}; namespace {old.namespace!r} "
                               f"names no other writers, so its peers would refuse a version written here")
        if old.version >= INT64_MAX or old.updated_at >= INT64_MAX:
            raise ServiceError("version_exhausted",
                               f"memory {old.id!r} is at version {old.version}, updated_at {old.updated_at}: "
                               "no later version can be stored")

    def _proposed_link_rows(self, src_id: str, proposals: Sequence[dict[str, Any]], ts: int) -> list[LinkRow]:
        """Signed rows for the links a pre_store hook proposed (Modify ``links``, docs/hooks.md)."""
        rows = []
        for p in proposals:
            if p["dst_id"] == src_id or len(p["relation"]) > self.cfg.limits.max_relation_chars:
                continue
            try:
                payload = LinkPayload(src_id=src_id, dst_id=p["dst_id"], relation=p["relation"],
                                      observed_by=self.agent_id, valid_from=ts, valid_until=None)
            except attest.AttestError:
                continue
            rows.append(self._link_row(payload, float(p.get("confidence", 1.0))))
        return rows

    async def _admitted_links(self, namespace: str, rows: list[LinkRow]) -> list[LinkRow]:
        """The proposed links the gate lets this node's agent make: ``link`` in both ends' namespaces, as
        memory_link asks. One it denies or would ask about is skipped, as a proposal is advice."""
        if self.gate is None or not rows:
            return rows
        ends = await self.db.read(memories.get_many, {r.dst_id for r in rows})
        allowed = await self.writes.readable({namespace, *(m.namespace for m in ends.values())}, Operation.LINK)
        return [r for r in rows if namespace in allowed and r.dst_id in ends and ends[r.dst_id].namespace in allowed]

    def _insert_proposed_links(self, conn: Any, src: MemoryRow, rows: list[LinkRow], ts: int,
                               made: list[dict[str, Any]]) -> Queued:
        """Inside the new memory's transaction: its proposed links whose other memory is stored here."""
        ends = memories.get_many(conn, {r.dst_id for r in rows}) if rows else {}
        queued: Queued = []
        for row in rows:
            if row.dst_id not in ends:
                continue
            links.insert(conn, row)
            events.append(conn, "link", row.link_id, self.agent_id, row.link_id, row.signature, ts)
            changelog.append(conn, "link", row.link_id, 1, ts, row.observed_by)
            # A link goes only where both of its ends go (as memory_link).
            queued += self.writes.replicate(conn, "link.put", link_wire(row), [src, ends[row.dst_id]], ts)
            made.append(link_dict(row))
        return queued

    # ---- how a link is planned and written -------------------------------------------------

    def _link_row(self, payload: LinkPayload, confidence: float | None) -> LinkRow:
        """The row of a link this node makes now (created at its ``valid_from``), signed when it has a key."""
        s = self.writes.sign(payload)
        return LinkRow(link_id=payload.link_id, **payload.to_dict(), confidence=confidence, signature=s.signature,
                       attest_level=s.attest_level, signed_by=s.signed_by, received_from=None,
                       created_at=payload.valid_from)

    async def _plan_links(self, items: Sequence[Any], results: list[dict[str, Any]]) -> list[tuple[int, Planned]]:
        """Each item planned as memory_link plans one; a refused item's error goes into ``results``."""
        ends = await self._link_ends(items)
        planned = []
        for i, item in enumerate(items):
            try:
                if not isinstance(item, dict):
                    raise ServiceError("bad_input", "each link must be an object {src_id, dst_id, relation}")
                planned.append((i, await self._plan_link(item.get("src_id"), item.get("dst_id"), item.get("relation"),
                                                         item.get("valid_until"), item.get("confidence"), ends=ends)))
            except Exception as e:
                if not is_project_error(e):
                    raise  # a bug, not this item's answer: the call fails as a whole, nothing written yet
                results[i] = _item_error(e)  # this item's answer; the others go on
        return planned

    def _write_links(self, conn: Any, planned: list[tuple[int, Planned]], results: list[dict[str, Any]]) -> list[Made]:
        """memory_link_many's writer job: each planned link written as memory_link writes one (an item refused
        here gets its error in ``results``), then, with a write quorum of 1, all of them queued together."""
        # With a write quorum each link waits for the rows that carry it alone (a links.put a peer refuses is
        # replaced by single rows: its disappearance would read as an ACK).
        pack = not self.writes.waits_for_quorum
        written = []
        ends = memories.get_many(conn, {end for _, (row, _) in planned for end in (row.src_id, row.dst_id)})
        job = _LinkJob(links.stored_ids(conn, [row.link_id for _, (row, _) in planned]),
                       outgoing=[] if pack else None)
        for i, (row, approved) in planned:
            try:
                written.append((i, row, self._write_link(conn, row, approved, ends, job)))
            except ServiceError as e:  # raised before this item wrote anything: the others stand
                results[i] = _item_error(e)
        if job.outgoing and self.replicator is not None:
            # One envelope per peer for many links where the peer reads them (links.put); each keeps
            # its own signature. Each made link's rows: the ones that carry it.
            ts = max(row.created_at for _, row, _ in written)
            per_link = self.writes.replicate_links(conn, job.outgoing, ts)
            written = [(i, row, (scope, rows)) for (i, row, (scope, _)), rows in zip(written, per_link, strict=True)]
        return written

    async def _quorum_each(self, made: list[Made], results: list[dict[str, Any]]) -> None:
        """With a write quorum: each made link waits for its own (``quorum_not_reached`` is that item's error)."""
        for i, _, (scope, queued) in made:
            try:
                results[i]["ok"]["acked_nodes"] = await self.writes.quorum(queued, scope)
            except ServiceError as e:
                results[i] = _item_error(e)

    async def _link_ends(self, items: Sequence[Any]) -> dict[str, MemoryRow] | None:
        """With the gate enforcing: every item's ends in one read (each asks ``link`` in both namespaces)."""
        if self.gate is None or not await self.gate.enforcing():
            return None
        ids = {str(it[k]) for it in items if isinstance(it, dict) for k in ("src_id", "dst_id") if k in it}
        return await self.db.read(memories.get_many, ids)

    async def _plan_link(self, src_id: Any, dst_id: Any, relation: Any, valid_until: Any, confidence: Any, *,
                         ends: dict[str, MemoryRow] | None = None) -> Planned:
        """A link ready to write: pre_link hooks, bounds, the gate (``link`` in both ends' namespaces; ``ends``
        read beforehand, or here), signed. An ask parks this one link as a pending ``memory_link``."""
        call = {"method": "memory_link", "args": {"src_id": src_id, "dst_id": dst_id, "relation": relation,
                                                  "valid_until": valid_until, "confidence": confidence}}
        p = await self.writes.fire_pre(HookEvent.PRE_LINK, {"src_id": src_id, "dst_id": dst_id, "relation": relation,
                                                            "valid_until": valid_until, "confidence": confidence},
                                       Operation.LINK, lambda: self._namespace_of(src_id), call)
        relation, valid_until, confidence = p["relation"], p["valid_until"], p["confidence"]
        self._check_link_fields(src_id, dst_id, relation, confidence)
        ts = self.clock()
        try:
            payload = LinkPayload(src_id=src_id, dst_id=dst_id, relation=relation, observed_by=self.agent_id,
                                  valid_from=ts, valid_until=valid_until)
        except attest.AttestError as e:
            raise ServiceError("bad_input", e.message) from None
        if valid_until is not None and valid_until <= ts:
            raise ServiceError("bad_input", f"valid_until {valid_until} is not in the future (now {ts} ms)")
        if self.gate is not None and await self.gate.enforcing():
            # A link is written into both of its ends' namespaces: both must permit it. (With the gate
            # off every namespace would allow: no reader hop to learn them.)
            if ends is None:
                ends = await self.db.read(memories.get_many, {src_id, dst_id})
            for ns in sorted({ends[i].namespace for i in (src_id, dst_id) if i in ends}):
                await self.writes.permit(ns, Operation.LINK, call)
        approved = APPROVED.get()
        return self._link_row(payload, None if confidence is None else float(confidence)), approved

    def _check_link_fields(self, src_id: Any, dst_id: Any, relation: Any, confidence: Any) -> None:
        """A link's ends are ids, its relation a non-empty string within ``limits.max_relation_chars``."""
        self.writes.check_id("src_id", src_id)
        self.writes.check_id("dst_id", dst_id)
        if not isinstance(relation, str) or not relation.strip():
            raise ServiceError("bad_input", "relation must be a non-empty string")
        if len(relation) > self.cfg.limits.max_relation_chars:
            raise ServiceError("too_large",
                               f"relation is {len(relation)} chars, the limit is {self.cfg.limits.max_relation_chars}")
        if confidence is not None:
            check_confidence(confidence)

    def _write_link(self, conn: Any, row: LinkRow, approved: approval.Approved | None,
                    known: dict[str, MemoryRow] | None = None,
                    job: _LinkJob | None = None) -> tuple[list[MemoryRow], Queued]:
        """In a write transaction: the link row, its audit event, change-log entry and outbox rows. Raises
        ServiceError (unknown_memory, duplicate_link) before writing anything. ``known``: memories read in
        this transaction (a batch's ends, read once); ``job``: the batch's stored link ids and audit chain head."""
        ids = {row.src_id, row.dst_id}
        ends = ({i: known[i] for i in ids if i in known} if known is not None
                else memories.get_many(conn, ids))
        missing = sorted({row.src_id, row.dst_id} - set(ends))
        if missing:
            raise ServiceError("unknown_memory", f"no memory with id {', '.join(map(repr, missing))}")
        stored = row.link_id in job.stored if job is not None else links.get(conn, row.link_id) is not None
        if stored:
            raise ServiceError("duplicate_link", f"link {row.link_id} is already stored")
        ts = row.created_at
        self.writes.claim(conn, approved, ts)
        links.insert(conn, row)
        # An approval claim appends its own event: the chain head is then read again.
        after = job.event if job is not None and approved is None else None
        event = events.append(conn, "link", row.link_id, self.agent_id, row.link_id, row.signature, ts, after=after)
        if job is not None:
            job.stored.add(row.link_id)
            job.event = event
        changelog.append(conn, "link", row.link_id, 1, ts, row.observed_by)
        # A link goes only where both of its ends go.
        scope = list(ends.values())
        if job is not None and job.outgoing is not None:
            job.outgoing.append((link_wire(row), scope))  # queued with the job's other links
            return scope, []
        return scope, self.writes.replicate(conn, "link.put", link_wire(row), scope, ts)

    async def _link_made(self, row: LinkRow) -> dict[str, Any]:
        """post_link hooks and the link.attested event; returns the link as memory_link answers it."""
        await self.hooks.fire(HookEvent.POST_LINK, {"link": link_dict(row)})
        made = link_dict(row)
        await self.writes.publish("link.attested", made)
        return made

    async def _namespace_of(self, memory_id: str) -> str:
        """The stored memory's namespace ("" when there is none by that id)."""
        row = await self.db.read(memories.get, memory_id)
        return row.namespace if row is not None else ""

    # ---- how a signature is checked --------------------------------------------------------

    async def _verify(self, id: str) -> dict[str, Any]:
        link = await self.db.read(links.get, id)
        if link is not None:
            if self.gate is not None:  # a link says what its ends' namespaces may: verify in both
                ends = await self.db.read(memories.get_many, {link.src_id, link.dst_id})
                for ns in sorted({m.namespace for m in ends.values()}):
                    await self.writes.permit(ns, Operation.VERIFY)
            verified, reason = await self._verify_link_row(link)
            return {"link_id": link.link_id, "signature_verified": verified, "attest_level": link.attest_level,
                    "signed_by": link.signed_by, "signed_at": link.valid_from if link.signature else None,
                    "reason": reason}
        memory = await self.db.read(memories.get, id)
        if memory is None:
            raise ServiceError("not_found", f"no link or memory with id {id!r}")
        await self.writes.permit(memory.namespace, Operation.VERIFY)
        verified, reason = await self._verify_signature(MemoryPayload.of(memory), memory.signature,
                                                        memory.signed_by, "memory version")
        return {"memory_id": memory.id, "version": memory.version, "signature_verified": verified,
                "attest_level": memory.attest_level, "signed_by": memory.signed_by,
                "signed_at": memory.updated_at if memory.signature else None, "reason": reason}

    async def _verify_link_row(self, row: LinkRow) -> tuple[bool, str | None]:
        try:
            payload = LinkPayload.from_mapping(asdict(row))
        except attest.AttestError as e:
            return False, f"stored row no longer forms a valid payload: {e.message}"
        if payload.link_id != row.link_id:
            return False, "stored fields do not hash to the link_id (row altered)"
        return await self._verify_signature(payload, row.signature, row.signed_by, "link")

    async def _verify_signature(self, payload: LinkPayload | MemoryPayload, signature: bytes | None,
                          signed_by: str | None, what: str) -> tuple[bool, str | None]:
        if signature is None or signed_by is None:
            return False, f"{what} is unsigned"
        keys = self.keyring.keys_for(signed_by)
        if not keys:  # an agent's: the keys delegations by nodes trusted here vouch for
            keys = tuple(key for _, key in await self.db.read(self._book.vouched_keys, signed_by))
        if not keys:
            return False, f"signer {signed_by!r} is not a trusted key on this node, nor an agent one vouches for"
        if not attest.verify_any(keys, payload, signature):
            return False, "signature does not verify against the signer's keys (row altered or forged)"
        return True, None

    # ---- approvals' replay and the read bounds ---------------------------------------------

    def _approvals(self) -> Approvals:
        if self.approvals is None:
            raise ServiceError("approvals_unavailable", "this service was built without pending actions")
        return self.approvals

    async def _replay(self, call: dict[str, Any], agent: str) -> Any:
        """The parked call run again as the agent that made it (an agent revoked since fails the action)."""
        with acting_as(await self.agents.principal(agent)):
            return await self._run_parked(call)

    async def _run_parked(self, call: dict[str, Any]) -> Any:
        method, args = call.get("method"), dict(call.get("args") or {})
        match method:
            case "memory_store":
                return await self.memory_store(args.pop("content"), **args)
            case "memory_update":
                return await self.memory_update(args.pop("memory_id"), **args)
            case "memory_link":
                return await self.memory_link(args.pop("src_id"), args.pop("dst_id"), args.pop("relation"), **args)
            case "memory_kg_invalidate":
                return await self.kg.invalidate(args.pop("link_id"), **args)
        raise ServiceError("bad_input", f"a pending action cannot run {method!r}")

    def _check_limit(self, limit: Any) -> None:
        top = self.cfg.limits.max_recall_limit
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= top:
            raise ServiceError("bad_input", f"limit must be an integer 1..{top}, got {limit!r}")


def relative_scores(raw: list[float]) -> list[float]:
    """Recall scores on the one scale both backends share (docs/operations.md, "Recall scores"): each hit's
    engine score (SQLite's bm25, Postgres's ts_rank: neither bounded, nor comparable with the other) over the
    best hit's, to 4 places: 1.0 for the best, the others their share of it, in (0, 1]. ``raw`` is best first."""
    best = max(raw, default=0.0)
    if best <= 0:
        return [1.0] * len(raw)  # no engine weight told the hits apart
    return [max(round(x / best, 4), 0.0001) for x in raw]
