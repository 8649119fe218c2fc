"""The sharing list signed with the memory version (issue 32, item 3) on real node processes and mTLS sockets.

Node 1 restricts ``secret`` to node 2 and itself; node 3 has no namespace policy (it learns restrictions from the
data). Node 2 is the test, playing a member from docs/protocol.md with node 2's real key and certificate: a relay
that legitimately holds node 1's restricted memory and passes it to node 3 with the list stripped or changed, and an
older node that does not read memory.put.v2.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from testbed.mesh import LocalMesh, MeshLayout, NodeSpec, build_layout, health
from tests.integration.conftest import node_log_events, wait_for
from tests.integration.peer_play import (
    Member,
    add_config,
    db_rows,
    memory_on,
    memory_put,
    memory_put_v2,
    new_memory,
    ok,
    queued_for,
    version_payload,
    version_payload_v2,
)

pytestmark = pytest.mark.integration

SECRET = "secret"  # on node 1: node 2 and node 1 only
V2 = "memory.put.v2"


@dataclass
class Sharing:
    layout: MeshLayout
    relay: Member  # node 2's credentials, in the test's hands

    @property
    def n1(self) -> NodeSpec:
        return self.layout.node(1)

    @property
    def n3(self) -> NodeSpec:
        return self.layout.node(3)

    def id(self, i: int) -> str:
        return self.layout.node(i).agent_id


@pytest.fixture(scope="module")
def sharing(tmp_path_factory) -> Iterator[Sharing]:
    layout = build_layout(tmp_path_factory.mktemp("sharing") / "mesh", 3, mcp_http=False)
    add_config(layout.node(1), f'federation.namespaces."{SECRET}"', peers=[layout.node(2).agent_id])
    mesh = LocalMesh(layout)
    try:
        mesh.start([1, 3], want_links=False)
        n1, n3 = layout.node(1), layout.node(3)
        wait_for(lambda: (health(n1) or {}).get("peers", {}).get(n3.agent_id) == "up", "node 1's link to node 3")
        wait_for(lambda: (health(n3) or {}).get("peers", {}).get(n1.agent_id) == "up", "node 3's link to node 1")
        yield Sharing(layout, Member.of(layout, 2))
    finally:
        mesh.stop_all()


def served(by: Member, spec: NodeSpec, **query: str) -> dict[str, dict]:
    """Every memory version ``spec`` serves ``by``, by id (the last item for each)."""
    return {i["memory"]["id"]: i for i in by.sync_all(spec, **query) if i["kind"] in ("memory.put", V2)}


def test_a_relay_that_strips_or_alters_a_restricted_memorys_list_is_refused(sharing: Sharing) -> None:
    n1, n2, n3 = sharing.id(1), sharing.id(2), sharing.id(3)
    secret = ok(sharing.n1, "store", "for node 2's eyes", "--namespace", SECRET)
    # Node 2 reads memory.put.v2 (as its sync request says), so node 1 serves it the signed list.
    item = served(sharing.relay, sharing.n1, accepts=V2)[secret["id"]]
    assert item["kind"] == V2 and item["memory"]["share_with"] == sorted([n1, n2]), item
    Member.of(sharing.layout, 1).public_key.verify(item["signature"], version_payload_v2(item["memory"]))
    mem = {k: v for k, v in item["memory"].items() if k != "share_with"}
    sig = item["signature"]
    cases = {
        "list stripped to null": ("bad_signature", memory_put_v2(mem, None, signature=sig)),
        "node 3 added to the list": ("bad_signature", memory_put_v2(mem, sorted([n1, n2, n3]), signature=sig)),
        "old memory.put without the list": ("bad_signature", memory_put(mem, signed_by=n1, signature=sig)),
        "old memory.put with the list beside it": ("share_with_unsigned",
                                                   memory_put(mem, signed_by=n1, signature=sig,
                                                              share_with=sorted([n1, n2]))),
        "list stripped with the signature": ("unverified_relay", memory_put_v2(mem, None)),
    }
    before = db_rows(sharing.n3)
    got = {name: sharing.relay.send(sharing.n3, payload) for name, (_, payload) in cases.items()}
    assert {name: (a.status, a.code) for name, a in got.items()} == {name: (200, code)
                                                                     for name, (code, _) in cases.items()}
    assert db_rows(sharing.n3) == before
    assert memory_on(sharing.n3, secret["id"]) is None
    # Relayed as signed, node 3 keeps the restriction and serves the memory to no one outside the list.
    answer = sharing.relay.send(sharing.n3, memory_put_v2(mem, sorted([n1, n2]), signature=sig))
    assert answer.status == 200 and answer.ack is not None and answer.ack.accepted, answer
    stored = ok(sharing.n3, "get", secret["id"])
    assert (stored["share_with"], stored["signed_set"], stored["attest_level"]) == (sorted([n1, n2]), 2,
                                                                                    "peer_attested")


def test_an_older_peer_gets_no_restricted_memory_and_unrestricted_ones_signed_the_old_way(sharing: Sharing) -> None:
    n1, n2 = sharing.id(1), sharing.id(2)
    secret = ok(sharing.n1, "store", "restricted, node 2 has not upgraded", "--namespace", SECRET)
    public = ok(sharing.n1, "store", "for everyone")
    # As an older node pulls (no accepts in its request): the restricted memory is left out, the unrestricted one
    # comes as memory.put signed over the old fields (the spec's memory.version payload).
    old = served(sharing.relay, sharing.n1)
    assert secret["id"] not in old
    put = old[public["id"]]
    assert put["kind"] == "memory.put" and "share_with" not in put and "share_with" not in put["memory"], put
    Member.of(sharing.layout, 1).public_key.verify(put["signature"], version_payload(put["memory"]))
    # Live: node 1 never heard node 2 say it reads memory.put.v2 (node 2 is not running), so its queue for node 2
    # holds the public memory and not the restricted one, and node 1 said why, once.
    live = {p["memory"]["id"]: p["kind"] for p in queued_for(sharing.n1, n2) if "memory" in p}
    assert live.get(public["id"]) == "memory.put" and secret["id"] not in live, live
    withheld = [e for e in node_log_events(sharing.n1) if e.get("event") == "memory_withheld" and e.get("peer") == n2]
    assert len(withheld) == 1 and withheld[0]["reason"] == "peer_must_upgrade", withheld
    # Once node 2 says it reads memory.put.v2, it is served the restricted memory with its signed list.
    item = served(sharing.relay, sharing.n1, accepts=V2)[secret["id"]]
    assert item["kind"] == V2 and item["memory"]["share_with"] == sorted([n1, n2])


def test_an_older_node_sending_its_list_outside_the_signature_is_told_to_upgrade(sharing: Sharing) -> None:
    n1, n2 = sharing.id(1), sharing.id(2)
    mine = new_memory(n2, namespace=SECRET, content="node 2's, written before it upgraded")
    answer = sharing.relay.send(sharing.n1, memory_put(mine, signer=sharing.relay, share_with=sorted([n1, n2])))
    assert (answer.status, answer.code) == (200, "share_with_unsigned"), answer
    assert memory_on(sharing.n1, mine["id"]) is None


def test_a_sync_request_names_at_most_16_kinds_it_reads(sharing: Sharing) -> None:
    answer = sharing.relay.sync(sharing.n1, since=0, limit=1, accepts=",".join(f"k{i}" for i in range(17)))
    assert (answer.status, answer.code) == (400, "bad_input"), answer
    answer = sharing.relay.sync(sharing.n1, since=0, limit=1, accepts="x" * 65)
    assert (answer.status, answer.code) == (400, "bad_input"), answer
    # Kinds a node does not know are simply not ones it sends.
    assert sharing.relay.sync(sharing.n1, since=0, limit=1, accepts="some.future.kind").status == 200
