"""The KG tools through the official MCP SDK client (stdio, a real subprocess) and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import anyio

from tests.mcp.conftest import ROOT, Home, err, make_home, ok, stdio_session

TEST_TIMEOUT_S = 90
CLI_TIMEOUT_S = 60


async def test_kg_tools_over_stdio(tmp_path) -> None:
    home = make_home(tmp_path)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_session(home) as s:
            a = (await ok(s, "memory_store", {"content": "alpha"}))["id"]
            b = (await ok(s, "memory_store", {"content": "beta"}))["id"]
            link = await ok(s, "memory_link", {"src_id": a, "dst_id": b, "relation": "supports"})
            q = await ok(s, "memory_kg_query", {"memory_id": a, "depth": 5})
            assert [n["memory_id"] for n in q["neighbours"]] == [b] and q["truncated"] is False
            p = await ok(s, "memory_find_paths", {"src_id": a, "dst_id": b})
            assert p["paths"] == [{"length": 1, "links": [link["link_id"]]}]
            inv = await ok(s, "memory_kg_invalidate", {"link_id": link["link_id"]})
            assert inv["attest_level"] == "self_signed"
            tl = await ok(s, "memory_kg_timeline", {"memory_id": a})
            assert tl["links"][0]["ended_at"] == inv["valid_until"]
            assert (await ok(s, "memory_capabilities"))["kg_backend"] == "sqlite-cte"
            assert await err(s, "memory_kg_query", {"memory_id": a, "depth": 6}) == "bad_input"
            assert await err(s, "memory_kg_query", {"memory_id": "nope"}) == "unknown_memory"
            assert await err(s, "memory_kg_invalidate", {"link_id": link["link_id"]}) == "already_ended"
            assert await err(s, "memory_kg_invalidate", {"link_id": "ab" * 32}) == "unknown_link"


def _cli(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli", "--config", str(home.toml), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          env={"AI_MEMORY_HOME": str(home.cfg.home), "PYTHONPATH": str(ROOT)})


def test_kg_cli_and_doctor(tmp_path) -> None:
    home = make_home(tmp_path)
    a = _cli(home, "store", "alpha").stdout.strip()
    b = _cli(home, "store", "beta").stdout.strip()
    link = json.loads(_cli(home, "link", a, b, "supports", "--json").stdout)
    q = json.loads(_cli(home, "kg", "query", a, "--depth", "3", "--json").stdout)
    assert q["neighbours"][0]["path"] == [link["link_id"]]
    assert link["link_id"] in _cli(home, "kg", "paths", a, b).stdout
    assert _cli(home, "kg", "invalidate", link["link_id"]).returncode == 0
    assert "invalidated" in _cli(home, "kg", "timeline", a).stdout
    doctor = json.loads(_cli(home, "doctor", "--json").stdout)
    assert doctor["kg_backend"] == "sqlite-cte" and doctor["audit_chain_ok"] is True
    bad = _cli(home, "kg", "query", a, "--depth", "6")
    assert bad.returncode == 1 and "error [bad_input]" in bad.stderr
