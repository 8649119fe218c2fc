"""The service layer: the node's operations, used by the CLI, MCP and inbound federation alike.

Each write is one storage transaction holding the row, its signed_event, its change-log entry
and its outbox entries, so a crash loses nothing and a commit means all of it happened.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from mesh import keys as mesh_keys
from mesh.errors import MeshError
from node import attest
from node.attest import AttestLevel, LinkPayload
from node.config import NodeConfig
from node.errors import ServiceError
from node.kg import KnowledgeGraph
from storage import changelog, events, links, memories, outbox
from storage.backend import open_database
from storage.db import Database
from storage.links import LinkRow
from storage.memories import MemoryRow

Clock = Callable[[], int]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Service:
    """Operations on one node's store. Create with ``await Service.open(cfg)``; close with ``close()``."""

    def __init__(self, cfg: NodeConfig, db: Database, identity: mesh_keys.Identity | None,
                 *, clock: Clock = now_ms) -> None:
        self.cfg = cfg
        self.db = db
        self.identity = identity
        self.clock = clock
        self._peer_keys: dict[str, Ed25519PublicKey] = {}
        self._peers_stamp: tuple[int, int] | None = None
        self.reload_peer_keys()
        # Set by the node when federation runs: ``replicate`` is called inside each write transaction,
        # ``outbox_wake`` after its commit, ``await_quorum`` to wait for peer ACKs.
        self.replicate: Callable[..., list[tuple[str, str]]] | None = None
        self.outbox_wake: Callable[[], None] | None = None
        self.await_quorum: Callable[[list[tuple[str, str]], str], Awaitable[int]] | None = None
        self.federation: Any = None
        # The running node (links, sender, seen-cache) when this service serves one; None for the CLI.
        self.runtime: Any = None
        # memory_kg_query / memory_find_paths / memory_kg_timeline / memory_kg_invalidate (node/kg.py).
        self.kg = KnowledgeGraph(self)

    @classmethod
    async def open(cls, cfg: NodeConfig, *, clock: Clock = now_ms, require_identity: bool = False) -> Service:
        identity = load_node_identity(cfg, required=require_identity)
        st = cfg.storage
        db = await open_database(backend=st.backend, path=cfg.db_path, dsn=st.dsn, batch_max=st.batch_max,
                                 readers=st.readers, synchronous=st.synchronous, age=st.age)
        svc = cls(cfg, db, identity, clock=clock)
        # Writes replicate whichever process makes them (node or CLI): the outbox is in the database.
        from node.federation import Federation
        svc.federation = Federation(svc)
        return svc

    async def close(self) -> None:
        if self.federation is not None:
            self.federation.close()
        await self.db.close()

    @property
    def agent_id(self) -> str:
        if self.identity is not None:
            return self.identity.agent_id
        return self.cfg.agent_id or "anonymous"

    @property
    def peer_keys(self) -> dict[str, Ed25519PublicKey]:
        """Trusted peer keys, re-read when <home>/peers changes (an `identity import` takes effect live)."""
        if self._stamp() != self._peers_stamp:
            self.reload_peer_keys()
        return self._peer_keys

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.cfg.peers_dir.stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_ino

    def reload_peer_keys(self) -> None:
        self._peers_stamp = self._stamp()
        keys, _bad = mesh_keys.load_peer_keys(self.cfg.peers_dir)
        self._peer_keys = keys

    def key_for(self, agent_id: str) -> Ed25519PublicKey | None:
        """The public key this node trusts for ``agent_id``: its own, or a peer's .pub."""
        if self.identity is not None and agent_id == self.identity.agent_id:
            return self.identity.public_key
        return self.peer_keys.get(agent_id)

    # ---- memories -------------------------------------------------------------------------

    async def memory_store(self, content: str, *, title: str = "", namespace: str = "default",
                           tags: Sequence[str] = (), priority: int = 5, confidence: float = 1.0,
                           source: str = "") -> dict[str, Any]:
        """Store a new memory; returns it with its minted UUIDv4 ``id`` and times in unix ms."""
        self._check_memory_fields(content, title, namespace, tags, priority, confidence, source)
        self._check_db_budget()
        ts = self.clock()
        row = MemoryRow(id=str(uuid.uuid4()), namespace=namespace, title=title, content=content,
                        tags=tuple(tags), priority=priority, confidence=float(confidence), source=source,
                        origin=self.agent_id, version=1, created_at=ts, updated_at=ts)

        def write(conn):
            memories.insert(conn, row)
            changelog.append(conn, "memory", row.id, row.version, ts)
            return self._replicate(conn, "memory.put", {"memory": memory_wire(row)}, namespace, ts)

        queued = await self.db.write(write)
        return {**memory_dict(row), **await self._after_write(queued, namespace)}

    async def memory_update(self, memory_id: str, *, content: str | None = None, title: str | None = None,
                            tags: Sequence[str] | None = None, priority: int | None = None,
                            confidence: float | None = None, source: str | None = None) -> dict[str, Any]:
        """Change the given fields; bumps ``version`` and ``updated_at`` (unix ms) and replicates the new version."""
        self._check_id("id", memory_id)
        given = {k: v for k, v in {"content": content, "title": title, "tags": tags, "priority": priority,
                                   "confidence": confidence, "source": source}.items() if v is not None}
        if not given:
            raise ServiceError("bad_input", "nothing to update: give at least one field")
        current = await self.db.read(memories.get, memory_id)
        if current is None:
            raise ServiceError("not_found", f"no memory with id {memory_id!r}")
        merged = {**memory_dict(current), **given}
        self._check_memory_fields(merged["content"], merged["title"], merged["namespace"], merged["tags"],
                                  merged["priority"], merged["confidence"], merged["source"])
        ts = self.clock()

        def write(conn):
            row = memories.update(conn, memory_id, origin=self.agent_id, updated_at=ts, **given)
            changelog.append(conn, "memory", row.id, row.version, ts)
            return row, self._replicate(conn, "memory.put", {"memory": memory_wire(row)}, row.namespace, ts)

        row, queued = await self.db.write(write)
        return {**memory_dict(row), **await self._after_write(queued, row.namespace)}

    async def memory_get(self, memory_id: str) -> dict[str, Any]:
        self._check_id("id", memory_id)
        row = await self.db.read(memories.get, memory_id)
        if row is None:
            raise ServiceError("not_found", f"no memory with id {memory_id!r}")
        return memory_dict(row)

    async def memory_list(self, *, namespace: str | None = None, limit: int = 50,
                          offset: int = 0) -> list[dict[str, Any]]:
        self._check_limit(limit)
        if offset < 0:
            raise ServiceError("bad_input", f"offset must be >= 0, got {offset}")
        rows = await self.db.read(memories.list_, namespace, limit, offset)
        return [memory_dict(r) for r in rows]

    async def memory_recall(self, query: str, *, limit: int = 10,
                            namespace: str | None = None) -> list[dict[str, Any]]:
        """Full-text recall ranked by BM25 (best first); any user string is safe as a query."""
        if not isinstance(query, str) or not query.strip():
            raise ServiceError("bad_input", "query must be a non-empty string")
        if len(query) > self.cfg.limits.max_query_chars:
            raise ServiceError("too_large",
                               f"query is {len(query)} chars, the limit is {self.cfg.limits.max_query_chars}")
        self._check_limit(limit)
        hits = await self.db.read(memories.recall, query, limit, namespace)
        return [{**memory_dict(r), "score": score} for r, score in hits]

    # ---- links ----------------------------------------------------------------------------

    async def memory_link(self, src_id: str, dst_id: str, relation: str, *, valid_until: int | None = None,
                          confidence: float | None = None) -> dict[str, Any]:
        """Link two stored memories; signed with the node key (self_signed) when it has one."""
        self._check_id("src_id", src_id)
        self._check_id("dst_id", dst_id)
        if not isinstance(relation, str) or not relation.strip():
            raise ServiceError("bad_input", "relation must be a non-empty string")
        if len(relation) > self.cfg.limits.max_relation_chars:
            raise ServiceError("too_large",
                               f"relation is {len(relation)} chars, the limit is {self.cfg.limits.max_relation_chars}")
        if confidence is not None:
            self._check_confidence(confidence)
        ts = self.clock()
        try:
            payload = LinkPayload(src_id=src_id, dst_id=dst_id, relation=relation, observed_by=self.agent_id,
                                  valid_from=ts, valid_until=valid_until)
        except attest.AttestError as e:
            raise ServiceError("bad_input", e.message) from None
        if valid_until is not None and valid_until <= ts:
            raise ServiceError("bad_input", f"valid_until {valid_until} is not in the future (now {ts} ms)")
        signature = attest.sign(self.identity.private_key, payload) if self.identity else None
        level = AttestLevel.SELF_SIGNED if signature else AttestLevel.UNSIGNED
        row = LinkRow(link_id=payload.link_id, **payload.to_dict(),
                      confidence=None if confidence is None else float(confidence), signature=signature,
                      attest_level=str(level), signed_by=self.agent_id if signature else None,
                      received_from=None, created_at=ts)

        def write(conn):
            found = memories.exists(conn, {src_id, dst_id})
            missing = sorted({src_id, dst_id} - found)
            if missing:
                raise ServiceError("unknown_memory", f"no memory with id {', '.join(map(repr, missing))}")
            links.insert(conn, row)
            events.append(conn, "link", row.link_id, self.agent_id, row.link_id, signature, ts)
            changelog.append(conn, "link", row.link_id, 1, ts)
            namespace = memories.get(conn, src_id).namespace
            return namespace, self._replicate(conn, "link.put", link_wire(row), namespace, ts)

        namespace, queued = await self.db.write(write)
        return {**link_dict(row), **await self._after_write(queued, namespace)}

    async def memory_verify(self, link_id: str) -> dict[str, Any]:
        """Re-derive the signed payload from the stored row and check link_id and signature."""
        self._check_id("link_id", link_id)
        row = await self.db.read(links.get, link_id)
        if row is None:
            raise ServiceError("not_found", f"no link with id {link_id!r}")
        verified, reason = self._verify_row(row)
        return {"link_id": row.link_id, "signature_verified": verified, "attest_level": row.attest_level,
                "signed_by": row.signed_by, "signed_at": row.valid_from if row.signature else None,
                "reason": reason}

    def _verify_row(self, row: LinkRow) -> tuple[bool, str | None]:
        try:
            payload = LinkPayload.from_mapping(asdict(row))
        except attest.AttestError as e:
            return False, f"stored row no longer forms a valid payload: {e.message}"
        if payload.link_id != row.link_id:
            return False, "stored fields do not hash to the link_id (row altered)"
        if row.signature is None or row.signed_by is None:
            return False, "link is unsigned"
        key = self.key_for(row.signed_by)
        if key is None:
            return False, f"signer {row.signed_by!r} is not a trusted key on this node"
        if not attest.verify(key, payload, row.signature):
            return False, "signature does not verify against the signer's key"
        return True, None

    async def links_list(self, *, attest_level: str | None = None, limit: int = 50,
                         offset: int = 0) -> list[dict[str, Any]]:
        if attest_level is not None and attest_level not in {str(a) for a in AttestLevel}:
            raise ServiceError("bad_input",
                               f"attest_level must be one of {', '.join(map(str, AttestLevel))}, got {attest_level!r}")
        self._check_limit(limit)
        rows = await self.db.read(links.list_, attest_level, limit, offset)
        return [link_dict(r) for r in rows]

    async def audit_verify(self) -> dict[str, Any]:
        """Walk the signed_events hash chain; names the first bad seq when broken."""
        report = await self.db.read(events.verify_chain)
        return {"ok": report.ok, "checked": report.checked, "first_bad_seq": report.first_bad_seq,
                "reason": report.reason}

    # ---- live state -----------------------------------------------------------------------

    async def peers(self) -> list[dict[str, Any]]:
        """One row per configured or trusted peer (link state is live only inside a running node)."""
        if self.runtime is not None:
            return await self.runtime.peers()
        from node.peers import peer_rows
        return await peer_rows(self)

    async def capabilities(self) -> dict[str, Any]:
        """Honest live state: only what this process actually does and holds right now."""
        def read(conn) -> dict[str, Any]:
            return {"links": links.counts_by_attest_level(conn), "memories": memories.count(conn),
                    "outbox_depth": outbox.depth(conn), "dead_letters": outbox.dead_letter_count(conn),
                    "change_log_seq": changelog.last_seq(conn), "counters": changelog.all_counters(conn)}

        stored = await self.db.read(read)
        peers = await self.peers()
        caps: dict[str, Any] = {
            "schema_version": self.db.schema_version,
            "agent_id": self.agent_id,
            "key_fingerprint": self.identity.fingerprint if self.identity else None,
            "signing": self.identity is not None,
            "memories": stored["memories"],
            "links_by_attest_level": stored["links"],
            "outbox_depth": stored["outbox_depth"],
            "dead_letters": stored["dead_letters"],
            "change_log_seq": stored["change_log_seq"],
            # Durable tallies: inbound changes applied by kind and outcome, rejections by code.
            "applied": stored["counters"],
            "peers": [{k: p[k] for k in ("agent_id", "link_state", "last_ack_age_s", "trusted_key")} for p in peers],
            "write_quorum": self.cfg.federation.write_quorum,
            "limits": asdict(self.cfg.limits),
            "node_running": self.runtime is not None,
            "kg_backend": self.kg.backend,
        }
        if self.runtime is not None:
            caps["a2a"] = self.runtime.a2a_stats()
            caps["transports"] = self.runtime.transports()
        return caps

    # ---- replication hook -----------------------------------------------------------------

    def _replicate(self, conn, kind: str, body: dict[str, Any], namespace: str, ts: int) -> list[tuple[str, str]]:
        """Enqueue the change for the peers (same transaction); returns (peer, correlation_id) pairs."""
        if self.replicate is None:
            return []
        return self.replicate(conn, {"kind": kind, **body}, namespace, ts)

    async def _after_write(self, queued: list[tuple[str, str]], namespace: str) -> dict[str, Any]:
        """Wake the sender; with a write quorum above 1, wait for it. Returns fields for the result."""
        if not queued:
            return {}
        if self.outbox_wake is not None:
            self.outbox_wake()
        result: dict[str, Any] = {"replicating_to": sorted(p for p, _ in queued)}
        if self.await_quorum is not None and self.cfg.federation.write_quorum != 1:
            result["acked_nodes"] = await self.await_quorum(queued, namespace)
        return result

    # ---- validation -----------------------------------------------------------------------

    def _check_memory_fields(self, content: Any, title: Any, namespace: Any, tags: Any, priority: Any,
                             confidence: Any, source: Any) -> None:
        lim = self.cfg.limits
        if not isinstance(content, str) or not content.strip():
            raise ServiceError("content_empty", "content must be a non-empty string")
        size = len(content.encode("utf-8"))
        if size > lim.max_content_bytes:
            raise ServiceError("too_large", f"content is {size} bytes, the limit is {lim.max_content_bytes}")
        _check_text("title", title, lim.max_title_chars, allow_empty=True)
        _check_text("namespace", namespace, lim.max_namespace_chars, allow_empty=False)
        _check_text("source", source, lim.max_source_chars, allow_empty=True)
        if isinstance(tags, str) or not isinstance(tags, Sequence):
            raise ServiceError("bad_input", f"tags must be a list of strings, got {tags!r}")
        if len(tags) > lim.max_tags:
            raise ServiceError("too_large", f"{len(tags)} tags, the limit is {lim.max_tags}")
        for t in tags:
            _check_text("tag", t, lim.max_tag_chars, allow_empty=False)
        if not isinstance(priority, int) or isinstance(priority, bool) or not 1 <= priority <= 10:
            raise ServiceError("bad_input", f"priority must be an integer 1..10, got {priority!r}")
        self._check_confidence(confidence)

    def _check_db_budget(self) -> None:
        """Refuse new memories once the database (with its WAL) is past ``limits.max_db_bytes``."""
        path = self.cfg.db_path
        size = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
        if size > self.cfg.limits.max_db_bytes:
            raise ServiceError("storage_full", f"the database holds {size} bytes, past limits.max_db_bytes "
                                               f"({self.cfg.limits.max_db_bytes}); new memories are refused")

    @staticmethod
    def _check_confidence(confidence: Any) -> None:
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.0 <= confidence <= 1.0:
            raise ServiceError("bad_input", f"confidence must be a number in 0..1, got {confidence!r}")

    def _check_id(self, name: str, value: Any) -> None:
        _check_text(name, value, self.cfg.limits.max_id_chars, allow_empty=False)

    def _check_limit(self, limit: Any) -> None:
        top = self.cfg.limits.max_recall_limit
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= top:
            raise ServiceError("bad_input", f"limit must be an integer 1..{top}, got {limit!r}")


def _check_text(name: str, value: Any, max_chars: int, *, allow_empty: bool) -> None:
    if not isinstance(value, str):
        raise ServiceError("bad_input", f"{name} must be a string, got {value!r}")
    if not allow_empty and not value.strip():
        raise ServiceError("bad_input", f"{name} must not be empty")
    if len(value) > max_chars:
        raise ServiceError("too_large", f"{name} is {len(value)} chars, the limit is {max_chars}")
    if any(ord(c) < 32 and c not in "\t\n\r" for c in value):
        raise ServiceError("bad_input", f"{name} contains control characters")


def load_node_identity(cfg: NodeConfig, *, required: bool) -> mesh_keys.Identity | None:
    """The node's identity from <home>/keys (by cfg.agent_id when set); None when absent and not required."""
    try:
        return mesh_keys.load_identity(cfg.keys_dir, cfg.agent_id or None)
    except MeshError as e:
        if e.code == "no_identity" and not required:
            return None
        raise


def memory_dict(row: MemoryRow) -> dict[str, Any]:
    d = asdict(row)
    d["tags"] = list(row.tags)
    return d


def memory_wire(row: MemoryRow) -> dict[str, Any]:
    return memory_dict(row)


def link_dict(row: LinkRow) -> dict[str, Any]:
    d = asdict(row)
    d["signature"] = row.signature.hex() if row.signature else None
    return d


def link_wire(row: LinkRow) -> dict[str, Any]:
    """The link.put body: the six signed fields, the raw 64-byte signature and the signer."""
    link = {f: getattr(row, f) for f in attest.SIGNED_FIELDS}
    if row.confidence is not None:
        link["confidence"] = row.confidence
    return {"link": link, "signature": row.signature, "signed_by": row.signed_by}
