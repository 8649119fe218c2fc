"""Federation trust (issue 10) on real node processes and real mTLS sockets.

The attacker is the test itself holding node 2's real key and certificate: a compromised but
legitimate member. It sends hand-made envelopes to node 1 (the victim), which must refuse each with the
stable code of the issue 10 spec and leave its rows exactly as they were.
Where a forgery needs a valid signature it is signed with node 2's real key over the canonical
``memory.version`` payload: a well-signed version by a node that may not write it.

The receiver's decisions case by case (who may write what, bounds, namespaces, what is served and sent)
run at the apply level in tests/node/test_trust_on_apply.py; here is what needs the processes: the routes
and their answers, TLS membership, the sync route, pulls from a peer's change log, restarts and catch-up.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from node import attest
from node.attest import LinkPayload
from testbed.mesh import LocalMesh, MeshLayout, NodeSpec, health
from tests.integration.conftest import stop_meshes, wait_for
from tests.integration.peer_play import (
    INT64_MAX,
    SECRET,
    TEN_YEARS_MS,
    Answer,
    Member,
    PeerServer,
    add_config,
    change_log_seq,
    configure_trust,
    db_rows,
    diff,
    item_ids,
    link_ids,
    links_on,
    memory_on,
    memory_put,
    new_memory,
    next_version,
    now_ms,
    ok,
    poll,
    queued_for,
    version_payload,
    version_payload_v2,
)
from tests.layouts import new_layout

pytestmark = pytest.mark.integration

# What is sent live to a stopped node dead-letters soon: 3 attempts, each waiting up to ack_timeout_s for the link.
SHORT_SCHEDULE = {"retry_delays_s": (0.2, 0.4), "ack_timeout_s": 0.5}


@dataclass
class Trust:
    layout: MeshLayout
    mesh: LocalMesh
    attacker: Member  # node 2's real credentials, in the test's hands

    @property
    def n1(self) -> NodeSpec:
        return self.layout.node(1)

    @property
    def n3(self) -> NodeSpec:
        return self.layout.node(3)

    def id(self, i: int) -> str:
        return self.layout.node(i).agent_id


def links_up(spec: NodeSpec, *peers: str) -> bool:
    state = (health(spec) or {}).get("peers", {})
    return all(state.get(p) == "up" for p in peers)


def start(mesh: LocalMesh, *indices: int) -> None:
    """Start those of these nodes not running yet, and wait until each has its links to the others up."""
    stopped = [i for i in indices if i not in mesh.procs]
    if stopped:
        mesh.start(stopped, want_links=False)
    for i in indices:
        spec = mesh.layout.node(i)
        others = [mesh.layout.node(j).agent_id for j in indices if j != i]
        wait_for(lambda spec=spec, others=others: links_up(spec, *others), f"{spec.agent_id}'s links up")


@pytest.fixture(scope="module")
def trust(tmp_path_factory) -> Iterator[Trust]:
    """Nodes 1 and 3 running under ``configure_trust``'s policies; node 2 exists only as credentials,
    played by the test."""
    layout = new_layout(tmp_path_factory.mktemp("trust") / "mesh", 3, mcp_http=False)
    configure_trust(layout)
    mesh = LocalMesh(layout)
    try:
        start(mesh, 1, 3)
        yield Trust(layout, mesh, Member.of(layout, 2))
    finally:
        assert not (errors := stop_meshes([mesh])), errors


def settled(trust: Trust) -> None:
    """Wait until nodes 1 and 3 have each had everything they sent the other ACKed (an ACK means stored), so
    what an earlier test wrote on the shared mesh lands before a test reads rows to compare."""
    for spec, peer in ((trust.n1, trust.id(3)), (trust.n3, trust.id(1))):
        wait_for(lambda spec=spec, peer=peer: peer_row(spec, peer)["outbox_depth"] == 0,
                 f"{spec.agent_id}'s outbox to {peer} empty")


def assert_refused(victim: NodeSpec, by: Member, cases: dict[str, tuple[str | set[str], dict]]) -> None:
    """Send every case; each must be ACKed ``rejected:<code>`` (HTTP 200) and the victim's rows unchanged.

    All cases are sent before asserting, so one run reports every disagreement with the spec at once.
    """
    before = db_rows(victim)
    wrong = {}
    for name, (want, payload) in cases.items():
        answer = by.send(victim, payload)
        codes = {want} if isinstance(want, str) else want
        if answer.status != 200 or answer.ack is None or answer.code not in codes:
            wrong[name] = f"want 200 rejected:{'|'.join(sorted(codes))}, got {answer.status} " \
                          f"{answer.ack.reason if answer.ack else answer.error}"
    changed = diff(before, db_rows(victim))
    assert not wrong and not changed, {"wrong answers": wrong, "rows changed": changed}


def assert_accepted(answer: Answer) -> None:
    assert answer.status == 200 and answer.ack is not None and answer.ack.accepted, answer


def peer_row(spec: NodeSpec, peer: str) -> dict:
    """``spec``'s row for ``peer`` in ``ai-memory peers``."""
    return next(r for r in ok(spec, "peers") if r["agent_id"] == peer)


def stored_on(spec: NodeSpec, memory_id: str, timeout_s: float = 30.0) -> dict:
    return wait_for(lambda: memory_on(spec, memory_id), f"memory {memory_id} on {spec.agent_id}", timeout_s)


# ---------------------------------------------------------------- the signed memory version on the wire


def test_memory_put_is_signed_by_its_writer_over_the_canonical_version_payload(trust: Trust) -> None:
    mem = ok(trust.n1, "store", "signed at the origin", "--tag", "b", "--tag", "a", "--confidence", "1")
    secret = ok(trust.n1, "store", "only node 3 sees this", "--namespace", SECRET)
    items = trust.attacker.sync_all(trust.n1)
    put = next(i for i in items if i["kind"] == "memory.put" and i["memory"]["id"] == mem["id"])
    m = put["memory"]
    assert m["origin"] == m["writer"] == put["signed_by"] == trust.id(1), put
    assert isinstance(put["signature"], bytes) and len(put["signature"]) == 64, put
    # The spec's payload, written here independently of the product's helper.
    Member.of(trust.layout, 1).public_key.verify(put["signature"], version_payload(m))
    # A restricted memory carries who may see it, signed with the version (memory.put.v2, to a puller that reads
    # it); node 3 (in the list) is served it with that list. An older puller (node 2's request names no accepts)
    # is served only the unrestricted one, in the old form above.
    by_n3 = Member.of(trust.layout, 3).sync_all(trust.n1, accepts="memory.put.v2")
    put = next(i for i in by_n3 if i["kind"] == "memory.put.v2" and i["memory"]["id"] == secret["id"])
    Member.of(trust.layout, 1).public_key.verify(put["signature"], version_payload_v2(put["memory"]))
    # The origin's namespace peer list, with the origin itself: always a member.
    assert put["memory"]["share_with"] == sorted([trust.id(1), trust.id(3)]), put
    assert secret["id"] not in item_ids(items)


def test_product_signing_payload_equals_the_spec_payload() -> None:
    mem = new_memory("ai:x@t", tags=("b", "a"), confidence=1, title="t", content="c")
    payload = getattr(attest, "MemoryPayload", None)
    assert payload is not None, "node.attest.MemoryPayload (the memory version signing payload) is missing"
    assert payload.from_mapping(mem).canonical_bytes() == version_payload(mem)


# ---------------------------------------------------------------- origin is bound to the sender


def test_a_refused_memory_put_is_acked_rejected_on_both_routes(trust: Trust) -> None:
    """A refusal is an ACK with the stable code (HTTP 200 on POST), on the POST route and on the WebSocket
    node links use, and changes no row; which payloads are refused is tests/node/test_trust_on_apply.py's."""
    n2, n3 = trust.id(2), trust.id(3)
    settled(trust)
    assert_refused(trust.n1, trust.attacker, {
        "origin node 3, writer node 2, signed by node 2": ("writer_not_allowed", memory_put(
            new_memory(n3, writer=n2, content="node 2 writing a node 3 memory"), signer=trust.attacker)),
    })
    # The WebSocket (the route node links use) answers the same.
    before = db_rows(trust.n1)
    [ws] = trust.attacker.ws_session(trust.n1, [memory_put(new_memory(n3, writer=n2), signer=trust.attacker)])
    assert ws.ack is not None and ws.ack.reason == "rejected:writer_not_allowed", ws
    assert diff(before, db_rows(trust.n1)) == {}
    # Node 2 writing as itself is fine, signed or not (the sender is the writer).
    assert_accepted(trust.attacker.send(trust.n1, memory_put(new_memory(n2), signer=trust.attacker)))
    assert_accepted(trust.attacker.send(trust.n1, memory_put(new_memory(n2))))


# ---------------------------------------------------------------- what is served and pulled


def test_sync_skip_omits_the_items_of_the_named_writers(trust: Trust) -> None:
    from_n1 = ok(trust.n1, "store", "written by node 1")
    own = ok(trust.n3, "store", "written by node 3")
    stored_on(trust.n3, from_n1["id"])
    everything = item_ids(trust.attacker.sync_all(trust.n3, accepts="memory.put.v2"))
    assert {from_n1["id"], own["id"]} <= everything
    # skip is a comma-separated list of writers the puller is linked to directly.
    skipped = item_ids(trust.attacker.sync_all(trust.n3, skip=f"{trust.id(1)},ai:someone-else@testbed",
                                                  accepts="memory.put.v2"))
    assert own["id"] in skipped and from_n1["id"] not in skipped


def test_a_restriction_travels_with_the_memory_and_binds_a_node_without_the_policy(trust: Trust) -> None:
    """Node 3 has no namespace policy: it knows node 1's restriction only from the memory that reached it
    over the wire, and neither serves that memory to node 2 nor sends node 2 its link to it (the cases one by
    one: tests/node/test_trust_on_apply.py)."""
    secret = ok(trust.n1, "store", "restricted to node 3, sent to node 3", "--namespace", SECRET)
    stored_on(trust.n3, secret["id"])
    own = ok(trust.n3, "store", "node 3's own, linked to the restricted one")
    link = ok(trust.n3, "link", own["id"], secret["id"], "refers_to")
    items = trust.attacker.sync_all(trust.n3)
    assert own["id"] in item_ids(items) and secret["id"] not in item_ids(items)
    assert link["link_id"] not in link_ids(items)
    # Node 2 is down, so what node 3 sends it live waits in node 3's queue (or its dead letters).
    live = wait_for(lambda: (q := queued_for(trust.n3, trust.id(2))) and own["id"] in item_ids(q) and q,
                    "node 3's own memory queued for node 2")
    assert secret["id"] not in item_ids(live)
    assert link["link_id"] not in link_ids([p for p in live if p["kind"] == "link.put"])


def test_forgeries_served_by_a_peers_change_log_are_refused_like_pushed_ones(trust: Trust) -> None:
    """Node 1 pulls node 2's change log; node 2 (the test, on node 2's port and certificate) serves forgeries."""
    n2, n3 = trust.id(2), trust.id(3)
    attacker = trust.attacker
    created = ok(trust.n3, "store", "node 3's, to be forged through sync")
    secret = ok(trust.n1, "store", "hidden from node 2", "--namespace", SECRET)
    a = ok(trust.n3, "store", "link end a")
    b = ok(trust.n3, "store", "link end b")
    for m in (created, a, b):
        stored_on(trust.n1, m["id"])
    x = memory_on(trust.n1, created["id"])
    control = new_memory(n2, content="node 2's honest memory, served by sync")
    link = LinkPayload(src_id=a["id"], dst_id=b["id"], relation="supports", observed_by=n3,
                       valid_from=now_ms(), valid_until=None)
    puts = [
        memory_put(next_version(x, n2, content="forged"), signer=attacker),
        memory_put(next_version(x, n2, origin=n2, content="forged"), signer=attacker),
        memory_put(next_version(x, n3, content="forged"), signer=attacker.signing_as(n3)),
        memory_put(next_version(x, n3, content="forged", updated_at=now_ms() + TEN_YEARS_MS)),
        memory_put(new_memory(n3, content="node 3 never wrote this")),
        memory_put(new_memory(n2, updated_at=now_ms() + TEN_YEARS_MS), signer=attacker),
        memory_put(new_memory(n2, content="x" * 200 * 1024), signer=attacker),
        memory_put(new_memory(n2, version=INT64_MAX), signer=attacker),
        memory_put(new_memory(n2, namespace=SECRET), signer=attacker),
        memory_put({**new_memory(n2, content="moved out"), "id": secret["id"]}, signer=attacker),
        memory_put(control, signer=attacker),
        {"kind": "link.put", "link": {**link.to_dict(), "confidence": 0.01},
         "signature": attest.sign(Member.of(trust.layout, 3).private_key, link), "signed_by": n3},
    ]
    settled(trust)
    before = db_rows(trust.n1)
    with PeerServer(attacker, trust.layout.node(2), [{"seq": i, **p} for i, p in enumerate(puts, 1)]) as server:
        wait_for(lambda: peer_row(trust.n1, n2)["last_sync_seq"] >= server.last_seq,
                 "node 1 to pull node 2's change log to its end")
    changed = diff(before, db_rows(trust.n1))
    assert set(changed) <= {"memories", "memory_links", "change_log"}, changed
    assert not any(t.get("removed") for t in changed.values()), changed
    assert [r[0] for r in changed["memories"]["added"]] == [control["id"]], changed["memories"]
    assert [r[0] for r in changed["memory_links"]["added"]] == [link.link_id], changed["memory_links"]
    row = links_on(trust.n1)[link.link_id]
    assert row["confidence"] is None and row["attest_level"] == "peer_attested", row
    assert memory_on(trust.n1, created["id"]) == x
    assert peer_row(trust.n1, n2)["parked"] == 0


# ---------------------------------------------------------------- the sync route


def test_sync_bounds_are_400_with_a_json_error(trust: Trust) -> None:
    wrong = {}
    for query in ({"since": 2**63}, {"since": -1}, {"limit": 0}, {"limit": 10**9}, {"limit": 10_001},
                  {"since": "abc"}, {"limit": "1.5"}, {"since": "1e3"}, {"since": ""}, {"limit": -5}, {"mine": 2},
                  {"mine": "yes"}):
        answer = trust.attacker.sync(trust.n1, **query)
        if answer.status != 400 or answer.code != "bad_input" or not answer.error["error"].get("message"):
            wrong[repr(query)] = (answer.status, answer.error or answer.page)
    assert not wrong, wrong
    for query in ({"since": INT64_MAX}, {"since": 0, "limit": 10_000}, {"since": 0, "limit": 1}, {"mine": 1}):
        answer = trust.attacker.sync(trust.n1, **query)
        assert answer.status == 200 and answer.page is not None, (query, answer)
    assert trust.attacker.sync(trust.n1, since=INT64_MAX).page["items"] == []


def test_sync_pages_past_the_peers_request_budget_are_429_and_the_next_page_comes_later(mesh_factory) -> None:
    mesh = mesh_factory(3, mcp_http=False)
    n1 = mesh.layout.node(1)
    add_config(n1, "limits", peer_requests_per_second=1)
    start(mesh, 1)
    for i in range(3):
        ok(n1, "store", f"node 1's memory {i}")
    peer = Member.of(mesh.layout, 2)
    before = db_rows(n1)
    first = peer.sync(n1, since=0, limit=500)
    # A budget of one change a second gives a page of one, with more to come.
    assert first.status == 200 and len(first.page["items"]) == 1 and first.page["more"], first
    refused = peer.sync(n1, since=first.page["next"], limit=500)
    assert (refused.status, refused.code) == (429, "rate_limited"), refused
    assert "retry in" in refused.error["error"]["message"]
    later = wait_for(lambda: (a := peer.sync(n1, since=first.page["next"], limit=500)).status == 200 and a,
                     "the next page once the budget refills", timeout_s=10.0)
    assert len(later.page["items"]) == 1 and later.page["items"][0]["seq"] > first.page["items"][0]["seq"]
    assert diff(before, db_rows(n1)) == {}


# ---------------------------------------------------------------- membership


def test_a_mesh_ca_certificate_without_a_pub_is_not_a_member(mesh_factory, tmp_path, node_log) -> None:
    mesh = mesh_factory(3, mcp_http=False)
    n1, n3 = mesh.layout.node(1), mesh.layout.node(3)
    (n1.home / "peers" / f"{n3.agent_id}.pub").unlink()  # configured in [[mesh.peers]], but no .pub
    start(mesh, 1)
    outsider = Member.outsider(mesh.layout, tmp_path / "outsider", "ai:outsider@testbed")
    for who in (outsider, Member.of(mesh.layout, 3)):
        ping = who.send(n1, {"kind": "ping"})
        assert (ping.status, ping.code) == (403, "not_a_member"), (who.agent_id, ping)
        sync = who.sync(n1, since=0)
        assert (sync.status, sync.code) == (403, "not_a_member"), (who.agent_id, sync)
        assert who.ws_ping(n1).status == 403, who.agent_id
        put = who.send(n1, memory_put(new_memory(who.agent_id)))
        assert (put.status, put.code) == (403, "not_a_member"), (who.agent_id, put)
    assert node_log.has(n1, "peer_without_pub") and any(
        e.get("event") == "peer_without_pub" and n3.agent_id in str(e.values()) for e in node_log(n1))
    assert not any(e.get("event") == "peer_without_pub" and mesh.layout.node(2).agent_id in str(e.values())
                   for e in node_log(n1))
    assert db_rows(n1)["memories"] == []
    # A member with its .pub is served on every route.
    member = Member.of(mesh.layout, 2)
    assert_accepted(member.send(n1, {"kind": "ping"}))
    assert member.sync(n1, since=0).status == 200
    assert member.ws_ping(n1).ack.accepted


def test_a_configured_peer_without_a_pub_cannot_write_through_the_pull_either(mesh_factory) -> None:
    """Under trust = "pinned" node 3 (in [[mesh.peers]], no .pub) is refused on every inbound route; what node 1
    pulls from node 3's change log is the same data arriving by another door."""
    mesh = mesh_factory(3, mcp_http=False)
    n1, n2, n3 = mesh.layout.nodes
    (n1.home / "peers" / f"{n3.agent_id}.pub").unlink()
    add_config(n1, "federation", sync_interval_s=1.0)  # node 1 pulls its peers every second
    start(mesh, 1)
    member, outsider = Member.of(mesh.layout, 2), Member.of(mesh.layout, 3)
    good = new_memory(member.agent_id, content="served by a member")
    bad = new_memory(outsider.agent_id, content="served by a peer that is not a member")
    with PeerServer(member, n2, [{"seq": 1, **memory_put(good, signer=member)}]) as server2, \
            PeerServer(outsider, n3, [{"seq": 1, **memory_put(bad)}]) as server3:
        stored_on(n1, good["id"])  # node 1 pulls its members
        # Node 1 does not dial a peer without a .pub at all, so it neither sends to it nor pulls from it;
        # had it pulled, what it pulled would have had to be refused. Two more rounds of pulls from node 2
        # bound the wait for a pull from node 3.
        poll(lambda: server3.sync_requests or len(server2.sync_requests) >= 3, timeout_s=10)
        if server3.sync_requests:
            poll(lambda: memory_on(n1, bad["id"]) or peer_row(n1, n3.agent_id)["last_sync_seq"] >= 1, 10)
        assert not server3.ws_peers and peer_row(n1, n3.agent_id)["link_state"] != "up"
    assert memory_on(n1, bad["id"]) is None, server3.sync_requests


def test_removing_a_members_pub_also_cuts_its_open_websocket(mesh_factory) -> None:
    """Membership is read again when peers/ changes; a member removed must not keep writing over the
    WebSocket it opened before (node links are long-lived, so it might never reconnect)."""
    mesh = mesh_factory(2, mcp_http=False)
    n1 = mesh.layout.node(1)
    start(mesh, 1)
    member = Member.of(mesh.layout, 2)
    mem = new_memory(member.agent_id, content="written after removal")

    def remove_its_pub() -> None:
        (n1.home / "peers" / f"{member.agent_id}.pub").unlink()
        wait_for(lambda: member.sync(n1, since=0).code == "not_a_member", "node 1 to refuse new requests")

    before, after = member.ws_session(n1, [{"kind": "ping"}, remove_its_pub, memory_put(mem, signer=member)])
    assert before.ack.accepted
    assert not (after.ack and after.ack.accepted), after
    assert memory_on(n1, mem["id"]) is None


def test_trust_ca_accepts_any_mesh_ca_certificate(mesh_factory, tmp_path) -> None:
    mesh = mesh_factory(2, mcp_http=False)
    n1 = mesh.layout.node(1)
    add_config(n1, "mesh", trust="ca")
    start(mesh, 1)
    outsider = Member.outsider(mesh.layout, tmp_path / "outsider", "ai:outsider@testbed")
    assert_accepted(outsider.send(n1, {"kind": "ping"}))
    sync = outsider.sync(n1, since=0)
    assert sync.status == 200 and sync.page is not None, sync
    assert outsider.ws_ping(n1).ack.accepted
    # Its own memory, unsigned (its key is unknown here) and sent by itself, is stored as unsigned.
    mem = new_memory(outsider.agent_id, content="from an outsider")
    assert_accepted(outsider.send(n1, memory_put(mem)))
    assert memory_on(n1, mem["id"])["content"] == "from an outsider"


# ---------------------------------------------------------------- three nodes: the origin's next version wins


def test_forged_versions_lose_to_the_origins_next_version_everywhere(mesh_factory) -> None:
    mesh = mesh_factory(3, mcp_http=False)
    start(mesh, 1, 2, 3)
    nodes = mesh.layout.nodes
    n1, n2, n3 = nodes
    attacker = Member.of(mesh.layout, 2)
    fake3 = attacker.signing_as(n3.agent_id)
    created = ok(n3, "store", "node 3's memory")
    for spec in nodes:
        stored_on(spec, created["id"])
    stored = memory_on(n1, created["id"])
    far = now_ms() + TEN_YEARS_MS
    forgeries = {
        "writer node 2, signed by node 2": ("writer_not_allowed", memory_put(
            next_version(stored, n2.agent_id, content="forged 1"), signer=attacker)),
        "signed_by node 3, bad signature": ("bad_signature", memory_put(
            next_version(stored, n3.agent_id, content="forged 2"), signer=fake3)),
        "writer node 2, ten years ahead": ({"writer_not_allowed", "clock_skew"}, memory_put(
            next_version(stored, n2.agent_id, content="forged 3", updated_at=far), signer=attacker)),
        "signed_by node 3, ten years ahead, bad signature": ({"bad_signature", "clock_skew"}, memory_put(
            next_version(stored, n3.agent_id, content="forged 4", updated_at=far), signer=fake3)),
        "node 2 as the origin": ("origin_mismatch", memory_put(
            next_version(stored, n2.agent_id, origin=n2.agent_id, content="forged 5"), signer=attacker)),
    }
    for victim in (n1, n3):
        assert_refused(victim, attacker, forgeries)
    honest = ok(n3, "update", created["id"], "--content", "node 3's honest version 2")

    def everywhere() -> bool:
        return all((memory_on(s, created["id"]) or {}).get("content") == honest["content"] for s in nodes)

    wait_for(everywhere, "node 3's version 2 on every node")
    # Node 3 restarts and pulls both peers' change logs to their end: nothing brings a forgery back.
    mesh.stop(3)
    mesh.start([3], want_links=False)

    def pulled_to_the_end() -> bool:
        return all(peer_row(n3, p.agent_id)["last_sync_seq"] >= change_log_seq(p) for p in (n1, n2))

    wait_for(pulled_to_the_end, "node 3 to pull nodes 1 and 2 to the end of their change logs")
    for spec in nodes:
        got = memory_on(spec, created["id"])
        assert (got["version"], got["content"], got["origin"]) == (2, honest["content"], n3.agent_id), \
            (spec.agent_id, got)
        assert got.get("writer", n3.agent_id) == n3.agent_id, got
    served = {i["memory"]["content"] for i in attacker.sync_all(n1, accepts="memory.put.v2")
              if i["kind"] == "memory.put.v2" and i["memory"]["id"] == created["id"]}
    assert served == {honest["content"]}, served


# ---------------------------------------------------------------- catch-up past an unshared link


def test_a_link_to_an_unshared_memory_does_not_stall_catch_up(mesh_factory) -> None:
    mesh = mesh_factory(3, mcp_http=False, a2a=SHORT_SCHEDULE)
    n1, n2, n3 = mesh.layout.nodes
    add_config(n1, f'federation.namespaces."{SECRET}"', peers=[n3.agent_id])
    # Small pages on the puller: an item it cannot apply would hold the cursor before everything later.
    add_config(n2, "federation", sync_page_limit=2, orphan_hold_s=0.2)
    start(mesh, 1, 2)
    mesh.stop(2)
    shared = ok(n1, "store", "shared with node 2")
    secret = ok(n1, "store", "not shared with node 2", "--namespace", SECRET)
    unshared_link = ok(n1, "link", shared["id"], secret["id"], "refers_to")
    later = [ok(n1, "store", f"later {i}")["id"] for i in range(6)]
    later_links = [ok(n1, "link", shared["id"], m, "precedes")["link_id"] for m in later[:2]]
    later.append(ok(n1, "store", "last")["id"])

    # Everything live to node 2 has run out of retries: what it gets now, it gets through sync.
    wait_for(lambda: peer_row(n1, n2.agent_id)["outbox_depth"] == 0, "node 1's outbox to node 2 dead-lettered")
    start(mesh, 1, 2)
    wait_for(lambda: all(memory_on(n2, m) for m in [shared["id"], *later]), "every later memory on node 2")
    wait_for(lambda: set(later_links) <= set(links_on(n2)), "the later links on node 2")
    assert memory_on(n2, secret["id"]) is None
    assert unshared_link["link_id"] not in links_on(n2)
    items = Member.of(mesh.layout, 2).sync_all(n1)
    assert unshared_link["link_id"] not in link_ids(items)
    assert secret["id"] not in item_ids(items)


def test_an_item_the_puller_cannot_apply_is_parked_and_the_cursor_moves_on(mesh_factory) -> None:
    mesh = mesh_factory(2, mcp_http=False, a2a=SHORT_SCHEDULE)
    n1, n2 = mesh.layout.nodes
    # Node 2 keeps smaller memories than node 1: node 1's big memory never lands there, so the link to it
    # can never be applied on node 2 (unknown_memory, retryable) although node 2 may see both its ends.
    add_config(n2, "limits", max_content_bytes=100)
    add_config(n2, "federation", sync_page_limit=2, sync_interval_s=0.3, orphan_hold_s=0.1)
    start(mesh, 1, 2)
    mesh.stop(2)
    small = ok(n1, "store", "small")
    big = ok(n1, "store", "b" * 200)
    stuck = ok(n1, "link", small["id"], big["id"], "refers_to")
    later = [ok(n1, "store", f"later {i}")["id"] for i in range(4)]
    wait_for(lambda: peer_row(n1, n2.agent_id)["outbox_depth"] == 0, "node 1's outbox to node 2 dead-lettered")
    start(mesh, 1, 2)
    wait_for(lambda: all(memory_on(n2, m) for m in [small["id"], *later]), "every later memory on node 2")
    row = wait_for(lambda: (r := peer_row(n2, n1.agent_id))["parked"] and r, "the link parked on node 2")
    assert row["parked"] == 1 and row["last_sync_seq"] >= change_log_seq(n1), row
    assert memory_on(n2, big["id"]) is None and stuck["link_id"] not in links_on(n2)
