"""Federation trust (issue 10) at the apply level: what a receiver accepts or refuses from a peer.

The cases of tests/integration/test_federation_trust.py that are decisions of the receiver, run on nodes of
a real testbed layout (node 1 and node 3 opened in this process from their own config and keys,
``configure_trust``'s namespace policies) behind the receive function their server runs (tests/node/
inbound_play.py). The attacker is the test holding node 2's real key: a compromised but legitimate member.
Each refusal is the stable code of the issue 10 spec and leaves the victim's rows exactly as they were.
What a node sends another is carried from its outbox (``carry_from``) as its sender would send it.

The same behaviours on real processes and sockets (routes, TLS membership, pulls, restarts) stay in
tests/integration/test_federation_trust.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from a2a import Ack
from node import attest
from node.attest import LinkPayload
from testbed.mesh import MeshLayout, build_layout
from tests.integration.peer_play import (
    INT64_MAX,
    MAX_VERSION_STEP,
    SECRET,
    SHARED,
    TEN_YEARS_MS,
    Member,
    add_config,
    configure_trust,
    db_rows,
    diff,
    item_ids,
    link_ids,
    memory_put,
    memory_put_v2,
    new_memory,
    next_version,
    now_ms,
    queued_for,
)
from tests.node.inbound_play import InProcessNode
from tests.node_access import cli_in_process


@dataclass
class Trust:
    layout: MeshLayout
    n1: InProcessNode
    n3: InProcessNode
    attacker: Member  # node 2's real credentials, in the test's hands

    def id(self, i: int) -> str:
        return self.layout.node(i).agent_id

    def node(self, i: int) -> InProcessNode:
        return {1: self.n1, 3: self.n3}[i]

    def member(self, i: int) -> Member:
        return Member.of(self.layout, i)


@pytest.fixture
async def trust(tmp_path: Path) -> AsyncIterator[Trust]:
    """Nodes 1 and 3 open in this process; node 2 exists only as credentials, played by the test."""
    layout = build_layout(tmp_path / "mesh", 3, mcp_http=False)
    configure_trust(layout)
    n1 = await InProcessNode.open(layout.node(1))
    try:
        n3 = await InProcessNode.open(layout.node(3))
        try:
            # As the running nodes' first pulls from each other would: each knows what the other reads.
            await n1.hears_from(n3)
            await n3.hears_from(n1)
            yield Trust(layout, n1, n3, Member.of(layout, 2))
        finally:
            await n3.close()
    finally:
        await n1.close()


async def assert_refused(victim: InProcessNode, by: Member, cases: dict[str, tuple[str | set[str], dict]]) -> None:
    """Send every case; each must be ACKed ``rejected:<code>`` and the victim's rows unchanged.

    All cases are sent before asserting, so one run reports every disagreement with the spec at once.
    """
    before = db_rows(victim.spec)
    wrong = {}
    for name, (want, payload) in cases.items():
        ack = await victim.receive(by.agent_id, payload)
        codes = {want} if isinstance(want, str) else want
        if ack is None or ack.reject_code not in codes:
            wrong[name] = f"want rejected:{'|'.join(sorted(codes))}, got {ack.reason if ack else 'no ACK'}"
    changed = diff(before, db_rows(victim.spec))
    assert not wrong and not changed, {"wrong answers": wrong, "rows changed": changed}


def assert_accepted(ack: Ack | None) -> None:
    assert ack is not None and ack.accepted, ack


# ---------------------------------------------------------------- origin is bound to the sender


async def test_peer_cannot_write_a_memory_as_another_origin(trust: Trust) -> None:
    n2, n3 = trust.id(2), trust.id(3)
    fake = trust.attacker.signing_as(n3)
    as_n3 = new_memory(n3, content="node 3 never wrote this")
    as_n2_of_n3 = new_memory(n3, writer=n2, content="node 2 writing a node 3 memory")
    own = new_memory(n2, content="node 2's own, but signed_by names node 3")
    await assert_refused(trust.n1, trust.attacker, {
        "unsigned, writer node 3": ("unverified_relay", memory_put(as_n3)),
        "writer node 3, signed with node 2's key": ("bad_signature", memory_put(as_n3, signer=fake)),
        "origin node 3, writer node 2, signed by node 2": ("writer_not_allowed",
                                                           memory_put(as_n2_of_n3, signer=trust.attacker)),
        "signed_by node 3 but writer node 2": ("signer_mismatch",
                                               memory_put(own, signer=trust.attacker, signed_by=n3)),
    })
    # Node 2 writing as itself is fine, signed or not (the sender is the writer).
    assert_accepted(await trust.n1.receive(n2, memory_put(new_memory(n2), signer=trust.attacker)))
    assert_accepted(await trust.n1.receive(n2, memory_put(new_memory(n2))))


@pytest.mark.parametrize("owner", [1, 3], ids=["the_receivers_own", "another_nodes"])
async def test_peer_cannot_overwrite_a_memory_it_may_not_write(trust: Trust, owner: int) -> None:
    n2 = trust.id(2)
    owner_node = trust.node(owner)
    created = await owner_node.svc.memory_store(f"memory of node {owner}")
    if owner != 1:
        await trust.n1.carry_from(owner_node)
    stored = await trust.n1.memory_on(created["id"])
    assert stored is not None
    fake = trust.attacker.signing_as(owner_node.agent_id)
    far = now_ms() + TEN_YEARS_MS
    await assert_refused(trust.n1, trust.attacker, {
        "writer node 2, signed by node 2": ("writer_not_allowed", memory_put(
            next_version(stored, n2, content="forged"), signer=trust.attacker)),
        "writer node 2, ten years ahead": ({"writer_not_allowed", "clock_skew"}, memory_put(
            next_version(stored, n2, content="forged", updated_at=far), signer=trust.attacker)),
        "node 2 claims to be the origin": ("origin_mismatch", memory_put(
            next_version(stored, n2, origin=n2, content="forged"), signer=trust.attacker)),
        "writer the owner, signed with node 2's key": ("bad_signature", memory_put(
            next_version(stored, owner_node.agent_id, content="forged"), signer=fake)),
        "writer the owner, unsigned": ("unverified_relay", memory_put(
            next_version(stored, owner_node.agent_id, content="forged"))),
    })
    # The owner's honest next edit is not "stale" and reaches node 1.
    await owner_node.svc.memory_update(created["id"], content="honest edit")
    if owner != 1:
        assert all(ack is not None and ack.accepted for ack in await trust.n1.carry_from(owner_node))
    got = await trust.n1.memory_on(created["id"])
    assert got["content"] == "honest edit", got
    assert got["version"] == 2 and got["origin"] == owner_node.agent_id


async def test_a_relayed_version_signed_by_its_writer_is_accepted(trust: Trust) -> None:
    """The other side of the binding: a peer may relay a version its writer signed (node 2 had it first)."""
    n2, n3 = trust.id(2), trust.id(3)
    created = await trust.n3.svc.memory_store("node 3's, relayed by node 2")
    await trust.n1.carry_from(trust.n3)
    stored = await trust.n1.memory_on(created["id"])
    # Node 3's version 2, signed with node 3's key as node 3 would; node 2 delivers it.
    v2 = next_version(stored, n3, content="node 3's version 2, relayed")
    assert_accepted(await trust.n1.receive(n2, memory_put(v2, signer=trust.member(3))))
    got = await trust.n1.memory_on(created["id"])
    assert (got["version"], got["content"], got["writer"]) == (2, v2["content"], n3), got
    assert (got["attest_level"], got["received_from"]) == ("peer_attested", n2), got


async def test_a_writer_cannot_date_a_version_ahead_of_the_clock(trust: Trust) -> None:
    n2 = trust.id(2)
    created = await trust.n1.svc.memory_store("shared with a writer", namespace=SHARED)
    stored = await trust.n1.memory_on(created["id"])
    own = new_memory(n2, content="node 2's own")
    await assert_refused(trust.n1, trust.attacker, {
        "version ten years ahead": ("clock_skew", memory_put(
            next_version(stored, n2, updated_at=now_ms() + TEN_YEARS_MS), signer=trust.attacker)),
        "version an hour ahead": ("clock_skew", memory_put(
            next_version(stored, n2, updated_at=now_ms() + 3600_000), signer=trust.attacker)),
        "created after updated": ("clock_skew", memory_put(
            next_version(stored, n2, created_at=now_ms() + 60_000), signer=trust.attacker)),
        "new memory ten years ahead": ("clock_skew", memory_put(
            {**own, "created_at": now_ms() + TEN_YEARS_MS, "updated_at": now_ms() + TEN_YEARS_MS},
            signer=trust.attacker)),
    })
    # An allowed writer with an honest clock is accepted (carrying the origin's signed list as it is), and the
    # origin's later edit supersedes it.
    assert_accepted(await trust.n1.receive(n2, memory_put_v2(next_version(stored, n2, content="by node 2"),
                                                             stored["share_with"], signer=trust.attacker)))
    got = await trust.n1.memory_on(created["id"])
    assert (got["version"], got["content"], got.get("writer")) == (2, "by node 2", n2), got
    edited = await trust.n1.svc.memory_update(created["id"], content="origin again")
    assert edited["version"] == 3
    # Node 2's version 2 again (a replay or a late copy) is an older version: ACK ok, nothing changes.
    before = db_rows(trust.n1.spec)
    assert_accepted(await trust.n1.receive(n2, memory_put(next_version(stored, n2, content="late copy"),
                                                          signer=trust.attacker)))
    assert diff(before, db_rows(trust.n1.spec)) == {}


async def test_version_or_time_at_the_int64_edge_is_refused_and_the_row_stays_editable(trust: Trust) -> None:
    n2 = trust.id(2)
    created = await trust.n1.svc.memory_store("must stay editable", namespace=SHARED)
    stored = await trust.n1.memory_on(created["id"])
    own = new_memory(n2)
    await assert_refused(trust.n1, trust.attacker, {
        "version 2^63-1": ("version_out_of_range", memory_put(
            next_version(stored, n2, version=INT64_MAX), signer=trust.attacker)),
        "version one past the step": ("version_out_of_range", memory_put(
            next_version(stored, n2, version=stored["version"] + MAX_VERSION_STEP + 1), signer=trust.attacker)),
        "updated_at 2^63-1": ("clock_skew", memory_put(
            next_version(stored, n2, updated_at=INT64_MAX), signer=trust.attacker)),
        "new memory at version 2^63-1": ("version_out_of_range", memory_put(
            {**own, "version": INT64_MAX}, signer=trust.attacker)),
        "new memory one past the step": ("version_out_of_range", memory_put(
            {**own, "version": MAX_VERSION_STEP + 1}, signer=trust.attacker)),
    })
    edited = await trust.n1.svc.memory_update(created["id"], content="edited locally")
    assert edited["version"] == 2
    # The bound itself is allowed: a new memory may start at version max_version_step.
    assert_accepted(await trust.n1.receive(n2, memory_put({**new_memory(n2), "version": MAX_VERSION_STEP},
                                                          signer=trust.attacker)))


# ---------------------------------------------------------------- restricted namespaces


async def test_a_peer_cannot_write_into_or_move_a_memory_across_namespaces(trust: Trust) -> None:
    n2 = trust.id(2)
    mine = new_memory(n2, content="node 2's memory in default")
    assert_accepted(await trust.n1.receive(n2, memory_put(mine, signer=trust.attacker)))
    stored = await trust.n1.memory_on(mine["id"])
    await assert_refused(trust.n1, trust.attacker, {
        "new memory in a namespace restricted to node 3": ("namespace_not_allowed", memory_put(
            new_memory(n2, namespace=SECRET), signer=trust.attacker)),
        "own memory moved to another namespace": ("namespace_mismatch", memory_put(
            next_version(stored, n2, namespace="elsewhere"), signer=trust.attacker)),
    })


async def test_a_restricted_memory_cannot_be_moved_out_of_its_namespace(trust: Trust, caplog) -> None:
    caplog.set_level(logging.WARNING)
    n1, n2 = trust.id(1), trust.id(2)
    secret = await trust.n1.svc.memory_store("node 1's secret", namespace=SECRET)
    stored = await trust.n1.memory_on(secret["id"])
    moved = next_version(stored, n2, namespace="default", content="moved out")
    as_n1 = next_version(stored, n1, namespace="default", content="moved out")
    guesses = {
        "node 2 claims the id as its own": memory_put(
            {**new_memory(n2, content="moved out"), "id": secret["id"]}, signer=trust.attacker),
        "node 2 re-sends node 1's memory in default": memory_put(moved, signer=trust.attacker),
        "the same as node 1, unsigned": memory_put(as_n1),
        "the same as node 1, signed with node 2's key": memory_put(as_n1, signer=trust.attacker.signing_as(n1)),
    }
    before = db_rows(trust.n1.spec)
    answers = {name: await trust.n1.receive(n2, p) for name, p in guesses.items()}
    assert diff(before, db_rows(trust.n1.spec)) == {}
    assert await trust.n1.memory_on(secret["id"]) == stored
    # Each is answered exactly as the same payload for an id that does not exist here.
    leaks = {}
    for name, payload in guesses.items():
        absent = {**payload, "memory": {**payload["memory"], "id": str(uuid.uuid4())}}
        if payload["signature"] is not None:
            signer = trust.attacker.signing_as(payload["signed_by"])
            absent["signature"] = signer.sign(absent["memory"])
        twin, got = await trust.n1.receive(n2, absent), answers[name]
        if (got is None, got and got.reason) != (twin is None, twin and twin.reason):
            leaks[name] = f"hidden id: {got and got.reason}; absent id: {twin and twin.reason}"
    assert not leaks, leaks
    # The refusal is logged (a warning naming the hidden id) though the peer is told nothing.
    assert any(r.levelno == logging.WARNING and secret["id"] in str({"event": r.getMessage(),
                                                                     **getattr(r, "ev", {})}.values())
               for r in caplog.records)


async def test_links_into_a_restricted_namespace_are_refused_as_unknown_memory(trust: Trust) -> None:
    n2 = trust.id(2)
    secret = await trust.n1.svc.memory_store("secret end", namespace=SECRET)
    mine = new_memory(n2)
    assert_accepted(await trust.n1.receive(n2, memory_put(mine, signer=trust.attacker)))

    def link(src: str, dst: str, by: Member = trust.attacker) -> dict:
        payload = LinkPayload(src_id=src, dst_id=dst, relation="points_at", observed_by=by.agent_id,
                              valid_from=now_ms(), valid_until=None)
        return {"kind": "link.put", "link": payload.to_dict(),
                "signature": attest.sign(by.private_key, payload), "signed_by": by.agent_id}

    absent = str(uuid.uuid4())
    await assert_refused(trust.n1, trust.attacker, {
        "to a restricted memory": ("unknown_memory", link(mine["id"], secret["id"])),
        "from a restricted memory": ("unknown_memory", link(secret["id"], mine["id"])),
        "to an absent memory (the same answer)": ("unknown_memory", link(mine["id"], absent)),
        # Node 3 may see the restricted end and signed this link; node 2, relaying it, may not.
        "node 3's signed link relayed by node 2": ("unknown_memory",
                                                   link(mine["id"], secret["id"], trust.member(3))),
    })


async def test_sync_does_not_serve_links_with_an_end_the_peer_may_not_see(trust: Trust) -> None:
    svc = trust.n1.svc
    shared = await svc.memory_store("shared end")
    other = await svc.memory_store("another shared end")
    secret = await svc.memory_store("restricted end", namespace=SECRET)
    into = await svc.memory_link(shared["id"], secret["id"], "refers_to")
    out_of = await svc.memory_link(secret["id"], shared["id"], "refers_to")
    visible = await svc.memory_link(shared["id"], other["id"], "refers_to")
    # Not sent live either: node 1's queue for node 2 holds the visible link only.
    live = link_ids([p for p in queued_for(trust.n1.spec, trust.id(2)) if p["kind"] == "link.put"])
    assert visible["link_id"] in live and not {into["link_id"], out_of["link_id"]} & live
    items = await trust.n1.sync_all(trust.id(2))
    assert visible["link_id"] in link_ids(items)
    assert not {into["link_id"], out_of["link_id"]} & link_ids(items)
    assert secret["id"] not in item_ids(items)
    # Node 3 may see both ends: it is served all three.
    by_n3 = await trust.n1.sync_all(trust.id(3))
    assert {into["link_id"], out_of["link_id"], visible["link_id"]} <= link_ids(by_n3)


async def test_a_writer_cannot_narrow_who_sees_the_origins_memory(trust: Trust) -> None:
    n2 = trust.id(2)
    created = await trust.n1.svc.memory_store("node 1's, shared with nodes 2 and 3", namespace=SHARED)
    stored = await trust.n1.memory_on(created["id"])
    # Node 2 may write versions in this namespace, but the list is the origin's: a version that changes it is
    # refused, in either form; one that carries the origin's signed list as it is, is stored.
    nxt = next_version(stored, n2, content="by node 2, for node 2's eyes")
    await assert_refused(trust.n1, trust.attacker, {
        "narrowed, signed": ("share_with_changed", memory_put_v2(nxt, sorted([trust.id(1), n2]),
                                                                 signer=trust.attacker)),
        "without the origin": ("share_with_without_origin", memory_put_v2(nxt, [n2], signer=trust.attacker)),
        "narrowed, old form": ("share_with_unsigned", memory_put(nxt, signer=trust.attacker, share_with=[n2])),
        "lifted, old form": ("share_with_unsigned", memory_put(nxt, signer=trust.attacker)),
    })
    assert_accepted(await trust.n1.receive(n2, memory_put_v2(nxt, stored["share_with"], signer=trust.attacker)))
    assert (await trust.n1.memory_on(created["id"]))["version"] == 2
    served_to_n3 = await trust.n1.sync_all(trust.id(3))
    assert created["id"] in item_ids(served_to_n3), "node 2's version hid the origin's memory from node 3"


async def test_a_node_without_the_policy_does_not_re_serve_restricted_memories(trust: Trust) -> None:
    secret = await trust.n1.svc.memory_store("restricted to node 3", namespace=SECRET)
    public = await trust.n1.svc.memory_store("for everyone")
    await trust.n3.carry_from(trust.n1)
    assert await trust.n3.memory_on(secret["id"]) and await trust.n3.memory_on(public["id"])
    # Node 3 links one of its own memories to the restricted one.
    own = await trust.n3.svc.memory_store("node 3's own")
    link = await trust.n3.svc.memory_link(own["id"], secret["id"], "refers_to")
    items = await trust.n3.sync_all(trust.id(2))
    assert public["id"] in item_ids(items) and own["id"] in item_ids(items)
    assert secret["id"] not in item_ids(items)
    assert link["link_id"] not in link_ids(items)


async def test_a_node_without_the_policy_does_not_send_links_to_restricted_memories_live(trust: Trust) -> None:
    secret = await trust.n1.svc.memory_store("restricted to node 3, linked on node 3", namespace=SECRET)
    await trust.n3.carry_from(trust.n1)
    assert await trust.n3.memory_on(secret["id"])
    own = await trust.n3.svc.memory_store("node 3's own, linked to the restricted one")
    link = await trust.n3.svc.memory_link(own["id"], secret["id"], "refers_to")
    # What node 3 sends node 2 live waits in node 3's queue (nothing sends it here).
    live = queued_for(trust.n3.spec, trust.id(2))
    assert own["id"] in item_ids(live)
    assert link["link_id"] not in link_ids([p for p in live if p["kind"] == "link.put"])
    assert secret["id"] not in item_ids(live)


# ---------------------------------------------------------------- limits


async def test_inbound_memory_put_obeys_the_local_limits(trust: Trust) -> None:
    n2 = trust.id(2)

    def put(**fields) -> dict:
        return memory_put(new_memory(n2, **fields), signer=trust.attacker)

    await assert_refused(trust.n1, trust.attacker, {
        "200 KiB content": ("too_large", put(content="x" * 200 * 1024)),
        "2000 tags": ("too_large", put(tags=[f"t{i}" for i in range(2000)])),
        "50,000-char namespace": ("too_large", put(namespace="n" * 50_000)),
        "513-char title": ("too_large", put(title="t" * 513)),
        "65-char tag": ("too_large", put(tags=["t" * 65])),
        "257-char source": ("too_large", put(source="s" * 257)),
        "priority -2^63": ("bad_input", put(priority=-(2**63))),
        "priority 0": ("bad_input", put(priority=0)),
        "priority 11": ("bad_input", put(priority=11)),
        "confidence 1e308": ("bad_input", put(confidence=1e308)),
        "confidence -0.5": ("bad_input", put(confidence=-0.5)),
        "empty content": ("content_empty", put(content="")),
        "blank content": ("content_empty", put(content="   \n")),
    })
    # At the limits it is accepted.
    assert_accepted(await trust.n1.receive(n2, put(content="x" * 65_536, tags=[f"t{i}" for i in range(32)],
                                                   priority=10, confidence=0.0)))


async def test_inbound_memory_put_is_refused_retryably_when_the_database_is_full(tmp_path: Path) -> None:
    layout = build_layout(tmp_path / "mesh", 3, mcp_http=False)
    add_config(layout.node(1), "limits", max_db_bytes=1)
    n1 = await InProcessNode.open(layout.node(1))
    try:
        attacker = Member.of(layout, 2)
        before = db_rows(n1.spec)
        ack = await n1.receive(attacker.agent_id, memory_put(new_memory(attacker.agent_id), signer=attacker))
        assert ack is not None and ack.reject_code == "storage_full", ack
        assert not ack.permanent, "storage_full must be retryable (the sender keeps its schedule)"
        assert diff(before, db_rows(n1.spec)) == {}
    finally:
        await n1.close()


# ---------------------------------------------------------------- links relayed by another peer


async def test_a_relay_cannot_change_a_signed_links_confidence(trust: Trust) -> None:
    n2, n3 = trust.id(2), trust.id(3)
    a = await trust.n3.svc.memory_store("node 3's first")
    b = await trust.n3.svc.memory_store("node 3's second")
    await trust.n1.carry_from(trust.n3)
    assert await trust.n1.memory_on(a["id"]) and await trust.n1.memory_on(b["id"])
    # The link node 3 signed (made here with node 3's key: node 2 would have it from node 3's change log
    # before node 1 does); node 2 relays it with a confidence of its own.
    payload = LinkPayload(src_id=a["id"], dst_id=b["id"], relation="supports", observed_by=n3,
                          valid_from=now_ms(), valid_until=None)
    signature = attest.sign(trust.member(3).private_key, payload)
    relayed = {"kind": "link.put", "link": {**payload.to_dict(), "confidence": 0.01}, "signature": signature,
               "signed_by": n3}
    assert_accepted(await trust.n1.receive(n2, relayed))
    row = (await trust.n1.links_on())[payload.link_id]
    assert row["confidence"] is None, row
    assert (row["attest_level"], row["received_from"]) == ("peer_attested", n2), row
    assert (await trust.n1.svc.memory_verify(payload.link_id))["signature_verified"] is True


async def test_an_inbound_link_confidence_outside_0_1_is_never_stored(trust: Trust) -> None:
    """Beyond the spec's list (which names memory.put): a local link's confidence must be in 0..1, so a
    received one (even from its observer) is refused or dropped, never stored out of range."""
    n2 = trust.id(2)
    a, b = new_memory(n2, content="end a"), new_memory(n2, content="end b")
    for m in (a, b):
        assert_accepted(await trust.n1.receive(n2, memory_put(m, signer=trust.attacker)))
    out_of_range = {}
    for i, confidence in enumerate((1e308, -5.0, 1.5)):
        payload = LinkPayload(src_id=a["id"], dst_id=b["id"], relation=f"rel{i}", observed_by=n2,
                              valid_from=now_ms(), valid_until=None)
        body = {"kind": "link.put", "link": {**payload.to_dict(), "confidence": confidence},
                "signature": attest.sign(trust.attacker.private_key, payload), "signed_by": n2}
        ack = await trust.n1.receive(n2, body)
        row = (await trust.n1.links_on()).get(payload.link_id)
        if row is not None and row["confidence"] is not None and not 0.0 <= row["confidence"] <= 1.0:
            out_of_range[confidence] = (ack.reason if ack else "no ACK", row["confidence"])
    assert not out_of_range, out_of_range


# ---------------------------------------------------------------- attestation of what is received


async def test_a_received_version_is_attested_by_its_writers_signature(trust: Trust) -> None:
    """Also the control for every forged-signature case: node 2's correctly signed memory verifies."""
    n2 = trust.id(2)
    signed, unsigned = new_memory(n2, content="signed by node 2"), new_memory(n2, content="unsigned")
    assert_accepted(await trust.n1.receive(n2, memory_put(signed, signer=trust.attacker)))
    assert_accepted(await trust.n1.receive(n2, memory_put(unsigned)))
    got = await trust.n1.memory_on(signed["id"])
    assert (got["attest_level"], got["writer"], got["received_from"]) == ("peer_attested", n2, n2), got
    verified = await trust.n1.svc.memory_verify(signed["id"])
    assert verified["signature_verified"] is True, verified
    assert (await trust.n1.memory_on(unsigned["id"]))["attest_level"] == "unsigned"
    rc, out, _ = cli_in_process(trust.n1.spec.config_path, trust.n1.spec.home, "verify", unsigned["id"])
    assert rc == 3 and out["signature_verified"] is False, out
    # A memory node 3 wrote, received from node 3, verifies against node 3's key.
    created = await trust.n3.svc.memory_store("node 3's, verified on node 1")
    await trust.n1.carry_from(trust.n3)
    assert await trust.n1.memory_on(created["id"])
    assert (await trust.n1.svc.memory_verify(created["id"]))["signature_verified"] is True
