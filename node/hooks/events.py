"""Hook events: their names, classes (which carry the deadline), phase, and payload schema.

One table (``SPECS``) holds every fact about an event; docs/hooks.md renders the same table for people.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class EventClass(StrEnum):
    """Deadline classes: every hook chain fired for an event of the class must end within the deadline."""

    WRITE = "write"
    READ = "read"
    INDEX = "index"
    TRANSCRIPT = "transcript"

    @property
    def deadline_ms(self) -> int:
        return _CLASS_DEADLINE_MS[self]


_CLASS_DEADLINE_MS = {EventClass.WRITE: 5000, EventClass.READ: 2000, EventClass.INDEX: 1000,
                      EventClass.TRANSCRIPT: 5000}


class Phase(StrEnum):
    PRE = "pre"      # before the operation: may Allow, Modify, Deny or AskUser
    POST = "post"    # after it: a Modify is rejected; a Deny counts only where ``refusable``
    ON = "on"        # a notification: the decision is recorded, never acted upon


class HookEvent(StrEnum):
    PRE_STORE = "pre_store"
    POST_STORE = "post_store"
    PRE_UPDATE = "pre_update"
    POST_UPDATE = "post_update"
    PRE_LINK = "pre_link"
    POST_LINK = "post_link"
    PRE_RECALL = "pre_recall"
    POST_RECALL = "post_recall"
    PRE_VERIFY = "pre_verify"
    POST_VERIFY = "post_verify"
    PRE_FEDERATED_MEMORY = "pre_federated_memory"
    POST_FEDERATED_MEMORY = "post_federated_memory"
    PRE_FEDERATED_LINK = "pre_federated_link"
    POST_FEDERATED_LINK = "post_federated_link"
    PRE_TRANSCRIPT_STORE = "pre_transcript_store"
    POST_TRANSCRIPT_STORE = "post_transcript_store"
    ON_INDEX_EVICTION = "on_index_eviction"
    ON_APPROVAL_REQUESTED = "on_approval_requested"
    ON_APPROVAL_DECIDED = "on_approval_decided"


class FieldKind(StrEnum):
    """What a Modify may put in a field; the service still applies its own limits afterwards."""

    TEXT = "text"                  # a string
    TEXT_OR_NULL = "text_or_null"  # a string, or null for "leave unchanged"
    TAGS = "tags"                  # a list of strings (null allowed on pre_update)
    INT = "int"                    # an integer (null allowed on pre_update)
    NUMBER = "number"              # an int or float (null allowed where the field is optional)
    LINKS = "links"                # pre_store only: related memories to link in the same transaction
    MEMORIES = "memories"          # pre_transcript_store only: memories to store, each citing a span


@dataclass(frozen=True)
class EventSpec:
    event: HookEvent
    event_class: EventClass
    phase: Phase
    # Payload fields and what each holds (rendered in docs/hooks.md; tests check fired payloads against it).
    payload: Mapping[str, str]
    # Fields a Modify may set, and their kind; empty = Modify is not allowed.
    modifiable: Mapping[str, FieldKind]
    # Whether a Deny or AskUser stops the operation (pre events; post events whose result leaves the node).
    refusable: bool

    @property
    def deadline_ms(self) -> int:
        return self.event_class.deadline_ms


def _f(**kinds: FieldKind) -> Mapping[str, FieldKind]:
    return MappingProxyType(kinds)


def _p(**fields: str) -> Mapping[str, str]:
    return MappingProxyType(fields)


_MEMORY = "the memory as memory_get returns it"
_STORE_FIELDS = dict(id="the id minted for the new memory (UUIDv4)", content="memory text", title="title",
                     namespace="namespace", tags="list of tags", priority="1..10", confidence="0..1",
                     source="where it came from", agent_id="this node's agent id")
_UPDATE_FIELDS = dict(id="the memory's id", current=_MEMORY + ", before the update",
                      content="new text or null", title="new title or null", tags="new tags or null",
                      priority="new priority or null", confidence="new confidence or null",
                      source="new source or null")
_LINK_FIELDS = dict(src_id="source memory id", dst_id="destination memory id", relation="relation",
                    valid_until="end of validity, unix ms, or null", confidence="0..1 or null")
_RECALL_FIELDS = dict(query="search text", limit="max results", namespace="namespace or null")

SPECS: Mapping[HookEvent, EventSpec] = MappingProxyType({s.event: s for s in (
    EventSpec(HookEvent.PRE_STORE, EventClass.WRITE, Phase.PRE, _p(**_STORE_FIELDS),
              _f(content=FieldKind.TEXT, title=FieldKind.TEXT, namespace=FieldKind.TEXT, tags=FieldKind.TAGS,
                 priority=FieldKind.INT, confidence=FieldKind.NUMBER, source=FieldKind.TEXT,
                 links=FieldKind.LINKS), True),
    EventSpec(HookEvent.POST_STORE, EventClass.WRITE, Phase.POST, _p(memory=_MEMORY + ", as committed"),
              _f(), False),
    EventSpec(HookEvent.PRE_UPDATE, EventClass.WRITE, Phase.PRE, _p(**_UPDATE_FIELDS),
              _f(content=FieldKind.TEXT_OR_NULL, title=FieldKind.TEXT_OR_NULL, tags=FieldKind.TAGS,
                 priority=FieldKind.INT, confidence=FieldKind.NUMBER, source=FieldKind.TEXT_OR_NULL), True),
    EventSpec(HookEvent.POST_UPDATE, EventClass.WRITE, Phase.POST, _p(memory=_MEMORY + ", new version"),
              _f(), False),
    EventSpec(HookEvent.PRE_LINK, EventClass.WRITE, Phase.PRE, _p(**_LINK_FIELDS),
              _f(relation=FieldKind.TEXT, valid_until=FieldKind.INT, confidence=FieldKind.NUMBER), True),
    EventSpec(HookEvent.POST_LINK, EventClass.WRITE, Phase.POST,
              _p(link="the link as memory_link returns it"), _f(), False),
    EventSpec(HookEvent.PRE_RECALL, EventClass.READ, Phase.PRE, _p(**_RECALL_FIELDS),
              _f(query=FieldKind.TEXT, limit=FieldKind.INT, namespace=FieldKind.TEXT_OR_NULL), True),
    EventSpec(HookEvent.POST_RECALL, EventClass.READ, Phase.POST,
              _p(**_RECALL_FIELDS, results="the hits, best first, each a memory with its score"), _f(), True),
    EventSpec(HookEvent.PRE_VERIFY, EventClass.READ, Phase.PRE, _p(id="the link id or memory id to verify"),
              _f(), True),
    EventSpec(HookEvent.POST_VERIFY, EventClass.READ, Phase.POST,
              _p(id="the link id or memory id", result="what memory_verify returns"), _f(), True),
    EventSpec(HookEvent.PRE_FEDERATED_MEMORY, EventClass.WRITE, Phase.PRE,
              _p(sender="the peer's agent id", memory="the memory version as the peer sent it"), _f(), True),
    EventSpec(HookEvent.POST_FEDERATED_MEMORY, EventClass.WRITE, Phase.POST,
              _p(sender="the peer's agent id", memory="the memory version as the peer sent it",
                 stored="false when it changed nothing (already here, or older than the stored version)"),
              _f(), False),
    EventSpec(HookEvent.PRE_FEDERATED_LINK, EventClass.WRITE, Phase.PRE,
              _p(sender="the peer's agent id", link="the six signed fields and confidence",
                 signed_by="signer agent id or null", attest_level="unsigned or peer_attested (signature checked)"),
              _f(), True),
    EventSpec(HookEvent.POST_FEDERATED_LINK, EventClass.WRITE, Phase.POST,
              _p(sender="the peer's agent id", link="the six signed fields and confidence",
                 signed_by="signer agent id or null", attest_level="unsigned or peer_attested",
                 stored="false when the link was already here"), _f(), False),
    EventSpec(HookEvent.PRE_TRANSCRIPT_STORE, EventClass.TRANSCRIPT, Phase.PRE,
              _p(session_id="transcript session", content="transcript text", agent_id="writer"),
              _f(content=FieldKind.TEXT, memories=FieldKind.MEMORIES), True),
    EventSpec(HookEvent.POST_TRANSCRIPT_STORE, EventClass.TRANSCRIPT, Phase.POST,
              _p(session_id="transcript session", transcript_id="stored id"), _f(), False),
    EventSpec(HookEvent.ON_INDEX_EVICTION, EventClass.INDEX, Phase.ON,
              _p(index="seen_cache", key="the evicted correlation id", expires_at="its expiry, unix ms",
                 size="entries left", maxsize="the bound"), _f(), False),
    EventSpec(HookEvent.ON_APPROVAL_REQUESTED, EventClass.WRITE, Phase.ON,
              _p(approval_id="pending action id", event="the event that asked", prompt="question",
                 options="choices", default="choice taken on expiry", payload="the parked operation"),
              _f(), False),
    EventSpec(HookEvent.ON_APPROVAL_DECIDED, EventClass.WRITE, Phase.ON,
              _p(approval_id="pending action id", event="the event that asked", choice="what was decided",
                 decided_by="who decided"), _f(), False),
)})

# Read events are the hot path: a daemon answers in well under a millisecond, a spawn costs tens.
READ_CLASSES = frozenset({EventClass.READ, EventClass.INDEX})
