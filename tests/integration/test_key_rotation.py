"""Key rotation between real `ai-memory serve` processes: a rotated node learns why its peers refuse it,
and an import on the peer (which keeps the old key in its keyring) lets it back in."""

from __future__ import annotations

import asyncio

import pytest

from mesh import ca, keys, peerkeys
from node.config import LimitsConfig
from node.mcp.socket import SocketClientBackend
from testbed.mesh import health

pytestmark = pytest.mark.integration


def _rotate(cli, spec, ca_dir):
    rc, out, err = cli(spec, "identity", "rotate", "--ca", str(ca_dir))
    assert rc == 0, err
    return out


async def _live_peer_row(spec, peer_agent_id: str) -> dict:
    """The running node's own view of a peer (memory_peers over its local socket)."""
    client = await SocketClientBackend.connect(spec.home / "run" / "node.sock", limits=LimitsConfig())
    try:
        rows = await client.call("memory_peers", {})
    finally:
        await client.close()
    return next(r for r in rows if r["agent_id"] == peer_agent_id)


def test_a_rotated_node_whose_peer_pins_the_old_key_is_told_peer_key_mismatch(mesh_factory, cli, node_log,
                                                                            wait_for):
    mesh = mesh_factory(2)
    mesh.start()
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    old_fp = keys.load_identity(n1.home / "keys", n1.agent_id).fingerprint
    # History signed with the old key, replicated to node 2 before the rotation.
    m1, m2, link = _signed_history(cli, n1, n2, wait_for)

    mesh.stop(1)
    out = _rotate(cli, n1, mesh.layout.root / "ca")
    assert out["retired_fingerprint"] == old_fp and out["certificate"]
    new_fp = out["fingerprint"]
    mesh.start([1], want_links=False)

    # Node 1 dials node 2, which still pins the old key: a 403 whose reason node 1 reports.
    def refused_line():
        return [e for e in node_log(n1) if e.get("event") == "link_down" and e.get("peer") == n2.agent_id
                and e.get("code") == "peer_key_mismatch"]
    (line, *_) = wait_for(refused_line, "node 1 to log link_down with the peer's peer_key_mismatch", timeout_s=30)
    assert line["level"] == "warning"
    assert line["error"].startswith(f"peer_key_mismatch: {n2.agent_id} refused this node (HTTP 403): ")
    assert new_fp in line["error"] and old_fp in line["error"]  # the key it showed, and the one pinned there
    row = asyncio.run(_live_peer_row(n1, n2.agent_id))
    assert row["link_state"] != "up"
    assert row["last_error"].startswith("peer_key_mismatch: ")
    # The other direction: node 2's own pin check refuses node 1's server certificate. Its link to node 1
    # went down when node 1 stopped, so the new reason comes as link_still_down within that outage.
    wait_for(lambda: node_log.has(n2, "link_still_down", peer=n1.agent_id, code="peer_key_mismatch"),
             "node 2 to log the new reason, peer_key_mismatch, for its link to node 1", timeout_s=30)

    # Node 2's operator imports the new .pub: the old one moves to its keyring and the links come back.
    rc, text, err = cli(n2, "identity", "import", str(n1.home / "keys" / f"{n1.agent_id}.pub"), json=False)
    assert rc == 0, err
    assert f"previous key {old_fp} is kept in" in text
    kept = n2.home / "peers" / "retired" / f"{n1.agent_id}.{old_fp}.pub"
    assert kept.exists()
    assert [keys.fingerprint(k) for k in peerkeys.load_peer_keyrings(n2.home / "peers")[n1.agent_id]] == \
        [new_fp, old_fp]
    wait_for(lambda: (health(n1) or {}).get("peers", {}).get(n2.agent_id) == "up"
             and (health(n2) or {}).get("peers", {}).get(n1.agent_id) == "up",
             "both links up after the import", timeout_s=30)
    wait_for(lambda: node_log.has(n1, "link_up", peer=n2.agent_id, recovered=True),
             "node 1 to log the recovery", timeout_s=10)
    assert asyncio.run(_live_peer_row(n1, n2.agent_id))["last_error"] is None

    # The rotated node's certificate, reissued by `identity rotate`, is over the new key.
    cert = ca.load_cert(n1.home / "tls" / "node.crt")
    assert keys.fingerprint(cert.public_key()) == new_fp

    # What the old key signed keeps verifying: on node 2 with its keyring, on node 1 with its own.
    for spec in (n1, n2):
        for signed in (link["link_id"], m1["id"], m2["id"]):
            rc, out, err = cli(spec, "verify", signed)
            assert rc == 0 and out["signature_verified"] is True, (spec.agent_id, signed, out, err)
    # And what the new key signs verifies too.
    m3 = _ok(cli, n1, "store", "stored after the rotation")
    wait_for(lambda: cli(n2, "get", m3["id"])[0] == 0, "the new memory on node 2", timeout_s=30)
    rc, out, err = cli(n2, "verify", m3["id"])
    assert rc == 0 and out["signature_verified"] is True, (out, err)


def _ok(cli, spec, *args):
    rc, out, err = cli(spec, *args)
    assert rc == 0, f"{args} -> {rc}: {err}"
    return out


def _signed_history(cli, n1, n2, wait_for):
    m1 = _ok(cli, n1, "store", "first memory, signed with the old key")
    m2 = _ok(cli, n1, "store", "second memory, signed with the old key")
    link = _ok(cli, n1, "link", m1["id"], m2["id"], "related_to")

    def link_on_n2():
        rows = _ok(cli, n2, "links", "--limit", "100")
        return next((r for r in rows if r["link_id"] == link["link_id"]), None)
    assert wait_for(link_on_n2, "the link on node 2", timeout_s=30)["attest_level"] == "peer_attested"
    for spec in (n1, n2):
        rc, out, err = cli(spec, "verify", link["link_id"])
        assert rc == 0 and out["signature_verified"] is True, err
    return m1, m2, link
