"""Permissions on a real node process: a peer write (over real mTLS, played by the test with node 2's
credentials) into a namespace the peer may not write is refused with the same code as a local write."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from node.permissions.approval_api import signed_headers
from testbed.mesh import NodeSpec
from tests.integration.conftest import run_cli, wait_for
from tests.integration.peer_play import Answer, Member, add_config, db_rows, memory_put, new_memory

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api(spec: NodeSpec, port: int, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
    key = bytes.fromhex((spec.home / "keys" / "approval.hmac").read_text().strip())
    raw = b"" if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=raw if body is not None else None,
                                 method=method, headers=signed_headers(key, method, path, raw))
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_ask_approved_over_the_signed_http_api_lands_once_across_a_restart(mesh_factory) -> None:
    mesh = mesh_factory(2, mcp_http=False)
    n1 = mesh.layout.node(1)
    port = _free_port()
    add_config(n1, "approval", http_port=port)
    (n1.home / "permissions.toml").write_text('mode = "enforce"\n[[rules]]\nagent = "*"\nnamespace = "team"\n'
                                              'operations = ["store"]\naction = "ask"\n', encoding="utf-8")
    mesh.start([1], want_links=False)
    ids = []
    for content in ("approve me", "deny me"):
        rc, _, err = run_cli(n1, "store", content, "--namespace", "team/x")
        assert rc == 1 and "error [approval_required]" in err, err
        ids.append(re.search(r"pending action ([0-9a-f-]{36})", err).group(1))  # type: ignore[union-attr]
    mesh.stop(1)
    mesh.start([1], want_links=False)
    status, listed = _api(n1, port, "GET", "/v1/approvals")
    assert status == 200 and [a["id"] for a in listed["results"]] == ids
    assert _api(n1, port, "POST", f"/v1/approvals/{ids[0]}/approve", {"decided_by": "ops"})[1]["status"] == "applied"
    assert _api(n1, port, "POST", f"/v1/approvals/{ids[1]}/deny", {"decided_by": "ops"})[1]["status"] == "denied"
    status, again = _api(n1, port, "POST", f"/v1/approvals/{ids[0]}/approve", {"decided_by": "ops"})
    assert status == 409 and again["error"]["code"] == "already_decided"
    status, _ = _api(n1, port, "POST", f"/v1/approvals/{ids[1]}/approve", {"decided_by": "ops"})
    assert status == 409
    rc, memories, _ = run_cli(n1, "list")
    assert rc == 0 and [m["content"] for m in memories] == ["approve me"]
    rc, audit, _ = run_cli(n1, "audit", "verify")
    assert rc == 0 and audit["ok"]


@pytest.fixture
def receiver() -> Iterator[tuple[int, list[tuple[dict[str, str], bytes]]]]:
    """A webhook receiver on 127.0.0.1 (its own thread): (port, the requests it got)."""
    got: list[tuple[dict[str, str], bytes]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got.append((dict(self.headers), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], got
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_the_running_node_delivers_signed_webhooks_for_local_and_peer_writes(mesh_factory, receiver) -> None:
    port, got = receiver
    mesh = mesh_factory(2, mcp_http=False)
    n1 = mesh.layout.node(1)
    n2 = mesh.layout.node(2).agent_id
    add_config(n1, "subscriptions", poll_s=0.1)
    mesh.start([1], want_links=False)
    rc, sub, err = run_cli(n1, "subscriptions", "add", "--url", f"http://127.0.0.1:{port}/hook",
                           "--event", "memory.stored", "--event", "link.attested")
    assert rc == 0, err
    rc, local, err = run_cli(n1, "store", "told to the receiver")
    assert rc == 0, err
    peer = Member.of(mesh.layout, 2)
    theirs = new_memory(n2, namespace="default")
    assert_ack(peer.send(n1, memory_put(theirs, signer=peer)), None)

    wait_for(lambda: len(got) >= 2, "two deliveries from the node process")
    bodies = {}
    for headers, body in got:
        want = hmac.new(bytes.fromhex(sub["secret"]), headers["X-Webhook-Timestamp"].encode() + b"." + body,
                        hashlib.sha256).hexdigest()
        assert headers["X-Webhook-Signature"] == want and headers["X-Webhook-Event"] == "memory.stored"
        data = json.loads(body)["data"]
        bodies[data["id"]] = data
    assert set(bodies) == {local["id"], theirs["id"]}
    assert bodies[theirs["id"]]["received_from"] == n2
    rc, delivered, _ = run_cli(n1, "subscriptions", "deliveries", "--status", "delivered")
    assert rc == 0 and len(delivered) == 2
