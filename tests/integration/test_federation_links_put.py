"""links.put between real node processes over real mutual TLS: memory_link_many on A reaches B and C packed
(negotiated through their sync pages), each link attested on its own; a forged link among many is refused
alone while the others are stored."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a import new_envelope
from mesh import keys, peerkeys, tls
from mesh.link import post_envelope
from node import attest
from node.attest import LinkPayload
from testbed.mesh import LocalMesh
from tests.integration.conftest import maybe, wait_for
from tests.integration.conftest import ok as cli_ok
from tests.integration.test_mcp_mesh import poll, url
from tests.layouts import new_layout
from tests.mcp.conftest import http_session, ok

pytestmark = pytest.mark.integration

LINKS = 30


async def test_memory_link_many_goes_packed_to_peers_that_read_links_put_and_each_link_is_attested(
        tmp_path: Path) -> None:
    layout = new_layout(tmp_path / "m", 3)
    a, b, c = layout.nodes
    with LocalMesh(layout):
        async with http_session(url(a.mcp_http_port)) as sa, http_session(url(b.mcp_http_port)) as sb, \
                http_session(url(c.mcp_http_port)) as sc:
            await ok(sa, "memory_load_family", {"family": "graph"})
            # A learns from each peer's sync page (pulled when its link comes up) that it reads links.put.
            await poll(sa, "memory_capabilities", {},
                       lambda caps: caps["a2a"]["links_put_to"] == sorted([b.agent_id, c.agent_id]), "sync pages")
            ids = [(await ok(sa, "memory_store", {"content": f"packed link memory {i}"}))["id"] for i in range(6)]
            items = [{"src_id": ids[i % 6], "dst_id": ids[(i + 1 + i // 6) % 6], "relation": f"rel_{i}"}
                     for i in range(LINKS)]
            out = await ok(sa, "memory_link_many", {"links": items})
            assert out["made"] == LINKS
            for session in (sb, sc):
                caps = await poll(session, "memory_capabilities", {},
                                  lambda caps: caps["links_by_attest_level"].get("peer_attested") == LINKS,
                                  "every link peer_attested")
                # One envelope carried them (the six memories came one memory.put each).
                assert caps["a2a"]["federation"]["links.put"] == 1
                assert caps["a2a"]["federation"]["link:peer_attested"] == LINKS
            for made in (r["ok"] for r in out["results"]):
                v = await ok(sb, "memory_verify", {"link_id": made["link_id"]})
                assert v["attest_level"] == "peer_attested" and v["signature_verified"] is True
            caps = await ok(sa, "memory_capabilities")
            assert caps["a2a"]["links_put_unpacked"] == 0 and caps["a2a"]["dead_lettered"] == 0


def test_a_forged_link_among_many_is_refused_alone_and_the_others_are_stored(tmp_path: Path) -> None:
    layout = new_layout(tmp_path / "m", 3, mcp_http=False)
    a, b, c = layout.nodes
    with LocalMesh(layout):
        m1 = cli_ok(a, "store", "x")
        m2 = cli_ok(a, "store", "y")
        wait_for(lambda: maybe(b, "get", m2["id"]), "memories on B")
        a_key = keys.load_identity(a.home / "keys", a.agent_id).private_key
        now = int(time.time() * 1000)
        bodies = []
        for i in range(6):
            payload = LinkPayload(src_id=m1["id"], dst_id=m2["id"], relation=f"rel_{i}", observed_by=a.agent_id,
                                  valid_from=now, valid_until=None)
            key = Ed25519PrivateKey.generate() if i == 3 else a_key  # the fourth is forged
            bodies.append({"link": payload.to_dict(), "signature": attest.sign(key, payload),
                           "signed_by": a.agent_id})
        # Relayed by node C, a legitimate peer of B, over C's own mTLS identity: each link verifies or not on its own.
        env = new_envelope(c.agent_id, [b.agent_id], {"kind": "links.put", "links": bodies}, now, 60_000)
        ctx = tls.client_context(c.home / "tls" / "node.crt", c.home / "keys" / f"{c.agent_id}.priv",
                                 c.home / "tls" / "ca.crt")
        pinned = peerkeys.load_peer_keys(c.home / "peers").keys
        status, ack, _ = anyio.run(lambda: post_envelope(b.url, env, ctx, expected_agent_id=b.agent_id,
                                                         pinned=pinned, timeout_s=10.0, max_bytes=1 << 20))
        assert status == 200 and ack is not None and ack.reason == "rejected:bad_signature"
        on_b = {r["relation"]: r for r in cli_ok(b, "links", "--limit", "100")}
        assert sorted(on_b) == ["rel_0", "rel_1", "rel_2", "rel_4", "rel_5"]
        assert all(r["attest_level"] == "peer_attested" and r["received_from"] == c.agent_id for r in on_b.values())
        assert "bad_signature" in (b.home / "node.log").read_text()
