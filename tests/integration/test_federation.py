"""Three real node processes: replication, peer attestation, forged links, catch-up, quorum writes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a import new_envelope
from mesh import peerkeys, tls
from mesh.link import post_envelope
from node import attest
from node.attest import LinkPayload
from testbed.mesh import LocalMesh, MeshLayout, NodeSpec
from tests.integration.conftest import maybe, ok, run_cli, spawn_cli, stop_meshes, wait_for
from tests.layouts import new_layout

pytestmark = pytest.mark.integration

def link_on(spec: NodeSpec, link_id: str) -> dict | None:
    rows = ok(spec, "links", "--limit", "100")
    return next((r for r in rows if r["link_id"] == link_id), None)


def dump(spec: NodeSpec) -> tuple[set, set]:
    mems = ok(spec, "list", "--limit", "100")
    links = ok(spec, "links", "--limit", "100")
    return ({(m["id"], m["version"], m["content"]) for m in mems},
            {(r["link_id"], r["relation"], r["observed_by"]) for r in links})


def trust_ca_alone(spec: NodeSpec) -> None:
    """Opt ``spec``'s node into `mesh.trust = "ca"`: peers without a .pub may connect (their writes unsigned)."""
    config = spec.home / "config.toml"
    text = config.read_text()
    assert "\n[mesh]\n" in text
    config.write_text(text.replace("\n[mesh]\n", '\n[mesh]\ntrust = "ca"\n', 1))


@pytest.fixture
def mesh3(tmp_path: Path):
    layouts: list[LocalMesh] = []

    def make(**kwargs) -> tuple[MeshLayout, LocalMesh]:
        layout = new_layout(tmp_path / f"mesh{len(layouts)}", 3, mcp_http=False, **kwargs)
        m = LocalMesh(layout)
        layouts.append(m)
        return layout, m

    yield make
    assert not (errors := stop_meshes(layouts)), errors


def test_store_replicates_and_link_is_peer_attested_on_every_peer(mesh3) -> None:
    layout, m = mesh3()
    a, b, c = layout.nodes
    (a.home / "peers" / f"{a.agent_id}.pub").unlink(missing_ok=True)
    (c.home / "peers" / f"{a.agent_id}.pub").unlink()  # C does not trust A's key,
    trust_ca_alone(c)                                  # but takes A on the mesh CA's word
    m.start()
    # Written by the CLI as a program of its own beside the running node: the node's poll sends them.
    m1 = spawn_cli(a, "store", "first memory from A")[1]
    m2 = spawn_cli(a, "store", "second memory from A")[1]
    for spec in (b, c):
        wait_for(lambda spec=spec: maybe(spec, "get", m2["id"]), f"memory on {spec.agent_id}")
    link = ok(a, "link", m1["id"], m2["id"], "related_to")
    assert link["attest_level"] == "self_signed"
    on_b = wait_for(lambda: link_on(b, link["link_id"]), "link on B")
    assert on_b["attest_level"] == "peer_attested" and on_b["received_from"] == a.agent_id
    verified = ok(b, "verify", link["link_id"])
    assert verified["signature_verified"] is True
    on_c = wait_for(lambda: link_on(c, link["link_id"]), "link on C")
    assert on_c["attest_level"] == "unsigned"
    rc, out, _ = run_cli(c, "verify", link["link_id"])
    assert rc == 3 and out["signature_verified"] is False


def test_forged_link_injected_on_the_wire_is_rejected_and_absent(mesh3) -> None:
    layout, m = mesh3()
    a, b, c = layout.nodes
    m.start()
    m1 = ok(a, "store", "x")
    m2 = ok(a, "store", "y")
    wait_for(lambda: maybe(b, "get", m2["id"]), "memories on B")
    payload = LinkPayload(src_id=m1["id"], dst_id=m2["id"], relation="contradicts", observed_by=a.agent_id,
                          valid_from=int(time.time() * 1000), valid_until=None)
    forged = attest.sign(Ed25519PrivateKey.generate(), payload)
    body = {"kind": "link.put", "link": payload.to_dict(), "signature": forged, "signed_by": a.agent_id}
    # Injected by node C, a legitimate peer of B, over C's own mTLS identity.
    env = new_envelope(c.agent_id, [b.agent_id], body, int(time.time() * 1000), 60_000)
    ctx = tls.client_context(c.home / "tls" / "node.crt", c.home / "keys" / f"{c.agent_id}.priv",
                             c.home / "tls" / "ca.crt")
    pinned = peerkeys.load_peer_keys(c.home / "peers").keys
    status, ack, err = asyncio.run(post_envelope(b.url, env, ctx, expected_agent_id=b.agent_id, pinned=pinned,
                                                 timeout_s=10.0, max_bytes=1 << 20))
    assert status == 200 and ack is not None and ack.reason == "rejected:bad_signature"
    assert link_on(b, payload.link_id) is None
    assert "bad_signature" in (b.home / "node.log").read_text()


def test_node_down_through_whole_retry_schedule_catches_up(mesh3) -> None:
    # Each of the 3 attempts to a down peer waits up to ack_timeout_s for its link: kept short.
    layout, m = mesh3(a2a={"retry_delays_s": (0.2, 0.4), "ack_timeout_s": 0.5},
                      extra_config="[federation]\norphan_hold_s = 0.5\n")
    a, b, c = layout.nodes
    m.start()
    m.stop(3)
    ids = [ok(a, "store", f"memory {i} while C is down")["id"] for i in range(10)]
    links = [ok(a, "link", ids[i], ids[i + 1], "next")["link_id"] for i in range(5)]
    wait_for(lambda: len(ok(a, "a2a", "dead-letters")) == 15, "A's messages to C dead-lettered")
    m.start([3])
    wait_for(lambda: dump(c) == dump(a), "C converged with A")
    mems, got_links = dump(c)
    assert len(mems) == 10 and len(got_links) == 5
    assert {row[0] for row in got_links} == set(links)
    assert all(link_on(c, lid)["attest_level"] == "peer_attested" for lid in links)
    wait_for(lambda: ok(a, "a2a", "dead-letters") == [], "dead letters to C cleared after its catch-up")


def test_majority_quorum_succeeds_with_one_down_and_fails_with_two_down(mesh3) -> None:
    layout, m = mesh3(extra_config='[federation]\nwrite_quorum = "majority"\nquorum_timeout_s = 2.0\n')
    a, b, c = layout.nodes
    m.start()
    m.stop(3)
    stored = ok(a, "store", "needs two of three")
    assert stored["acked_nodes"] >= 2
    m.stop(2)
    rc, _, err = run_cli(a, "store", "cannot reach two of three")
    assert rc == 1 and "quorum_not_reached" in err and "1 of 2" in err
    m.start([2, 3], want_links=False)
    wait_for(lambda: len(ok(c, "list")) == 2, "the failed-quorum write still replicates")


def test_update_replicates_as_a_new_version_everywhere(mesh3) -> None:
    layout, m = mesh3()
    a, b, c = layout.nodes
    m.start()
    mem = ok(a, "store", "version one")
    wait_for(lambda: maybe(c, "get", mem["id"]), "v1 on C")
    # Only the memory's creator writes its versions unless its namespace names other writers.
    rc, _, err = run_cli(b, "update", mem["id"], "--content", "version two from B")
    assert rc == 1 and "writer_not_allowed" in err
    ok(a, "update", mem["id"], "--content", "version two from A")
    for spec in (b, c):
        wait_for(lambda spec=spec: (maybe(spec, "get", mem["id"]) or {}).get("version") == 2, "v2")
        got = ok(spec, "get", mem["id"])
        assert got["content"] == "version two from A" and got["writer"] == a.agent_id
        assert got["origin"] == a.agent_id and got["attest_level"] == "peer_attested"
        assert ok(spec, "verify", mem["id"])["signature_verified"] is True
