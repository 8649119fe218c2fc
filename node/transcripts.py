"""Transcripts: the conversation or reasoning trail behind memories, stored zstd-compressed, and replay of
the exact spans a memory was drawn from (docs/transcripts.md).

Opt-in per namespace (``[transcripts."<ns>"] enabled``). A transcript is a signed record: canonical
CBOR ``{type: "transcript.put", id, namespace, agent, created_at, content_hash, raw_bytes, spans}``
(node/attest.py), appended to signed_events and, when the namespace says ``replicate = true``, sent to
the peers that may see the namespace as a ``transcript.put``. Spans are ``[start, end)`` in Unicode code
points of the text (what ``text[start:end]`` means in Python), so a span never splits a UTF-8 sequence.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from node.attest import AttestLevel, TranscriptPayload
from node.config import TranscriptPolicy
from node.errors import ServiceError
from node.hooks import HookEvent
from node.limits import check_text
from node.permissions.rules import Operation
from node.writepath import Queued, WritePath
from storage import changelog, events, memories, transcripts
from storage.errors import StorageError
from storage.memories import MemoryRow
from storage.transcripts import Span, TranscriptRow

log = logging.getLogger("node.transcripts")


# Room left in one A2A message for the envelope and the signed fields around a replicated transcript's frame.
ENVELOPE_ROOM_BYTES = 64 * 1024


def parse_spans(spans: Any, text: str, max_spans: int, max_id_chars: int) -> list[Span]:
    """Validated, sorted, distinct spans over ``text``; ServiceError bad_input / too_large / span_out_of_range."""
    if spans is None:
        return []
    if not isinstance(spans, Sequence) or isinstance(spans, (str, bytes)):
        raise ServiceError("bad_input", f"spans must be a list of {{memory_id, start, end}}, got {spans!r}")
    if len(spans) > max_spans:
        raise ServiceError("too_large", f"{len(spans)} spans, the limit is {max_spans}")
    length = len(text)
    out = set()
    for i, s in enumerate(spans):
        if not isinstance(s, Mapping) or set(s) != {"memory_id", "start", "end"}:
            raise ServiceError("bad_input", f"spans[{i}] must be exactly {{memory_id, start, end}}, got {s!r}")
        check_text(f"spans[{i}].memory_id", s["memory_id"], max_id_chars, allow_empty=False)
        start, end = s["start"], s["end"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            raise ServiceError("bad_input", f"spans[{i}] start and end must be integers, got {start!r}, {end!r}")
        if not 0 <= start < end <= length:
            raise ServiceError("span_out_of_range", f"spans[{i}] [{start}, {end}) is not a non-empty range within "
                                                    f"the transcript's {length} characters (code points)")
        out.add(Span(s["memory_id"], start, end))
    return sorted(out)


def transcript_wire(row: TranscriptRow, spans: Sequence[Span]) -> dict[str, Any]:
    """The transcript.put body: the signed fields, the zstd frame as stored, the signature and signer."""
    return {"transcript": payload_of(row, spans).to_dict(), "body": row.body,
            "signature": row.signature, "signed_by": row.signed_by}


def payload_of(row: TranscriptRow, spans: Sequence[Span]) -> TranscriptPayload:
    return TranscriptPayload(id=row.id, namespace=row.namespace, agent=row.agent, created_at=row.created_at,
                             content_hash=row.content_hash, raw_bytes=row.raw_bytes,
                             spans=tuple((s.memory_id, s.start, s.end) for s in spans))


def transcript_dict(row: TranscriptRow, spans: Sequence[Span]) -> dict[str, Any]:
    return {"id": row.id, "namespace": row.namespace, "agent": row.agent, "created_at": row.created_at,
            "raw_bytes": row.raw_bytes, "stored_bytes": row.stored_bytes, "content_hash": row.content_hash,
            "attest_level": row.attest_level, "signed_by": row.signed_by,
            "signature": row.signature.hex() if row.signature else None, "received_from": row.received_from,
            "archived_at": row.archived_at,
            "spans": [{"memory_id": s.memory_id, "start": s.start, "end": s.end} for s in spans]}


def scope_of(namespace: str, share_with: tuple[str, ...] | None) -> MemoryRow:
    """Who may see a transcript is who may see a memory of its namespace: a stand-in row the federation's
    audience rule (namespace policy and share_with) reads like any memory."""
    return MemoryRow(id="", namespace=namespace, title="", content="", origin="", created_at=0, updated_at=0,
                     share_with=share_with)


def inbound_row(payload: TranscriptPayload, body: bytes, policy: TranscriptPolicy, *, signature: bytes | None,
                level: AttestLevel, sender: str) -> TranscriptRow | str:
    """A received transcript as the row to store, or the reject code: over the namespace's size or span
    limits (``too_large``), a frame that does not decode to the signed size and hash (``transcript_corrupt``),
    or a span past the end of the text (``span_out_of_range``). Decoding is bounded by the signed size."""
    if payload.raw_bytes > policy.max_bytes or len(body) > zstd_bound(policy.max_bytes):
        return "too_large"
    if len(payload.spans) > policy.max_spans:
        return "too_large"
    attested = level is not AttestLevel.UNSIGNED  # verified here (a peer's key, or ours on a restore)
    row = TranscriptRow(id=payload.id, namespace=payload.namespace, agent=payload.agent,
                        created_at=payload.created_at, body=body, raw_bytes=payload.raw_bytes,
                        stored_bytes=len(body), content_hash=payload.content_hash,
                        signature=signature if attested else None, attest_level=str(level),
                        signed_by=payload.agent if attested else None, received_from=sender)
    try:
        text = transcripts.decompress(row)
    except StorageError as e:
        return e.code
    if any(end > len(text) or start == end for _, start, end in payload.spans):
        return "span_out_of_range"
    # The row keeps the writer's created_at: the TTL runs from the same instant on every node.
    return row


def zstd_bound(raw_bytes: int) -> int:
    """The largest zstd frame ``raw_bytes`` of input can need (ZSTD_COMPRESSBOUND, plus the frame header)."""
    return raw_bytes + (raw_bytes >> 8) + 64


def spans_of(payload: TranscriptPayload) -> list[Span]:
    return [Span(m, s, e) for m, s, e in payload.spans]


class MemoryStore(Protocol):
    """Stores one memory as the service's ``memory_store`` does (hooks, gate, quota, replication); returns it
    with its minted ``id``."""

    def __call__(self, content: str, *, title: str = ..., namespace: str = ...,
                 source: str = ...) -> Awaitable[dict[str, Any]]: ...


class TranscriptRoom:
    """The transcript operations of one store (``svc.transcripts``): written through ``writes`` as any local
    write; ``clock`` gives now in unix ms; ``store_memory`` stores the memories a hook proposes."""

    def __init__(self, writes: WritePath, clock: Callable[[], int], store_memory: MemoryStore) -> None:
        self.writes = writes
        self.db = writes.db
        self.clock = clock
        self.store_memory = store_memory
        self.cfg = writes.cfg.transcripts

    async def _check_replay(self, namespace: str, full: bool) -> None:
        """Raise unless this node's agent may replay transcripts of ``namespace``: the permission gate's
        ``replay`` operation first (a deny or an ask refuses; a read is never parked), then the namespace:
        cited spans always, the whole text only where it says ``replay = "allow"``."""
        await self.writes.permit(namespace, Operation.REPLAY)
        if full and self.cfg.policy(namespace).replay != "allow":
            raise ServiceError("permission_denied", f"agent {self.writes.agent_id!r} may not replay whole "
                                                    f"transcripts of namespace {namespace!r} (its cited spans only; "
                                                    f"[transcripts.{namespace!r}] replay = \"allow\" permits it)")

    async def store(self, content: str, *, namespace: str = "default",
                    spans: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """Store a transcript (its spans cite memories already stored); returns its record, times in unix ms."""
        policy = await self._admit(content, namespace, spans)
        transcript_id = str(uuid.uuid4())
        p = await self.writes.hooks.fire(HookEvent.PRE_TRANSCRIPT_STORE, {
            "session_id": transcript_id, "content": content, "agent_id": self.writes.agent_id})
        content = p["content"]
        self._check_text(content, policy.max_bytes)
        cited = parse_spans(spans, content, policy.max_spans, self.writes.cfg.limits.max_id_chars)
        await self._check_known({s.memory_id for s in cited})
        room = policy.max_spans - len(cited)
        cited = sorted({*cited, *await self._store_proposed(p.get("memories") or [], content, namespace,
                                                             transcript_id, room)})
        row = await self._signed_row(transcript_id, namespace, content, cited, policy)
        audience, queued = await self.db.write(self._writer(row, cited, policy.replicate))
        await self.writes.hooks.fire(HookEvent.POST_TRANSCRIPT_STORE, {"session_id": transcript_id,
                                                                       "transcript_id": transcript_id})
        return {**transcript_dict(row, cited), **await self.writes.after_write(queued, audience)}

    async def _admit(self, content: str, namespace: str, spans: Sequence[Mapping[str, Any]] | None) -> TranscriptPolicy:
        """The checks before the pre hooks: the namespace keeps transcripts, the text and spans are within its
        limits, the gate's ``store`` (an ask refuses: a transcript is not parked), the database budget."""
        lim = self.writes.cfg.limits
        check_text("namespace", namespace, lim.max_namespace_chars, allow_empty=False)
        policy = self.cfg.policy(namespace)
        if not policy.enabled:
            raise ServiceError("transcripts_disabled", f"namespace {namespace!r} does not keep transcripts "
                                                       f"([transcripts.{namespace!r}] enabled = true turns them on)")
        self._check_text(content, policy.max_bytes)
        parse_spans(spans, content, policy.max_spans, lim.max_id_chars)
        await self.writes.permit(namespace, Operation.STORE)
        self.writes.check_db_budget()
        return policy

    async def _signed_row(self, transcript_id: str, namespace: str, content: str, cited: list[Span],
                          policy: TranscriptPolicy) -> TranscriptRow:
        """The compressed, signed row; a replicating namespace's must fit one message (``too_large``)."""
        body, raw_bytes, digest = await asyncio.to_thread(transcripts.compress, content)
        carry = self.writes.cfg.a2a.max_message_bytes - ENVELOPE_ROOM_BYTES
        if policy.replicate and len(body) > carry:
            raise ServiceError("too_large", f"the compressed transcript is {len(body)} bytes; namespace "
                                            f"{namespace!r} replicates, and one message carries at most {carry} "
                                            "(a2a.max_message_bytes)")
        row = TranscriptRow(id=transcript_id, namespace=namespace, agent=self.writes.agent_id,
                            created_at=self.clock(), body=body, raw_bytes=raw_bytes, stored_bytes=len(body),
                            content_hash=digest, attest_level=str(AttestLevel.UNSIGNED))
        signed = self.writes.sign(payload_of(row, cited))
        if signed.signature is None:
            return row
        return replace(row, signature=signed.signature, signed_by=signed.signed_by, attest_level=signed.attest_level)

    def _writer(self, row: TranscriptRow, cited: list[Span],
                replicate: bool) -> Callable[[Any], tuple[list[MemoryRow], Queued]]:
        """The write transaction of ``row``: its cited memories still stored, the row, its audit event and,
        where the namespace replicates, its change-log entry and outbox rows. Returns who may see it and those."""
        record_hash = payload_of(row, cited).record_hash
        scope = scope_of(row.namespace, self.writes.share_with(row.namespace))
        ts = row.created_at

        def write(conn: Any) -> tuple[list[MemoryRow], Queued]:
            ids = {s.memory_id for s in cited}
            found = memories.get_many(conn, ids) if ids else {}
            missing = sorted(ids - set(found))
            if missing:
                raise ServiceError("unknown_memory", f"no memory with id {', '.join(map(repr, missing))}; "
                                                     "nothing stored")
            transcripts.insert(conn, row, cited)
            events.append(conn, "transcript", row.id, row.agent, record_hash, row.signature, ts)
            # A transcript goes where its namespace and every memory it cites may go.
            audience = [scope, *found.values()]
            if not replicate:
                return audience, []
            # The change log's 'link' kind carries the signed records beside memories (its CHECK admits only
            # 'memory' and 'link'): links, invalidations, and the transcripts catch-up sync serves.
            changelog.append(conn, "link", row.id, 1, ts)
            return audience, self.writes.replicate(conn, "transcript.put", transcript_wire(row, cited), audience, ts)

        return write

    async def _check_known(self, ids: set[str]) -> None:
        """Every cited memory is stored here and one the agent may ``get`` (a span quotes it)."""
        found = await self.db.read(memories.get_many, ids) if ids else {}
        missing = sorted(ids - set(found))
        if missing:
            raise ServiceError("unknown_memory", f"no memory with id {', '.join(map(repr, missing))}; nothing stored")
        for ns in sorted({m.namespace for m in found.values()}):
            await self.writes.permit(ns, Operation.GET)

    async def _store_proposed(self, proposals: Sequence[Mapping[str, Any]], content: str, namespace: str,
                              transcript_id: str, room: int) -> list[Span]:
        """Store the memories a pre_transcript_store hook proposed (tools/extract/), each citing its span; a
        proposal past the text, past ``max_spans``, or refused by the memory checks is advice not taken."""
        out: list[Span] = []
        for prop in proposals[:max(room, 0)]:
            if prop["end"] > len(content):
                continue
            try:
                m = await self.store_memory(prop["content"], title=prop.get("title", ""), namespace=namespace,
                                            source=f"transcript:{transcript_id}")
            except ServiceError as e:
                log.info("proposed_memory_skipped", extra={"ev": {"transcript_id": transcript_id, "code": e.code}})
                continue
            out.append(Span(str(m["id"]), prop["start"], prop["end"]))
        return out

    def _check_text(self, content: Any, max_bytes: int) -> None:
        if not isinstance(content, str) or not content:
            raise ServiceError("bad_input", "content must be a non-empty string")
        size = len(content.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise ServiceError("too_large", f"transcript is {size} UTF-8 bytes, the limit is {max_bytes}")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError:
            raise ServiceError("bad_input", "content holds a lone surrogate; it is not valid UTF-8 text") from None

    async def replay(self, memory_id: str, *, full: bool = False) -> dict[str, Any]:
        """The spans of transcripts ``memory_id`` was drawn from (each with its text), or with ``full`` the
        whole transcripts, where the namespace allows it. Archived transcripts replay too; pruned ones are gone."""
        self.writes.check_id("memory_id", memory_id)
        if not isinstance(full, bool):
            raise ServiceError("bad_input", f"full must be true or false, got {full!r}")

        def read(conn: Any) -> tuple[MemoryRow | None, list[tuple[TranscriptRow, list[Span]]]]:
            memory = memories.get(conn, memory_id)
            cited: dict[str, list[Span]] = {}
            for tid, start, end in transcripts.spans_of_memory(conn, memory_id):
                cited.setdefault(tid, []).append(Span(memory_id, start, end))
            found = [(t, cited[tid]) for tid in cited if (t := transcripts.get(conn, tid)) is not None]
            return memory, found

        memory, found = await self.db.read(read)
        if memory is None:
            raise ServiceError("unknown_memory", f"no memory with id {memory_id!r}")
        # The spans a memory was drawn from are its content: read as memory_get reads it.
        await self.writes.permit(memory.namespace, Operation.GET)
        for namespace in sorted({row.namespace for row, _ in found}):
            await self._check_replay(namespace, full)
        out = []
        for row, spans in found:
            try:
                text = await asyncio.to_thread(transcripts.decompress, row)
            except StorageError as e:
                raise ServiceError(e.code, e.message) from None
            item = {"transcript_id": row.id, "namespace": row.namespace, "agent": row.agent,
                    "created_at": row.created_at, "attest_level": row.attest_level,
                    "archived": row.archived_at is not None,
                    "spans": [{"start": s.start, "end": s.end, "text": text[s.start:s.end]} for s in spans]}
            if full:
                item["text"] = text
            out.append(item)
        return {"memory_id": memory_id, "full": full, "transcripts": out, "count": len(out)}

    async def run_lifecycle(self) -> None:
        """A lifecycle pass every ``lifecycle_interval_s`` (seconds) until cancelled; the node's TaskGroup owns it."""
        while True:
            await asyncio.sleep(self.cfg.lifecycle_interval_s)
            try:
                done = await self.lifecycle()
            except Exception as e:  # a failed pass (disk, corrupt row) is logged; the next one retries
                log.warning("transcript_lifecycle_failed", extra={"ev": {"error": f"{type(e).__name__}: {e}"}})
                continue
            if done["archived"] or done["pruned"]:
                log.info("transcript_lifecycle", extra={"ev": {"archived": len(done["archived"]),
                                                               "pruned": len(done["pruned"])}})

    async def lifecycle(self) -> dict[str, Any]:
        """One pass: move transcripts past their namespace's ``ttl_s`` to the archive, delete archived ones past
        ``prune_after_s`` (with their span links). At most ``lifecycle_batch`` of each per namespace."""
        now = self.clock()
        batch = self.cfg.lifecycle_batch

        def write(conn: Any) -> dict[str, list[str]]:
            archived: list[str] = []
            pruned: list[str] = []
            for ns in transcripts.namespaces(conn):
                policy = self.cfg.policy(ns)
                archived += transcripts.archive_older(conn, ns, now - int(policy.ttl_s * 1000), now, batch)
                pruned += transcripts.prune_older(conn, ns, now - int(policy.prune_after_s * 1000), batch)
            return {"archived": archived, "pruned": pruned}

        done = await self.db.write(write)
        return {"at": now, **done}
