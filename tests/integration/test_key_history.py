"""Key history between real `ai-memory serve` processes: a node rotates its key, a node that joins later (given
only the new .pub) parks what the old key signed as unknown_key, shows it, and applies it, peer_attested, once
the rotated node's key history is imported, without a restart."""

from __future__ import annotations

import re
import urllib.request

import pytest

from mesh import keyhistory
from testbed.mesh import NodeSpec
from tests.integration.conftest import ok

pytestmark = pytest.mark.integration

SYNC_EVERY = "[federation]\nsync_interval_s = 1.0\n"


def _peer_block(spec: NodeSpec, other: NodeSpec) -> str:
    return f'[[mesh.peers]]\nagent_id = "{other.agent_id}"\nurl = "{other.url}"\n'


def _without_peer(spec: NodeSpec, other: NodeSpec) -> str:
    """Drop ``other`` from ``spec``'s [[mesh.peers]]; returns the config as it was."""
    text = spec.config_path.read_text()
    assert _peer_block(spec, other) in text
    spec.config_path.write_text(text.replace(_peer_block(spec, other), ""))
    return text


def _unknown_key_parked(spec: NodeSpec) -> int:
    return ok(spec, "status")["sync_parked_unknown_key"]


def _metric(spec: NodeSpec, name: str, peer: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{spec.health_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = re.search(rf'^{name}{{peer="{re.escape(peer)}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def test_a_late_joiner_parks_what_a_retired_key_signed_and_applies_it_once_the_key_history_is_imported(
        mesh_factory, cli, wait_for, node_log, tmp_path) -> None:
    mesh = mesh_factory(3, mcp_http=False, extra_config=SYNC_EVERY)
    n1, n2, n3 = mesh.layout.nodes
    # Node 3 joins later: nodes 1 and 2 do not know it yet, so nothing is queued for it.
    configs = {s.index: _without_peer(s, n3) for s in (n1, n2)}
    mesh.start([1, 2])
    m1 = ok(n1, "store", "signed with node 1's first key")
    m2 = ok(n1, "store", "also signed with node 1's first key")
    link = ok(n1, "link", m1["id"], m2["id"], "related_to")
    wait_for(lambda: any(r["link_id"] == link["link_id"] for r in ok(n2, "links", "--limit", "100")),
             "the link on node 2")

    # Node 1 rotates; node 2 imports the new key (the old one stays in its keyring).
    mesh.stop(1)
    rotated = ok(n1, "identity", "rotate", "--ca", str(mesh.layout.root / "ca"))
    rc, _, err = cli(n2, "identity", "import", str(n1.home / "keys" / f"{n1.agent_id}.pub"), json=False)
    assert rc == 0, err

    # Node 3 is given node 1's current .pub only, and joins; nodes 1 and 2 now list it.
    (n3.home / "peers" / f"{n1.agent_id}.pub").unlink()
    rc, _, err = cli(n3, "identity", "import", str(n1.home / "keys" / f"{n1.agent_id}.pub"), json=False)
    assert rc == 0, err
    mesh.stop(2)
    for spec in (n1, n2):
        spec.config_path.write_text(configs[spec.index])
    mesh.start([1, 2, 3])

    # What the retired key signed is parked on node 3, never applied, and shown in status, peers and /metrics.
    wait_for(lambda: _unknown_key_parked(n3) >= 3, "node 3 to park node 1's history as unknown_key")
    assert cli(n3, "get", m1["id"])[0] != 0
    row = next(r for r in ok(n3, "peers") if r["agent_id"] == n1.agent_id)
    assert row["parked_unknown_key"] == 3 and row["last_sync_seq"] > 0  # parked, and the cursor moved on
    assert _metric(n3, "aimem_sync_parked_unknown_key", n1.agent_id) == 3.0
    assert node_log.has(n3, "unknown_key_parked", peer=n1.agent_id)

    # Node 1's operator exports its key history; node 3's imports it, the node running.
    exported = ok(n1, "identity", "export-pub", "--with-retired", "--out", str(tmp_path / "exchange"))
    assert [k["fingerprint"] for k in exported["keys"]] == [rotated["fingerprint"], rotated["retired_fingerprint"]]
    bundle = tmp_path / "exchange" / f"{n1.agent_id}{keyhistory.BUNDLE_SUFFIX}"
    rc, text, err = cli(n3, "identity", "import", str(bundle), json=False)
    assert rc == 0 and rotated["retired_fingerprint"] in text, err

    wait_for(lambda: _unknown_key_parked(n3) == 0, "node 3 to apply the parked items")
    for ref in (m1["id"], m2["id"], link["link_id"]):
        verified = ok(n3, "verify", ref)
        assert verified["signature_verified"] is True and verified["attest_level"] == "peer_attested", verified
    assert _metric(n3, "aimem_sync_parked_unknown_key", n1.agent_id) == 0.0
    assert ok(n3, "audit", "verify")["ok"] is True
