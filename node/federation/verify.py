"""Signature checks for inbound changes, off the event loop, and the attest level they earn.

Ed25519 verify holds the GIL for each ~70 us call, but the loop gets the GIL back between calls, so checks run
in batches on one worker thread (``VerifyBatcher``): a burst never stalls the loop for a whole batch. A
signer's keys come from the keyring, re-read at most every KEYRING_RECHECK_S unless a check fails
(``SignerKeys``); ``Attester`` turns a check's outcome into the level a change is stored at, or its rejection,
as ``decide`` (pure) says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from node import attest, priority
from node.agents.book import AgentBook, DelegationState
from node.attest import (
    AttestLevel,
    Signable,
    claimed_at,
)
from node.federation.codes import RejectCode
from node.trust import UNKNOWN_SIGNER, Keyring, SignerHistory
from storage import changelog
from storage.db import Database

log = logging.getLogger("node.federation")

I = TypeVar("I")  # noqa: E741 - a batched call's item
R = TypeVar("R")

# A signature to check: the signer's keys, the signed payload, the signature.
VerifyItem = tuple[tuple[Ed25519PublicKey, ...], Signable, bytes | None]
Keys = tuple[Ed25519PublicKey, ...]

# Most signatures verified in one hop to the thread pool.
VERIFY_BATCH_MAX = 256
# An inbound signature is checked against the keyring as last read when it was read less than this long ago
# (as the WebSocket membership check: a removed .pub stops verifying within a second); an unknown signer or a
# signature that does not verify always reads the key directories again first.
KEYRING_RECHECK_S = 1.0


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


def verify_thread(nice: int) -> ThreadPoolExecutor:
    """The one verifier thread, ``nice`` steps below the event loop (``federation.background_nice``): verification
    is GIL-bound, so more threads would add switching, not throughput."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify", initializer=priority.lower_this_thread,
                              initargs=(nice,))


class VerifyBatcher:
    """Runs signature checks as batches on ``executor`` (owned from here on: ``close`` shuts it): those made in
    one loop turn together (``verify``), or a run's list in one hop (``verify_many``)."""

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

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class SignerKeys:
    """A signer's keys from the keyring, read again from disk at most every ``recheck_s`` seconds (a stat of the
    key directories per inbound signature was ~4% of a receiving node's CPU), and always before a signer is
    taken to be unknown."""

    def __init__(self, keyring: Keyring, recheck_s: float = KEYRING_RECHECK_S) -> None:
        self.keyring = keyring
        self.recheck_s = recheck_s
        self._read_at = float("-inf")

    def of(self, signer: str) -> tuple[Keys, bool]:
        """``signer``'s keys, and True when the keyring was read just now (a failed check then looks no
        further)."""
        fresh = self._due()
        keys = self.keyring.keys_for(signer, reload=fresh)
        if not keys and not fresh:
            keys, fresh = self.keyring.keys_for(signer), True
        return keys, fresh

    def rotated(self, signer: str) -> Keys | None:
        """``signer``'s keys read again now, or None when the keyring did not change since its last read."""
        generation = self.keyring.generation
        again = self.keyring.keys_for(signer)
        return again if self.keyring.generation != generation and again else None

    def _due(self) -> bool:
        """True (and the clock restarts) when the keyring was last read ``recheck_s`` ago or more."""
        now = time.monotonic()
        if now - self._read_at < self.recheck_s:
            return False
        self._read_at = now
        return True


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """One inbound signature once checked, as plain values: ``verified`` under one of the signer's keys here;
    ``signed`` (it carries a signature); ``known`` (the signer has keys here); who signed and who sent it;
    ``pulled``: read from a peer's change log (history that may be relayed and old), not sent live by the node
    that wrote it; what this node knows of the signer's key history; ``claimed_at``, the time the signed payload
    claims (unix ms: a version's updated_at, a link's valid_from, an invalidation's valid_until, a transcript's
    created_at)."""

    verified: bool
    signed: bool
    known: bool
    signer_is_sender: bool
    signer_is_self: bool
    pulled: bool
    history: SignerHistory
    claimed_at: int


def decide(check: SignatureCheck) -> AttestLevel | RejectCode:
    """The level an inbound change is stored at, or why it is refused.

    Verified: ``self_signed`` under this node's own keys, else ``peer_attested``. Signed by a known signer and
    not verified: ``unknown_key`` (parked by the pull, never stored) only for pulled history that may carry a
    key this node was never given (``may_be_unknown_key``), else ``bad_signature``. Unsigned, or a signer with no
    key here: ``unsigned`` when the signer sent it itself, else ``unverified_relay``."""
    if check.verified:
        return AttestLevel.SELF_SIGNED if check.signer_is_self else AttestLevel.PEER_ATTESTED
    if check.signed and check.known:
        if check.pulled and may_be_unknown_key(check.history, check.claimed_at):
            return RejectCode.UNKNOWN_KEY
        return RejectCode.BAD_SIGNATURE
    return AttestLevel.UNSIGNED if check.signer_is_sender else RejectCode.UNVERIFIED_RELAY


def may_be_unknown_key(history: SignerHistory, claimed_at: int) -> bool:
    """A signature none of a known signer's keys here verifies may be by a key this node was never given only
    when this node does not hold the signer's whole key history (a bundle signed by the key it trusts now) and
    the payload claims a time before this node began trusting the signer's current key: anything later must be
    that key's, and with the whole history every key the signer ever had is here."""
    return not history.complete and history.since_ms is not None and claimed_at < history.since_ms


@dataclass(frozen=True, slots=True)
class AgentCheck:
    """An inbound item an agent signed, as plain values: its ``signer``; ``signer_is_node`` (a node's id here, this
    node's or a trusted peer's: never an agent's); the delegation it names, as stored here with its revocation (None:
    not here yet); whether that delegation's issuer is a node this node trusts now (``issuer_trusted``) and is this
    node (``issuer_is_self``); ``verified`` under the delegation's agent key; ``claimed_at``, the time the item
    claims (unix ms, as ``claimed_at`` reads it)."""

    signer: str
    signer_is_node: bool
    delegation: DelegationState | None
    issuer_trusted: bool
    issuer_is_self: bool
    verified: bool
    claimed_at: int


def decide_agent(check: AgentCheck) -> AttestLevel | RejectCode:
    """The level an agent's item is stored at, or why it is refused, in this order: signed as a node
    (``agent_is_node``); its delegation not here (``unknown_delegation``, retryable: it waits); the delegation
    another agent's (``delegation_mismatch``: that agent's key signing for this one); its issuer not trusted here
    (``unverified_relay``: nobody vouches for the key); the signature not the key's (``bad_signature``); dated
    outside the delegation's window (``delegation_expired``) or at or after its revocation (``delegation_revoked``).
    Otherwise ``peer_attested`` (``self_signed`` when this node issued the delegation)."""
    d = check.delegation
    if check.signer_is_node:
        return RejectCode.AGENT_IS_NODE
    if d is None:
        return RejectCode.UNKNOWN_DELEGATION
    if d.row.agent_id != check.signer:
        return RejectCode.DELEGATION_MISMATCH
    if not check.issuer_trusted:
        return RejectCode.UNVERIFIED_RELAY
    if not check.verified:
        return RejectCode.BAD_SIGNATURE
    if not d.row.valid_from <= check.claimed_at < d.row.valid_until:
        return RejectCode.DELEGATION_EXPIRED
    if d.revoked_at is not None and check.claimed_at >= d.revoked_at:
        return RejectCode.DELEGATION_REVOKED
    return AttestLevel.SELF_SIGNED if check.issuer_is_self else AttestLevel.PEER_ATTESTED


class Attester:
    """The level an inbound change is stored at (``decide``): PEER_ATTESTED when its signature verifies under its
    signer's keyring (SELF_SIGNED under this node's own); UNSIGNED when the signer is unknown here (or did not
    sign) and sent it itself; otherwise the rejection (``bad_signature``, ``unverified_relay``, and for pulled
    history ``unknown_key``)."""

    def __init__(self, keys: SignerKeys, verifier: VerifyBatcher, db: Database, counters: Counter[str],
                 agents: AgentBook, hold_s: float) -> None:
        self.keys = keys
        self.verifier = verifier
        self.db = db
        self.counters = counters
        # The delegations held here, and how long a live item waits for its delegation (federation.orphan_hold_s).
        self.agents = agents
        self.hold_s = hold_s

    async def attest(self, payload: Signable, signature: bytes | None, signer: str,
                     sender: str, *, what: str, pulled: bool = False,
                     delegation: str | None = None) -> AttestLevel | RejectCode:
        """Check ``signature`` (this loop turn's checks share one hop) and decide; an item naming the
        ``delegation`` it is signed under is an agent's (``agent_level``)."""
        if delegation is not None:
            state = await self.delegation_state(delegation, pulled=pulled)
            key = self.agent_key(state, signer)
            verified = signature is not None and key is not None \
                and await self.verifier.verify(((key,), payload, signature))
            return await self.agent_level(verified, state, payload, signer, sender, what=what)
        keys, fresh = self.keys.of(signer)
        verified = signature is not None and bool(keys) and await self.verifier.verify((keys, payload, signature))
        return await self.level(verified, keys, fresh, payload, signature, signer, sender, what=what, pulled=pulled)

    async def level(self, verified: bool, keys: Keys, fresh: bool, payload: Signable,
                    signature: bytes | None, signer: str, sender: str, *, what: str,
                    pulled: bool = False) -> AttestLevel | RejectCode:
        """The decision once ``signature`` was checked against ``keys`` (``verified``; False when there was
        nothing to check); ``fresh``: the keys were read from disk just now; ``pulled``: the change came in a
        pulled sync page."""
        if not verified and signature is not None and keys and not fresh:
            # The key may have been rotated since the last read: look again before refusing.
            again = self.keys.rotated(signer)
            verified = again is not None and await self.verifier.verify((again, payload, signature))
        keyring = self.keys.keyring
        me = keyring.identity.agent_id if keyring.identity is not None else None
        # What decides an unknown key is read only where it can matter (not on the hot path of verified links).
        weighed = pulled and not verified
        verdict = decide(SignatureCheck(
            verified=verified, signed=signature is not None, known=bool(keys), signer_is_sender=signer == sender,
            signer_is_self=signer == me, pulled=pulled,
            history=keyring.history(signer, reload=False) if weighed else UNKNOWN_SIGNER,
            claimed_at=claimed_at(payload) if weighed else 0))
        if verdict is RejectCode.BAD_SIGNATURE:
            self.counters["bad_signature"] += 1
            log.warning("bad_signature", extra={"ev": {"peer": sender, "id": what, "claimed_signer": signer}})
            await self.db.write(changelog.incr, "rejected:bad_signature")
        elif verdict is RejectCode.UNVERIFIED_RELAY:
            # Relaying another node's change is only legitimate when its signature verifies here.
            log.warning("unverified_relay", extra={"ev": {"peer": sender, "id": what, "signer": signer}})
        return verdict

    # ---- what agents sign ---------------------------------------------------------------------

    async def delegation_state(self, delegation_id: str, *, pulled: bool) -> DelegationState | None:
        """The named delegation as stored here; a live item waits up to ``hold_s`` for one still in flight (it is
        sent before its agent's first item, but a batch's items are applied together), a pulled one does not (it
        is parked until the delegation comes)."""
        if pulled:
            return (await self.agents.states([delegation_id])).get(delegation_id)
        return await self.agents.wait_for(delegation_id, self.hold_s)

    def agent_key(self, state: DelegationState | None, signer: str) -> Ed25519PublicKey | None:
        """The key to verify ``signer``'s item under: its delegation's, when that delegation is ``signer``'s."""
        if state is None or state.row.agent_id != signer:
            return None
        return self.agents.key_of(state.row)

    async def agent_level(self, verified: bool, state: DelegationState | None, payload: Signable, signer: str,
                          sender: str, *, what: str) -> AttestLevel | RejectCode:
        """``decide_agent`` once the item's signature was checked under its delegation's key (``verified``)."""
        keyring = self.keys.keyring
        me = keyring.identity.agent_id if keyring.identity is not None else None
        issuer = state.row.issuer if state is not None else None
        verdict = decide_agent(AgentCheck(
            signer=signer, signer_is_node=self.agents.is_node(signer), delegation=state,
            issuer_trusted=issuer is not None and (issuer == me or bool(keyring.keys_for(issuer, reload=False))),
            issuer_is_self=issuer is not None and issuer == me, verified=verified, claimed_at=claimed_at(payload)))
        if not isinstance(verdict, AttestLevel):
            if verdict is RejectCode.BAD_SIGNATURE:
                self.counters["bad_signature"] += 1
                await self.db.write(changelog.incr, "rejected:bad_signature")
            if verdict is not RejectCode.UNKNOWN_DELEGATION:
                log.warning("agent_item_refused", extra={"ev": {"peer": sender, "id": what, "agent": signer,
                                                                "issuer": issuer, "code": str(verdict)}})
        return verdict
