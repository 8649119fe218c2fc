"""A testbed node's inbound side in this process: its own config and store, behind the receive function its
server runs, with no TLS, HTTP or second process.

For the trust cases that exercise what a receiver accepts or refuses from a peer (tests/node/
test_trust_on_apply.py): the test plays a member with that member's real key (tests/integration/peer_play.py
builds and signs the payloads) and hands the envelope's bytes to ``mesh.receive.Receiver`` (decode, the
receive decision, the federation's apply: what both the HTTP and the WebSocket route call), wired as
``node.node.Node`` wires it. What the routes add (TLS identity, membership, HTTP statuses) keeps its
real-process tests in tests/integration/test_federation_trust.py.

- ``InProcessNode.open(spec)``: node ``spec`` of a ``testbed.mesh`` layout, opened from its config.toml.
- ``node.receive(sender, payload)``: one envelope from ``sender`` -> the ACK (None when none would be sent).
- ``node.carry_from(other)``: deliver what ``other`` queued for this node (its outbox rows, as the outbox
  sender would send them); each row once.
- ``node.memory_on(id)``, ``node.links_on()``, ``node.sync_all(peer)``: what the CLI's ``get``, ``links`` and
  a peer's pulls of GET /a2a/v1/sync to the end would show.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from a2a import Ack, SeenCache, new_envelope
from mesh.receive import Receiver
from node.assemble import assemble, open_store
from node.config import load_config
from node.errors import ServiceError
from node.federation.facade import Federation
from node.service import Service
from testbed.mesh import NodeSpec
from tests.integration.peer_play import TTL_MS, now_ms


@dataclass
class InProcessNode:
    spec: NodeSpec
    svc: Service
    fed: Federation
    receiver: Receiver
    # (peer, outbox row id) already carried from that peer's outbox to this node.
    carried: set[tuple[str, int]] = field(default_factory=set)

    @classmethod
    async def open(cls, spec: NodeSpec) -> InProcessNode:
        cfg = load_config(spec.config_path, env={"AI_MEMORY_HOME": str(spec.home)})
        store = await open_store(cfg, require_identity=True)
        built = assemble(store)
        svc, fed = built.service, built.federation
        receiver = Receiver(spec.agent_id, SeenCache(maxsize=cfg.a2a.seen_cache_size), fed.apply,
                            max_bytes=cfg.a2a.max_message_bytes, clock_ms=svc.clock,
                            apply_timeout_s=cfg.a2a.apply_timeout_s, apply_now=fed.apply_now)
        return cls(spec, svc, fed, receiver)

    async def close(self) -> None:
        await self.svc.close()

    @property
    def agent_id(self) -> str:
        return self.spec.agent_id

    async def receive(self, sender: str, payload: dict[str, Any]) -> Ack | None:
        """One envelope from ``sender`` (its TLS identity too) carrying ``payload``: the ACK it is answered."""
        env = new_envelope(sender, [self.agent_id], payload, now_ms(), TTL_MS)
        return (await self.receiver.receive(env.to_wire(), sender)).ack

    async def carry_from(self, other: InProcessNode) -> list[Ack | None]:
        """Receive, in order, every envelope ``other`` has queued for this node and not carried yet."""
        path = other.spec.home / "data" / "memory.db"
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            rows = conn.execute("SELECT id, envelope FROM a2a_outbox WHERE peer = ? ORDER BY id",
                                (self.agent_id,)).fetchall()
        finally:
            conn.close()
        acks = []
        for row_id, envelope in rows:
            if (other.agent_id, row_id) in self.carried:
                continue
            self.carried.add((other.agent_id, row_id))
            acks.append((await self.receiver.receive(bytes(envelope), other.agent_id)).ack)
        return acks

    async def memory_on(self, memory_id: str) -> dict[str, Any] | None:
        try:
            return await self.svc.memory_get(memory_id)
        except ServiceError as e:
            if e.code == "not_found":
                return None
            raise

    async def links_on(self) -> dict[str, dict[str, Any]]:
        return {r["link_id"]: r for r in await self.svc.links_list(limit=100)}

    async def hears_from(self, other: InProcessNode) -> None:
        """What a first pull from ``other`` tells this node: the kinds ``other`` reads (its page's ``accepts``)."""
        page = await other.fed.sync_page(self.agent_id, 0, 1)
        self.fed.note_accepts(other.agent_id, page["accepts"])

    async def sync_all(self, peer: str, *, limit: int = 500, skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Every item this node serves ``peer``, from seq 0 to the end of its change log."""
        items: list[dict[str, Any]] = []
        since = 0
        for _ in range(1000):
            page = await self.fed.sync_page(peer, since, limit, skip)
            items += page["items"]
            since = page["next"]
            if not page["more"]:
                return items
        raise AssertionError("sync did not reach the end of the change log in 1000 pages")
