"""MCP against real meshes: what one node's MCP writes, the other nodes' MCP see, attested."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from testbed.mesh import LocalMesh
from tests.integration.conftest import run_cli
from tests.layouts import new_layout
from tests.mcp.conftest import http_session, ok

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/mcp"


async def poll(session, tool: str, args: dict, check, what: str) -> dict:
    with anyio.fail_after(DEADLINE_S):
        while True:
            res = await session.call_tool(tool, args)
            if not res.is_error and check(res.structured_content):
                return res.structured_content
            await anyio.sleep(0.1)


async def test_link_made_through_node_a_mcp_is_peer_attested_through_node_b_mcp(tmp_path: Path) -> None:
    layout = new_layout(tmp_path / "m", 2)
    a, b = layout.nodes
    with LocalMesh(layout):
        async with http_session(url(a.mcp_http_port)) as sa, http_session(url(b.mcp_http_port)) as sb:
            m1 = await ok(sa, "memory_store", {"content": "replicated through the mesh"})
            m2 = await ok(sa, "memory_store", {"content": "second replicated memory"})
            link = await ok(sa, "memory_link", {"src_id": m1["id"], "dst_id": m2["id"], "relation": "related_to"})
            assert link["attest_level"] == "self_signed"
            v = await poll(sb, "memory_verify", {"link_id": link["link_id"]}, lambda r: True, "link on B")
            assert v["attest_level"] == "peer_attested" and v["signature_verified"] is True
            assert v["signed_by"] == a.agent_id
            hits = await poll(sb, "memory_recall", {"query": "replicated mesh"}, lambda r: r["results"], "recall")
            assert m1["id"] in {h["id"] for h in hits["results"]}
            caps = await ok(sb, "memory_capabilities")
            assert caps["links_by_attest_level"]["peer_attested"] == 1
            assert caps["peers"][0]["link_state"] == "up"


def alive(pid: int) -> bool:
    """A live process (a zombie awaiting its reaper has already stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def run_testbed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, timeout=120)


async def test_testbed_up_three_nodes_mcp_recall_and_attestation_then_down_leaves_nothing(tmp_path: Path) -> None:
    d = tmp_path / "tb"
    up = run_testbed("up", "--nodes", "3", "--dir", str(d))
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((d / "testbed.json").read_text())
        ports = {int(n["index"]): n for n in state["nodes"]}
        async with http_session(url(ports[1]["mcp_http_port"])) as s1, \
                http_session(url(ports[2]["mcp_http_port"])) as s2, \
                http_session(url(ports[3]["mcp_http_port"])) as s3:
            mem = await ok(s1, "memory_store", {"content": "stored through node one for node three"})
            hits = await poll(s3, "memory_recall", {"query": "node three"}, lambda r: r["results"], "recall on 3")
            assert mem["id"] in {h["id"] for h in hits["results"]}
            x = await ok(s2, "memory_store", {"content": "node two source"})
            y = await ok(s2, "memory_store", {"content": "node two target"})
            link = await ok(s2, "memory_link", {"src_id": x["id"], "dst_id": y["id"], "relation": "supports"})
            for s in (s1, s3):
                v = await poll(s, "memory_verify", {"link_id": link["link_id"]}, lambda r: True, "link")
                assert v["attest_level"] == "peer_attested" and v["signature_verified"] is True
    finally:
        down = run_testbed("down", "--dir", str(d))
    assert down.returncode == 0, down.stderr
    for n in state["nodes"]:
        assert not alive(int(n["pid"])), f"node-{n['index']} (pid {n['pid']}) still running"
        for key in ("port", "health_port", "mcp_http_port"):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", int(n[key])))


async def test_memory_link_many_through_the_sdk_makes_each_link_as_memory_link_and_b_attests_them(
        tmp_path: Path) -> None:
    layout = new_layout(tmp_path / "m", 2)
    a, b = layout.nodes
    with LocalMesh(layout):
        async with http_session(url(a.mcp_http_port)) as sa, http_session(url(b.mcp_http_port)) as sb:
            await ok(sa, "memory_load_family", {"family": "graph"})
            ids = [(await ok(sa, "memory_store", {"content": f"batch linked memory {i}"}))["id"] for i in range(4)]
            items = [{"src_id": ids[0], "dst_id": ids[i], "relation": f"rel_{i}"} for i in (1, 2, 3)]
            items.insert(1, {"src_id": ids[0], "dst_id": "00000000-0000-4000-8000-000000000000", "relation": "gone"})
            out = await ok(sa, "memory_link_many", {"links": items})
            assert (out["made"], out["failed"]) == (3, 1) and out["replicating_to"] == [b.agent_id]
            assert out["results"][1]["error"]["code"] == "unknown_memory"
            made = [r["ok"] for r in out["results"] if "ok" in r]
            assert [m["relation"] for m in made] == ["rel_1", "rel_2", "rel_3"]
            for m in made:  # signed exactly as memory_link signs, verified on A and attested on B
                assert m["attest_level"] == "self_signed" and m["signed_by"] == a.agent_id
                assert (await ok(sa, "memory_verify", {"link_id": m["link_id"]}))["signature_verified"] is True
                v = await poll(sb, "memory_verify", {"link_id": m["link_id"]}, lambda r: True, "link on B")
                assert v["attest_level"] == "peer_attested" and v["signature_verified"] is True

            # The bounds are the schema's: too many items is too_large, none is bad_input; nothing is made.
            one = {"src_id": ids[0], "dst_id": ids[1], "relation": "over"}
            res = await sa.call_tool("memory_link_many", {"links": [one] * 101})
            assert res.is_error and res.structured_content["error"]["code"] == "too_large"
            assert "limit is 100" in res.content[0].text
            res = await sa.call_tool("memory_link_many", {"links": []})
            assert res.is_error and res.structured_content["error"]["code"] == "bad_input"
            caps = await ok(sa, "memory_capabilities")
            assert caps["links_by_attest_level"]["self_signed"] == 3
            assert caps["limits"]["max_links_per_call"] == 100
    # Every made link has its audit event in A's chain, and the chain verifies.
    rc, report, stderr = run_cli(a, "audit", "verify")
    assert rc == 0, stderr
    assert report["ok"] is True and report["checked"] == 4 + 3  # four memories, three links
