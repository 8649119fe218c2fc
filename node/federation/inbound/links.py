"""link.put and links.put: verify and store received links, only where the sender may see both their ends.

A run of links goes through its stages together, with no task per link: parse and bounds, one lookup read, one
verify hop, the pre_federated_link hooks and the checks of the ends, one write, then post hooks and the event
sink. Each stage lets the loop turn every APPLY_SLICE links, so a ping's read never waits behind a whole
envelope's links. A link.put is a run of one whose read, verify and write share their hops with the other
link.put envelopes of the same loop turn (a batch frame's); a links.put's links are one run.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from a2a import ProtocolError
from a2a.envelope import RETRYABLE_REJECT_CODES
from node.agents.book import DelegationState
from node.attest import AttestLevel, LinkPayload
from node.errors import ServiceError
from node.federation.codes import RejectCode
from node.federation.inbound.common import OK_CHANGED, OK_UNCHANGED, Applied, ApplyContext, parsed
from node.federation.verify import Keys, TurnBatch, VerifyItem
from node.hooks import HookError, HookEvent
from node.limits import check_confidence, check_text
from node.wire import link_dict
from storage import changelog, events, links, memories
from storage.links import LinkRow
from storage.memories import Reach

log = logging.getLogger("node.federation")

I = TypeVar("I")  # noqa: E741 - an item of a run
R = TypeVar("R")

# A links.put's links taken through each stage of their apply between two turns of the loop (a ping's read
# waits behind at most this many links' parsing, checks or hooks, not a whole envelope's).
APPLY_SLICE = 16

# Each link's answer in a run: an Applied, a ProtocolError when it is malformed, or what a hook or the event
# sink raised (the caller raises it: no ACK).
Answer = Applied | BaseException


@dataclass(frozen=True, slots=True)
class LinkLookup:
    """What an inbound link needs read first: is it stored already, and its ends as stored here."""

    stored: bool
    ends: dict[str, Reach]


@dataclass(slots=True)
class InboundLink:
    """One received link on its way through the apply stages."""

    body: dict[str, Any]  # the link.put body: link, signature, signed_by
    payload: LinkPayload
    link_id: str
    ids: frozenset[str]  # its two ends
    now: int  # when it was taken in (unix ms): its bounds' clock and its row's created_at
    ends: dict[str, Reach] = field(default_factory=dict)  # as read with its lookup (or after its hold)
    level: AttestLevel = AttestLevel.UNSIGNED
    hook_payload: dict[str, Any] = field(default_factory=dict)
    # The delegation it names when an agent signed it, as stored here (None: not here, or a node's link).
    delegation: DelegationState | None = None

    @property
    def delegation_id(self) -> str | None:
        named: str | None = self.body.get("delegation")
        return named

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
        attested = self.level is not AttestLevel.UNSIGNED  # verified here
        # confidence is outside the signature: taken only from the link's own observer, never from a relay.
        confidence = self.body["link"].get("confidence") if sender == self.payload.observed_by else None
        return LinkRow(link_id=self.link_id, **self.payload.to_dict(),
                       confidence=None if confidence is None else float(confidence),
                       signature=signature if attested else None, attest_level=str(self.level),
                       signed_by=signed_by if attested else None, received_from=sender, created_at=self.now)


@dataclass(frozen=True, slots=True)
class LinkHops:
    """How a run of inbound links reaches the reader, the verify thread and the writer: a links.put's links
    directly, one hop each for the run; a link.put through the loop turn's TurnBatch (one hop shared with the
    turn's other envelopes)."""

    lookup: Callable[[list[tuple[str, frozenset[str]]]], Awaitable[list[LinkLookup]]]
    verify: Callable[[list[VerifyItem]], Awaitable[list[bool]]]
    write: Callable[[list[tuple[LinkRow, str]]], Awaitable[list[bool]]]


# The links of a run between two stages, each with its position in the run.
Indexed = list[tuple[int, InboundLink]]


async def sliced(items: Iterable[I]) -> AsyncIterator[I]:
    """``items``, letting the loop turn after every APPLY_SLICE of them."""
    for n, item in enumerate(items):
        if n and not n % APPLY_SLICE:
            await asyncio.sleep(0)
        yield item


async def each(call: Callable[[I], Awaitable[R]], items: Sequence[I], *, together: bool) -> list[R | BaseException]:
    """``call`` on each item, each outcome (its result or its exception) in order: one after another, the loop
    turning every APPLY_SLICE items, or all at once (one task each) when ``together`` (e.g. each may wait on a
    hook program)."""
    if together:
        return await asyncio.gather(*(call(item) for item in items), return_exceptions=True)
    out: list[R | BaseException] = []
    async for item in sliced(items):
        try:
            out.append(await call(item))
        except Exception as e:  # noqa: BLE001 - the item's outcome, as gather's return_exceptions gives it
            out.append(e)
    return out


def one_at_a_time(call: Callable[[I], Awaitable[R]]) -> Callable[[list[I]], Awaitable[list[R]]]:
    """A list hop made of a single-item one (a TurnBatch's call)."""
    async def run(items: list[I]) -> list[R]:
        return [await call(item) for item in items]
    return run


class LinkApply:
    """Applies link.put (``one``) and links.put (``many``) bodies from peers."""

    def __init__(self, ctx: ApplyContext) -> None:
        self.ctx = ctx
        verifier = ctx.attester.verifier
        # The inbound links of one loop turn (a batch frame's) share one read and one write.
        self.lookups: TurnBatch[tuple[str, frozenset[str]], LinkLookup] = TurnBatch(self._lookup)
        self.writes: TurnBatch[tuple[LinkRow, str], bool] = TurnBatch(self._write)
        self.turn_hops = LinkHops(one_at_a_time(self.lookups), one_at_a_time(verifier.verify),
                                  one_at_a_time(self.writes))
        self.run_hops = LinkHops(self._lookup, verifier.verify_many, self._write)

    async def one(self, body: dict[str, Any], sender: str, pulled: bool = False) -> Applied:
        """Verify and store one received link; stored only where the sender may see both its ends."""
        [answer] = await self.run([body], sender, self.turn_hops, pulled=pulled)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def many(self, body: dict[str, Any], sender: str, pulled: bool = False) -> Applied:
        """Each link of a links.put applied on its own, exactly as a link.put of its own (its signature verified
        alone; the links share one lookup read, one verify hop and one write). A rejected link does not stop the
        others, and each rejection is counted. The one ACK: accepted when every link is stored (or was); else a
        retryable code when any link may be retried (the sender resends the envelope; the stored links come
        back as duplicates), else the first link's permanent code (the sender then resends the links one per
        envelope, so that each gets its own answer and only the refused ones are dead-lettered)."""
        counters = self.ctx.counters
        counters["links.put"] += 1
        answers = await self.run(body["links"], sender, self.run_hops, pulled=pulled)
        codes: list[str] = []
        changed = False
        for answer in answers:
            if isinstance(answer, ProtocolError):
                answer = Applied(answer.code)
            elif isinstance(answer, BaseException):
                raise answer  # storage trouble: no ACK, the sender retries the envelope
            changed = changed or answer.changed
            if answer.code is not None:
                counters[f"rejected:{answer.code}"] += 1
                codes.append(answer.code)
        code = next((c for c in codes if c in RETRYABLE_REJECT_CODES), codes[0] if codes else None)
        return Applied(code, changed)

    async def run(self, bodies: Sequence[dict[str, Any]], sender: str, hops: LinkHops, *,
                  pulled: bool = False) -> list[Answer]:
        """Apply received links (link.put bodies) as one run of stages (``pulled``: from a sync page); each link's
        answer in order. A failed
        read or write is raised at once. A link whose ends are missing or hidden waits for them
        (``Arrivals.visible``) in a task of its own, without holding up the others."""
        answers: list[Answer | None] = [None] * len(bodies)
        parsed_links: Indexed = []
        async for i, body in sliced(enumerate(bodies)):
            try:
                got = self._inbound(body)
            except ProtocolError as e:
                answers[i] = e
                continue
            if isinstance(got, Applied):
                answers[i] = got
            else:
                parsed_links.append((i, got))
        held: list[tuple[int, asyncio.Task[Applied]]] = []
        try:
            await self._stages(parsed_links, sender, hops, answers, held, pulled)
        except BaseException:
            for _, task in held:
                task.cancel()
            await asyncio.gather(*(task for _, task in held), return_exceptions=True)
            raise
        for (i, _), result in zip(held, await asyncio.gather(*(task for _, task in held), return_exceptions=True),
                                  strict=True):
            answers[i] = result
        return [a if a is not None else OK_UNCHANGED for a in answers]

    async def _stages(self, parsed_links: Indexed, sender: str, hops: LinkHops, answers: list[Answer | None],
                      held: list[tuple[int, asyncio.Task[Applied]]], pulled: bool) -> None:
        """``run``'s stages after parsing: fills ``answers`` and ``held`` (the links waiting for their ends,
        each in its own task)."""
        checked = await self._looked_up(parsed_links, sender, hops, answers, pulled)
        attested = await self._attested(checked, sender, hops, answers, pulled)
        fired = await each(lambda ix: self.ctx.hooks.fire(HookEvent.PRE_FEDERATED_LINK, ix[1].hook_payload),
                           attested, together=self.ctx.hooks.attached(HookEvent.PRE_FEDERATED_LINK))
        ready: Indexed = []
        async for (i, x), hook in sliced(zip(attested, fired, strict=True)):
            if isinstance(hook, BaseException):  # a hook refusal is permanent and carries the hook's code
                answers[i] = Applied(hook.code) if isinstance(hook, HookError) else hook
            elif not self.ctx.policy.all_visible(sender, set(x.ids), x.ends):
                held.append((i, asyncio.get_running_loop().create_task(self._held(x, sender))))
            elif (refused := await self._gate_code(sender, x)) is not None:
                answers[i] = Applied(refused)
            else:
                ready.append((i, x))
        writes = [(x, x.row(sender)) for _, x in ready]
        stored = await hops.write([(row, str(x.level)) for x, row in writes]) if writes else []
        done = await each(lambda item: self._stored(*item[0], item[1]), list(zip(writes, stored, strict=True)),
                          together=self.ctx.hooks.attached(HookEvent.POST_FEDERATED_LINK))
        for (i, _), answer in zip(ready, done, strict=True):
            answers[i] = answer

    async def _looked_up(self, parsed_links: Indexed, sender: str, hops: LinkHops,
                         answers: list[Answer | None], pulled: bool) -> list[tuple[int, InboundLink, Keys, bool]]:
        """One lookup read for the run: duplicates and signer mismatches answered; the others with their signer's
        keys (and whether those were read just now); an agent's with its delegation's key (one read for the run's
        delegations; a live link waits for one still in flight)."""
        looks = await hops.lookup([(x.link_id, x.ids) for _, x in parsed_links]) if parsed_links else []
        checked: list[tuple[int, InboundLink, Keys, bool]] = []
        attester = self.ctx.attester
        named = {x.delegation_id for _, x in parsed_links if x.delegation_id is not None}
        states = await attester.agents.states(named) if named else {}
        async for (i, x), look in sliced(zip(parsed_links, looks, strict=True)):
            x.ends = look.ends
            code = self._not_new(x, look.stored, sender)
            if code is not None:
                answers[i] = code
            elif x.delegation_id is not None:  # an agent's link: the key its delegation names
                if x.delegation_id not in states and not pulled:
                    found = await attester.delegation_state(x.delegation_id, pulled=False)
                    if found is not None:
                        states[x.delegation_id] = found
                x.delegation = states.get(x.delegation_id)
                key = attester.agent_key(x.delegation, x.payload.observed_by)
                checked.append((i, x, () if key is None else (key,), True))
            else:
                checked.append((i, x, *attester.keys.of(x.payload.observed_by)))
        return checked

    async def _attested(self, checked: list[tuple[int, InboundLink, Keys, bool]], sender: str, hops: LinkHops,
                        answers: list[Answer | None], pulled: bool) -> Indexed:
        """One verify hop for the run's signatures, then each link's attest level (or its rejection)."""
        # A check for each link that carries a signature and whose signer has keys here (None: nothing to check).
        items = [(keys, x.payload, x.signature) if x.signature is not None and keys else None
                 for _, x, keys, _ in checked]
        asked: list[VerifyItem] = [item for item in items if item is not None]
        verdicts = iter(await hops.verify(asked) if asked else [])
        attested: Indexed = []
        async for (i, x, keys, fresh), item in sliced(zip(checked, items, strict=True)):
            verified = item is not None and next(verdicts)
            if x.delegation_id is not None:
                level = await self.ctx.attester.agent_level(verified, x.delegation, x.payload,
                                                            x.payload.observed_by, sender, what=x.link_id)
            else:
                level = await self.ctx.attester.level(verified, keys, fresh, x.payload, x.signature,
                                                      x.payload.observed_by, sender, what=x.link_id, pulled=pulled)
            if isinstance(level, AttestLevel):
                x.attested(level, sender)
                attested.append((i, x))
            else:
                answers[i] = Applied(level)
        return attested

    def _inbound(self, body: dict[str, Any]) -> InboundLink | Applied:
        """A received link parsed (ProtocolError when malformed) and bounded as a local one is, or its rejection."""
        payload = parsed(LinkPayload.from_mapping, body["link"])
        now = self.ctx.clock()
        code = self._out_of_bounds(payload, body["link"].get("confidence"), now)
        if code is not None:
            return Applied(code)
        return InboundLink(body, payload, payload.link_id, frozenset({payload.src_id, payload.dst_id}), now)

    def _not_new(self, x: InboundLink, stored: bool, sender: str) -> Applied | None:
        """Once looked up: the answer of a link stored already (a duplicate) or signed by another than its
        observer; None for one to verify."""
        if stored:
            self.ctx.counters["link:duplicate"] += 1
            return OK_UNCHANGED
        signed_by = x.body["signed_by"]
        if signed_by is not None and signed_by != x.payload.observed_by:
            log.warning("signer_mismatch", extra={"ev": {"peer": sender, "link_id": x.link_id, "signed_by": signed_by,
                                                         "observed_by": x.payload.observed_by}})
            return Applied(RejectCode.SIGNER_MISMATCH)
        return None

    async def _held(self, x: InboundLink, sender: str) -> Applied:
        """The rest of a link whose ends were missing or hidden at its lookup: held until they are here for the
        sender (``unknown_memory`` after ``orphan_hold_s``), then checked and written as any other."""
        ids = set(x.ids)
        if not await self.ctx.arrivals.visible(sender, ids):
            return Applied(RejectCode.UNKNOWN_MEMORY)
        x.ends = await self.ctx.db.read(memories.reach_many, ids)
        code = await self._gate_code(sender, x)
        if code is not None:
            return Applied(code)
        row = x.row(sender)
        return await self._stored(x, row, await self.writes((row, str(x.level))))

    async def _gate_code(self, sender: str, x: InboundLink) -> str | None:
        agent = x.payload.observed_by if x.delegation_id is not None else None
        return await self.ctx.gate.link_code(sender, {m.namespace for m in x.ends.values()}, agent)

    async def _stored(self, x: InboundLink, row: LinkRow, stored: bool) -> Applied:
        """After the write: the counters, the post_federated_link hooks and the event sink (``stored`` False for
        a link stored meanwhile)."""
        ctx = self.ctx
        ctx.counters[f"link:{x.level}" if stored else "link:duplicate"] += 1
        await ctx.hooks.fire(HookEvent.POST_FEDERATED_LINK, {**x.hook_payload, "stored": stored})
        if stored:
            await ctx.events.publish("link.attested", link_dict(row))
        return OK_CHANGED if stored else OK_UNCHANGED

    async def _lookup(self, asked: list[tuple[str, frozenset[str]]]) -> list[LinkLookup]:
        """One read for the links of a turn: which are stored, and their ends."""
        def read(conn: Any) -> list[LinkLookup]:
            ends = memories.reach_many(conn, set().union(*(ids for _, ids in asked)))
            here = links.stored_ids(conn, [link_id for link_id, _ in asked])
            return [LinkLookup(link_id in here, {i: ends[i] for i in ids if i in ends}) for link_id, ids in asked]
        found: list[LinkLookup] = await self.ctx.db.read(read)
        return found

    async def _write(self, rows: list[tuple[LinkRow, str]]) -> list[bool]:
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
            changelog.append_many(conn, "link", [(row.link_id, 1, row.created_at) for row in fresh],
                                  [row.observed_by for row in fresh])
            for level, n in sorted(applied.items()):
                changelog.incr(conn, f"applied:link.{level}", n)
            return stored
        written: list[bool] = await self.ctx.db.write(write)
        return written

    def _out_of_bounds(self, payload: LinkPayload, confidence: Any, now: int) -> str | None:
        cfg = self.ctx.cfg
        lim = cfg.limits
        try:
            for name in ("src_id", "dst_id", "observed_by"):
                check_text(name, getattr(payload, name), lim.max_id_chars, allow_empty=False)
            check_text("relation", payload.relation, lim.max_relation_chars, allow_empty=False)
            if confidence is not None:
                check_confidence(confidence)
        except ServiceError as e:
            return e.code
        if payload.valid_from > now + int(cfg.federation.max_clock_skew_s * 1000):
            return RejectCode.CLOCK_SKEW
        if payload.valid_until is not None and payload.valid_until < now:
            return RejectCode.EXPIRED_LINK
        return None
