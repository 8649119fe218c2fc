"""Serving this node's change log as sync pages (GET /a2a/v1/sync): what each puller may see, in the form it
reads, within its request budget, leaving out in SQL what the writers it skips wrote. Pulling and applying pages
is node/federation/sync.py's."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from a2a.kinds import AGENT_DELEGATE, AGENT_REVOKE, MEMORY_PUT_V2
from node.agents.book import DELEGATE_REF, REVOKE_REF, ref_kind
from node.attest import SIGNED_SET_SHARED
from node.config import NodeConfig
from node.errors import ServiceError
from node.federation.codes import RejectCode
from node.federation.forms import AgentForms, MemoryForms, Withheld
from node.federation.inbound.common import Clock
from node.federation.outbound import ACCEPTS
from node.federation.policy import Policy
from node.federation.sync import SYNCED_KINDS
from node.kg import invalidation_wire
from node.ratelimit import RateLimiter
from node.transcripts import scope_of, transcript_wire
from node.wire import link_wire, memory_put_v2_body
from storage import agents, changelog, graph, links, memories, outbox, transcripts
from storage.db import Database

log = logging.getLogger("node.federation")

# Most bytes of transcript frames one sync page carries; past it the page ends early (more = true).
SYNC_PAGE_TRANSCRIPT_BYTES = 8 * 1024 * 1024
# Most seqs of the change log one sync page scans for changes the puller does not skip (a peer whose log is mostly
# others' writes answers a short or empty page past them, rather than one read of its whole log).
SYNC_PAGE_SCAN = 100_000


@dataclass(frozen=True, slots=True)
class _Puller:
    """Whom a page is served to: the peer, the writers whose changes it does not get, itself when it asks for what
    it wrote (``own``: a restore), whether it reads memory versions with their signed sharing list, and whether it
    reads what agents sign (an agent's change counts as written by the node that vouches for it)."""

    peer: str
    omit: frozenset[str]
    own: str | None
    reads_v2: bool
    reads_agents: bool


class SyncPages:
    """Serves this node's change log to its peers: what each may see, within its request budget (``peer_rate``:
    a page's changes are messages' worth of work; None = no limit), each memory version in the form the puller
    reads (``forms``)."""

    def __init__(self, cfg: NodeConfig, db: Database, policy: Policy, clock: Clock, peer_rate: RateLimiter | None,
                 counters: Counter[str], forms: MemoryForms, agent_forms: AgentForms) -> None:
        self.cfg = cfg
        self.db = db
        self.policy = policy
        self.clock = clock
        self.peer_rate = peer_rate
        self.counters = counters
        self.forms = forms
        self.agent_forms = agent_forms

    async def page(self, peer: str, since: int, limit: int, skip: Sequence[str] = (),
                   mine: bool = False, reads: Sequence[str] = ACCEPTS) -> dict[str, Any]:
        """One page of this node's change log after ``since`` (served at GET /a2a/v1/sync), with ``head``, the
        log's last seq.

        Only what ``peer`` may see (a link only where it may see both ends), and nothing written by the agents in
        ``skip`` (the puller gets those from their writers) nor, unless ``mine`` (a restore), by ``peer`` itself;
        with ``mine`` what ``peer`` wrote is served whatever the namespace policy (it wrote it) and the page says
        ``mine: true``. Memory versions come in the form ``reads`` (the kinds the request listed in ``accepts``)
        allows.
        """
        reads_v2 = MEMORY_PUT_V2 in reads
        limit = self._granted(peer, min(limit, self.cfg.federation.sync_page_limit))
        read_rows = 0

        def read(conn: Any) -> dict[str, Any]:
            nonlocal read_rows
            who = _Puller(peer, frozenset({*skip} - {peer} if mine else {peer, *skip}), peer if mine else None,
                          reads_v2, reads_v2 and AGENT_DELEGATE in reads)
            head = changelog.last_seq(conn)
            # The changes written by those the puller skips are left out in SQL (their rows name their author);
            # a page scans at most SYNC_PAGE_SCAN seqs of the log to fill itself.
            upto = min(head, since + SYNC_PAGE_SCAN)
            rows = changelog.page(conn, since, limit, skip=who.omit, upto=upto)
            read_rows = len(rows)
            return {**self._page_of(conn, who, since, rows, limit, upto, head), "head": head,
                    **({"mine": True} if mine else {})}

        read_at = self.clock()
        try:
            page: dict[str, Any] = await self.db.read(read)
        finally:
            if self.peer_rate is not None:
                self.peer_rate.give_back(peer, limit - read_rows)  # a short log used fewer than granted
        if not page["more"]:
            # Only changes the log carries are covered by the catch-up (a dead ping stays for replay), and
            # only letters dead before this page was read: a later one may carry a change made since.
            cleared = await self.db.write(outbox.clear_dead_letters, peer, SYNCED_KINDS, read_at)
            if cleared:
                log.info("dead_letters_cleared", extra={"ev": {"peer": peer, "count": cleared,
                                                               "reason": "peer caught up through sync"}})
        return page

    def _granted(self, peer: str, limit: int) -> int:
        """How many changes ``peer`` may read now: a page reads up to ``limit`` changes, each one a message's worth
        of work, out of the peer's limits.peer_requests_per_second budget as live messages are. A short budget
        gives a short page (the peer asks again from ``next``); none at all refuses the page, retryably."""
        if self.peer_rate is None:
            return limit
        limit, wait = self.peer_rate.take_up_to(peer, limit)
        if not limit:
            self.counters[f"rejected:{RejectCode.RATE_LIMITED}"] += 1
            raise ServiceError(RejectCode.RATE_LIMITED.value,
                               f"sync pages from {peer} are past limits.peer_requests_per_second "
                               f"({self.cfg.limits.peer_requests_per_second}); retry in {wait * 1000:.0f} ms")
        return limit

    def _page_of(self, conn: Any, who: _Puller, since: int, rows: list[changelog.ChangeRow], limit: int,
                 upto: int, head: int) -> dict[str, Any]:
        """The page of ``rows`` (the changes after ``since`` up to seq ``upto`` not left out in SQL, at most
        ``limit``): ``next`` is past every seq read, up to ``upto`` when fewer than ``limit`` rows were found."""
        items: list[dict[str, Any]] = []
        budget, last = SYNC_PAGE_TRANSCRIPT_BYTES, since
        for r in rows:
            item = self._item(conn, who, r)
            last = r.seq
            if item is not None:
                items.append(item)
                budget -= len(item.get("body", b""))
            if budget < 0:
                break  # transcripts filled the page: the rest comes on the next one
        cut = len(rows) == limit or (bool(rows) and last != rows[-1].seq)
        # Fewer rows than asked: every seq up to ``upto`` was read (the others were left out in SQL).
        nxt = last if cut else max(since, upto)
        return {"items": items, "next": nxt, "more": cut or nxt < head, "accepts": list(ACCEPTS)}

    def _item(self, conn: Any, who: _Puller, r: changelog.ChangeRow) -> dict[str, Any] | None:
        """The item serving change ``r`` to the puller, or None."""
        peer, own = who.peer, who.own
        if r.kind == "memory":
            m = memories.get(conn, r.ref_id)
            if m is None:
                return None
            agent_signed = m.signed_set == SIGNED_SET_SHARED and self.agent_forms.book.may_be_agent(m.signed_by)
            body = memory_put_v2_body(m) if agent_signed else {}
            author = self._author(conn, who, body, m.author, m.id)
            if author is None or (author[0] != own and not self.policy.visible_to(peer, m)):
                return None
            payload = self.forms.payload(m, peer, who.reads_v2)
            return None if payload is None else {"seq": r.seq, **payload, **author[1]}
        if ref_kind(r.ref_id) is not None:
            return self._agent_record(conn, who, r)
        inv = graph.get_invalidation(conn, r.ref_id)
        # A 'link' change is a link or an invalidation of one; either goes where the link may go.
        link = links.get(conn, inv.link_id if inv is not None else r.ref_id)
        if link is None and inv is None:
            return self._transcript(conn, who, r)
        if link is None:
            return None
        body = invalidation_wire(inv) if inv is not None else link_wire(link)
        author = self._author(conn, who, body, inv.observed_by if inv is not None else link.observed_by, r.ref_id)
        if author is None or (author[0] != own and not self.policy.link_visible(conn, peer, link)):
            return None
        kind = "link.invalidate" if inv is not None else "link.put"
        return {"seq": r.seq, "kind": kind, **body, **author[1]}

    def _author(self, conn: Any, who: _Puller, body: dict[str, Any], author: str,
                ref: str) -> tuple[str, dict[str, str]] | None:
        """Who wrote a change for the omit and own rules, with the fields that name its delegation: an agent's
        change is its node's (the puller skips the node it gets that node's changes from directly, and a restoring
        node gets its own agents' changes back). None when the puller is not to get it: written by one it skips,
        or signed by an agent and the puller reads no agents (withheld: it could not verify it)."""
        d = self.agent_forms.delegation_of(conn, body) if body else None
        if d is not None:
            if not who.reads_agents:
                self.forms.withheld(ref, who.peer, Withheld.AGENTS_UNREAD)
                return None
            author, extra = d.issuer, {"delegation": d.delegation_id}
        else:
            extra = {}
        return None if author in who.omit else (author, extra)

    def _agent_record(self, conn: Any, who: _Puller, r: changelog.ChangeRow) -> dict[str, Any] | None:
        """A delegation or revocation, served to a puller that reads agents (not to the one that issued it, unless
        it restores; not when the puller gets the issuer's changes from the issuer)."""
        if not who.reads_agents:
            self.forms.withheld(r.ref_id, who.peer, Withheld.AGENTS_UNREAD)
            return None
        if r.ref_id.startswith(DELEGATE_REF):
            d = agents.get_delegation(conn, r.ref_id[len(DELEGATE_REF):])
            if d is None or d.issuer in who.omit:
                return None
            record = {"agent_id": d.agent_id, "agent_key": d.agent_key, "issuer": d.issuer,
                      "valid_from": d.valid_from, "valid_until": d.valid_until}
            return {"seq": r.seq, "kind": AGENT_DELEGATE, "delegation": record, "signature": d.signature,
                    "signed_by": d.issuer}
        v = agents.get_revocation(conn, r.ref_id[len(REVOKE_REF):])
        if v is None or v.issuer in who.omit:
            return None
        record = {"delegation_id": v.delegation_id, "agent_id": v.agent_id, "issuer": v.issuer,
                  "revoked_at": v.revoked_at}
        return {"seq": r.seq, "kind": AGENT_REVOKE, "revocation": record, "signature": v.signature,
                "signed_by": v.issuer}

    def _transcript(self, conn: Any, who: _Puller, r: changelog.ChangeRow) -> dict[str, Any] | None:
        """A 'link' change that is neither a link nor an invalidation is a replicated transcript: served where
        its namespace still replicates and ``peer`` may see the namespace and every memory it cites (or wrote
        it, asking for its own)."""
        peer, own = who.peer, who.own
        t = transcripts.get(conn, r.ref_id)
        if t is None or not self.cfg.transcripts.policy(t.namespace).replicate:
            return None
        spans = transcripts.spans_of_transcript(conn, t.id)
        body = transcript_wire(t, spans)
        author = self._author(conn, who, body, t.agent, t.id)
        if author is None:
            return None
        if author[0] == own:
            return {"seq": r.seq, "kind": "transcript.put", **body, **author[1]}
        ids = {s.memory_id for s in spans}
        cited = memories.get_many(conn, ids)
        if len(cited) != len(ids) or not all(self.policy.visible_to(peer, m)
                                             for m in [scope_of(t.namespace, None), *cited.values()]):
            return None
        return {"seq": r.seq, "kind": "transcript.put", **body, **author[1]}
