"""What every inbound payload kind uses: the ``Applied`` answer, the collaborators an apply needs
(``ApplyContext``), the permission gate's checks as a peer's write meets them, and the wait for memories still
in flight (``Arrivals``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from a2a import ProtocolError
from node import attest
from node.config import NodeConfig
from node.events import EventSink
from node.federation.codes import RejectCode
from node.federation.policy import Policy
from node.federation.verify import Attester
from node.hooks import Hooks
from node.permissions.gate import Gate, refusal
from node.permissions.rules import Operation
from storage import memories
from storage.db import Database

Clock = Callable[[], int]
P = TypeVar("P")

# A held inbound link or transcript looks again for its memories at least this often (seconds), besides being
# woken by each memory applied.
ORPHAN_RECHECK_S = 0.1


@dataclass(frozen=True, slots=True)
class Applied:
    """How an inbound change went: ``code`` None is accepted (ACK ok), else the reject code;
    ``changed`` is True only when something was stored (not for duplicates, stale or hidden versions)."""

    code: str | None
    changed: bool = False

    def __post_init__(self) -> None:
        # A RejectCode is kept as its plain string: storage drivers write an enum member by its name.
        if self.code is not None and type(self.code) is not str:
            object.__setattr__(self, "code", str(self.code))


OK_UNCHANGED = Applied(None)
OK_CHANGED = Applied(None, True)


def parsed(parse: Callable[[Mapping[str, Any]], P], data: Any) -> P:
    """A payload's signed part parsed by ``parse`` (a ``from_mapping``); ProtocolError ``bad_payload`` when it
    does not parse."""
    try:
        return parse(data)
    except attest.AttestError as e:
        raise ProtocolError(RejectCode.BAD_PAYLOAD.value, e.message) from None


class GateChecks:
    """The permission gate's answer to a peer's write, as it would answer a local one (None: no gate)."""

    def __init__(self, gate: Gate | None) -> None:
        self.gate = gate

    @property
    def active(self) -> bool:
        """There is a gate to ask (a node built without permissions has none)."""
        return self.gate is not None

    async def code(self, sender: str, namespace: str, operation: Operation, agent: str | None = None) -> str | None:
        """The reject code when the gate stops ``sender``'s ``operation`` in ``namespace``; for an item an
        ``agent`` signed, the agent is asked too (either one's refusal refuses it)."""
        if self.gate is None:
            return None
        for who in (sender,) if agent is None or agent == sender else (sender, agent):
            stop = refusal(await self.gate.admit(who, namespace, operation))
            if stop is not None:
                return stop[0]
        return None

    async def link_code(self, sender: str, namespaces: set[str], agent: str | None = None) -> str | None:
        """The gate's answer to ``sender`` (and the ``agent`` that signed it) linking memories in ``namespaces``
        (each asked, in order)."""
        if self.gate is not None:
            for ns in sorted(namespaces):
                code = await self.code(sender, ns, Operation.LINK, agent)
                if code is not None:
                    return code
        return None

    async def quota_code(self, writer: str, nbytes: int) -> str | None:
        """A new memory of ``nbytes`` past its writer's storage quota is refused, as a local one is."""
        if self.gate is None:
            return None
        return await self.gate.quota_code(writer, nbytes)


class Arrivals:
    """Wakes the inbound changes waiting for a memory (a link or transcript that arrived before the memories it
    cites) when one is applied; each waits at most ``hold_s`` seconds (``federation.orphan_hold_s``)."""

    def __init__(self, db: Database, policy: Policy, hold_s: float) -> None:
        self.db = db
        self.policy = policy
        self.hold_s = hold_s
        self._arrived = asyncio.Condition()

    async def memory_stored(self) -> None:
        async with self._arrived:
            self._arrived.notify_all()

    async def visible(self, sender: str, ids: set[str]) -> bool:
        """True once every id is stored and ``sender`` may see it; waits up to ``hold_s`` for a memory.put still
        in flight. A memory the sender may not see answers exactly as a missing one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_s
        while True:
            found = await self.db.read(memories.reach_many, ids)
            # A memory the sender may not see counts as missing, also in time: it waits the same hold.
            if self.policy.all_visible(sender, ids, found):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            # Woken by each applied memory; the short cap also covers a wake-up missed between check and wait.
            try:
                async with self._arrived:
                    await asyncio.wait_for(self._arrived.wait(), min(remaining, ORPHAN_RECHECK_S))
            except TimeoutError:
                pass


@dataclass(frozen=True, slots=True)
class ApplyContext:
    """The collaborators every payload kind's apply shares (one set per node): the configuration, the store,
    the clock (unix ms), who sees what, signature checks, the gate, operator hooks (pre/post_federated_*,
    docs/hooks.md), the event sink (stored memories and links reach subscribers as local ones do), the counters
    and the wait for memories in flight."""

    cfg: NodeConfig
    db: Database
    clock: Clock
    policy: Policy
    attester: Attester
    gate: GateChecks
    hooks: Hooks
    events: EventSink
    counters: Counter[str]
    arrivals: Arrivals
