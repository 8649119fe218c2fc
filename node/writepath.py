"""The checks every local write passes, in one place. The service, the knowledge graph and the transcripts
each receive this one object at construction (``node.assemble`` builds it once per store).

A write's path through it, in order: ids and fields (``check_id``, ``check_memory_fields``), the database
budget (``check_db_budget``), the pre hooks with the approval park (``fire_pre``), the permission gate
(``permit``; ``readable`` for what a read may show), the storage quota (``check_quota``); then, inside the
write's transaction, the approval claim (``claim``) and the outbox rows (``replicate``); after the commit the
hand-off to the sender and the write quorum (``after_write``) and the event sink (``publish``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

from mesh.keys import Identity
from node import attest
from node.agents.acting import acting
from node.attest import AttestLevel, InvalidationPayload, LinkPayload, MemoryPayload, TranscriptPayload
from node.config import NodeConfig
from node.errors import ServiceError
from node.events import EventSink, NoEvents
from node.hooks import ApprovalRequired, HookEvent, Hooks, NoHooks
from node.hooks.decision import AskUser
from node.limits import check_db_budget, check_memory_fields, check_text
from node.permissions import approvals as approval
from node.permissions.approvals import APPROVED, Approvals
from node.permissions.gate import Gate, refusal
from node.permissions.rules import Operation
from node.trust import Keyring
from storage.db import Database
from storage.memories import MemoryRow
from storage.outbox import OutboxRow

# The outbox rows a write enqueued (one per peer it goes to), handed to the sender after the commit.
Queued = list[OutboxRow]
# The signed records a write makes.
Payload = MemoryPayload | LinkPayload | InvalidationPayload | TranscriptPayload


class Replicator(Protocol):
    """What a write needs of federation: enqueue a change in the write's transaction, hand the rows
    enqueued to the sender after the commit, wait for a write quorum, and close."""

    def enqueue(self, conn: Any, payload: dict[str, Any], scope: Sequence[MemoryRow], ts: int) -> Queued: ...

    def enqueue_memory(self, conn: Any, row: MemoryRow, ts: int) -> Queued: ...

    def enqueue_links(self, conn: Any, items: Sequence[tuple[dict[str, Any], Sequence[MemoryRow]]],
                      ts: int) -> list[Queued]: ...

    def hand_off(self, queued: Queued) -> None: ...

    def await_quorum(self, queued: Queued, scope: Sequence[MemoryRow]) -> Awaitable[int]: ...

    def close(self) -> None: ...


class Signed(NamedTuple):
    """A record's signature by this node's key, or none (``unsigned``) when the node has no key."""

    signature: bytes | None
    attest_level: str
    signed_by: str | None


class WritePath:
    """The gate, hooks, approvals, quota and replication one store's local writes pass through."""

    def __init__(self, cfg: NodeConfig, db: Database, keyring: Keyring, *, hooks: Hooks | None = None,
                 gate: Gate | None = None, approvals: Approvals | None = None,
                 replicator: Replicator | None = None, events: EventSink | None = None) -> None:
        self.cfg = cfg
        self.db = db
        self.keyring = keyring
        # Operator hooks (docs/hooks.md) fired around each operation; NoHooks when none are wanted.
        self.hooks: Hooks = hooks if hooks is not None else NoHooks()
        # The permission gate (docs/permissions.md); None = no permissions (tests, tools).
        self.gate = gate
        # Pending actions an ``ask`` parks (docs/permissions.md); None = an ask refuses.
        self.approvals = approvals
        # Federation's outbound side; None = writes stay on this node.
        self.replicator = replicator
        # Where stored memories and made links are told (webhook subscriptions); NoEvents drops them.
        self.events: EventSink = events if events is not None else NoEvents()

    @property
    def agent_id(self) -> str:
        """Who the current call acts as: the agent it runs as (``node.agents.acting``), else this node."""
        principal = acting()
        return principal.agent_id if principal is not None else self.keyring.agent_id

    @property
    def identity(self) -> Identity | None:
        """The key the current call signs with: its agent's, else this node's."""
        principal = acting()
        return principal.identity if principal is not None else self.keyring.identity

    @property
    def node_id(self) -> str:
        """This node's own agent id, whoever the current call acts as."""
        return self.keyring.agent_id

    # ---- ids, fields and budgets ----------------------------------------------------------

    def check_id(self, name: str, value: Any) -> None:
        """``value`` is a non-empty id of at most ``limits.max_id_chars`` chars, else ServiceError bad_input."""
        check_text(name, value, self.cfg.limits.max_id_chars, allow_empty=False)

    def check_memory_fields(self, content: Any, title: Any, namespace: Any, tags: Any, priority: Any,
                            confidence: Any, source: Any) -> None:
        """A memory's fields within ``limits`` (node.limits.check_memory_fields)."""
        check_memory_fields(self.cfg.limits, content, title, namespace, tags, priority, confidence, source)

    def check_db_budget(self) -> None:
        """Refuse a write once the database is past its ``storage`` size budget."""
        check_db_budget(self.cfg, self.db.bytes_used())

    async def check_quota(self, adding_bytes: int) -> None:
        """Refuse storing ``adding_bytes`` more for this node's agent past ``permissions.max_bytes_per_agent``."""
        code = None if self.gate is None else await self.gate.quota_code(self.agent_id, adding_bytes)
        if code is not None:
            raise ServiceError(code, f"{self.agent_id} would pass its storage quota of "
                                     f"{self.cfg.permissions.max_bytes_per_agent} bytes "
                                     "(permissions.max_bytes_per_agent); the memory was not stored")

    # ---- hooks and the gate ---------------------------------------------------------------

    async def fire_pre(self, event: HookEvent, payload: dict[str, Any], operation: Operation,
                       namespace: str | Callable[[], Awaitable[str]], call: dict[str, Any]) -> dict[str, Any]:
        """A write's pre hooks; a hook's AskUser parks the call as a rule's ask does (same pending path).
        ``namespace`` may be a read, made only when a hook asks. Returns the payload the hooks left."""
        try:
            return await self.hooks.fire(event, payload)
        except ApprovalRequired as e:
            if APPROVED.get() is not None:
                return dict(e.payload)
            if self.approvals is None:
                raise
            if not isinstance(namespace, str):
                namespace = await namespace()
            raise await self.approvals.park(self.agent_id, str(operation), namespace, call, e.ask,
                                            f"hook {e.hook!r}") from None

    async def permit(self, namespace: str, operation: Operation, call: dict[str, Any] | None = None) -> None:
        """Raise ``permission_denied`` when the gate stops this node's agent; an ask parks a write (``call``)
        as a pending action (``approval_required`` with its id), or refuses a read."""
        if self.gate is None:
            return
        decision = await self.gate.admit(self.agent_id, namespace, operation)
        if isinstance(decision, AskUser):
            if APPROVED.get() is not None:
                return  # this is the approved action running: the ask has been answered
            if call is not None and self.approvals is not None:
                raise await self.approvals.park(self.agent_id, str(operation), namespace, call, decision,
                                                "a permission rule")
        stop = refusal(decision)
        if stop is not None:
            raise ServiceError(*stop)

    async def readable(self, namespaces: set[str], operation: Operation) -> set[str]:
        """Those of ``namespaces`` the gate lets this node's agent ``operation`` in (an ask counts as no):
        a read leaves the others' results out, a proposal skips them."""
        if self.gate is None:
            return namespaces
        return {ns for ns in sorted(namespaces)
                if refusal(await self.gate.admit(self.agent_id, ns, operation)) is None}

    # ---- signing and sharing --------------------------------------------------------------

    def sign(self, payload: Payload) -> Signed:
        """``payload`` signed by this node's key (self_signed), or unsigned when the node has no key."""
        if self.identity is None:
            return Signed(None, str(AttestLevel.UNSIGNED), None)
        return Signed(attest.sign(self.identity.private_key, payload), str(AttestLevel.SELF_SIGNED), self.agent_id)

    def share_with(self, namespace: str) -> tuple[str, ...] | None:
        """The namespace's peer list (with this node, and the origin when it is one of its agents: the origin is
        always a member) when it is restricted, sorted and distinct as signed set 2 signs it; travels with its
        memories, inside their signatures."""
        policy = self.cfg.federation.namespaces.get(namespace)
        return None if policy is None else tuple(sorted({*policy.peers, self.node_id, self.agent_id}))

    # ---- in the write's transaction -------------------------------------------------------

    def claim(self, conn: Any, approved: approval.Approved | None, ts: int) -> None:
        """In an approved action's write transaction: mark it applied, or refuse (decided or expired)."""
        if approved is not None:
            approval.claim(conn, approved, ts, self.agent_id, approval.signer(self.identity))

    def replicate(self, conn: Any, kind: str, body: dict[str, Any], scope: Sequence[MemoryRow], ts: int) -> Queued:
        """Enqueue the change for the peers that may see every memory in ``scope`` (same transaction);
        returns the outbox rows, one per peer."""
        if self.replicator is None:
            return []
        return self.replicator.enqueue(conn, {"kind": kind, **body}, scope, ts)

    def replicate_memory(self, conn: Any, row: MemoryRow, ts: int) -> Queued:
        """Enqueue memory version ``row`` for the peers that may see it, each in the form it reads (same
        transaction); returns the outbox rows."""
        if self.replicator is None:
            return []
        return self.replicator.enqueue_memory(conn, row, ts)

    def replicate_links(self, conn: Any, items: Sequence[tuple[dict[str, Any], Sequence[MemoryRow]]],
                        ts: int) -> list[Queued]:
        """Enqueue many links' ``link.put`` bodies together (one envelope per peer where it reads them);
        returns, per item, the rows that carry it."""
        if self.replicator is None:
            return [[] for _ in items]
        return self.replicator.enqueue_links(conn, items, ts)

    # ---- after the commit -----------------------------------------------------------------

    def hand_off(self, queued: Queued) -> bool:
        """Wake the sender for ``queued``; False when nothing was queued or this store does not replicate."""
        if not queued or self.replicator is None:
            return False
        self.replicator.hand_off(queued)
        return True

    @property
    def waits_for_quorum(self) -> bool:
        """Whether a write waits for ``federation.write_quorum`` nodes after its commit."""
        return self.cfg.federation.write_quorum != 1

    async def quorum(self, queued: Queued, scope: Sequence[MemoryRow]) -> int:
        """Wait for the write quorum of ``queued``; returns how many nodes hold the write (ServiceError
        ``quorum_not_reached`` when too few do within ``federation.quorum_timeout_s``)."""
        if self.replicator is None:
            return 1
        return await self.replicator.await_quorum(queued, scope)

    async def after_write(self, queued: Queued, scope: Sequence[MemoryRow]) -> dict[str, Any]:
        """Wake the sender; with a write quorum above 1, wait for it. Returns fields for the result:
        ``replicating_to`` (one peer per row queued) and ``acked_nodes``."""
        if not self.hand_off(queued):
            return {}
        result: dict[str, Any] = {"replicating_to": sorted(q.peer for q in queued)}
        if self.waits_for_quorum:
            result["acked_nodes"] = await self.quorum(queued, scope)
        return result

    async def publish(self, event: str, data: dict[str, Any]) -> None:
        """Tell the event sink (webhook subscribers) of a committed write."""
        await self.events.publish(event, data)
