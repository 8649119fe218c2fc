"""Permissions on a real node process: a peer write (over real mTLS, played by the test with node 2's
credentials) into a namespace the peer may not write is refused with the same code as a local write."""

from __future__ import annotations

import pytest

from tests.integration.conftest import run_cli
from tests.integration.peer_play import Answer, Member, db_rows, memory_put, new_memory

pytestmark = pytest.mark.integration


def assert_ack(answer: Answer, reason: str | None) -> None:
    assert answer.status == 200 and answer.ack is not None, answer
    assert answer.ack.accepted is (reason is None) and answer.ack.reason == reason, answer


def test_a_peer_write_is_rejected_like_a_local_one(mesh_factory) -> None:
    mesh = mesh_factory(2, mcp_http=False)
    n1 = mesh.layout.node(1)
    n2 = mesh.layout.node(2).agent_id
    (n1.home / "permissions.toml").write_text(f"""
mode = "enforce"
[[rules]]
agent = "{n2}"
namespace = "team"
operations = ["store", "update"]
action = "deny"

[[rules]]
agent = "{n1.agent_id}"
namespace = "team/locked"
operations = ["store"]
action = "deny"
""", encoding="utf-8")
    mesh.start([1], want_links=False)
    peer = Member.of(mesh.layout, 2)
    before = db_rows(n1)["memories"]

    refused = peer.send(n1, memory_put(new_memory(n2, namespace="team/x"), signer=peer))
    assert_ack(refused, "rejected:permission_denied")
    assert db_rows(n1)["memories"] == before

    rc, _, err = run_cli(n1, "store", "local plans", "--namespace", "team/locked/a")
    assert rc == 1 and "error [permission_denied]" in err, err

    allowed = new_memory(n2, namespace="elsewhere")
    assert_ack(peer.send(n1, memory_put(allowed, signer=peer)), None)
    assert [r for r in db_rows(n1)["memories"] if allowed["id"] in r]
    rc, out, _ = run_cli(n1, "permissions", "check", "--agent", n2, "--namespace", "team/x/y",
                         "--operation", "store")
    assert rc == 0 and out["decision"] == "deny" and out["mode"] == "enforce"
