"""Agents as principals on real meshes: ``ai-memory mcp --agent-id`` sessions (the official SDK client over stdio,
joining the running node) act as their agent, sign with its own key, and the peers attest what they sign naming
the agent; two agents on one node answer to their own rules, quotas, approvals and counts."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from prometheus_client.parser import text_string_to_metric_families

from testbed.mesh import LocalMesh, NodeSpec
from tests.integration.conftest import ROOT, run_cli
from tests.layouts import new_layout
from tests.mcp.conftest import CALL_TIMEOUT_S, http_session, ok

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0
BOT = "ai:claude-code@laptop"
CI = "ai:ci-bot@laptop"
BURST = "ai:burst@laptop"
# CI may hold 300 bytes of memories; BURST makes one request a second; BOT has the defaults (100 MB, 100/s).
AGENTS = f"""
[[mcp.agents]]
id = "{CI}"
max_bytes = 300

[[mcp.agents]]
id = "{BURST}"
requests_per_second = 1
"""


@contextlib.asynccontextmanager
async def agent_session(spec: NodeSpec, agent: str) -> AsyncIterator[ClientSession]:
    """``ai-memory mcp --agent-id AGENT`` for node ``spec`` as a subprocess, through the official SDK client."""
    env = {"AI_MEMORY_HOME": str(spec.home), "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    params = StdioServerParameters(command=sys.executable, env=env, cwd=str(ROOT),
                                   args=["-m", "node.cli", "mcp", "--config", str(spec.config_path), "--agent-id",
                                         agent])
    errlog = await anyio.to_thread.run_sync(open, spec.home / f"mcp-{agent.split(':')[1]}.log", "a")
    try:
        async with stdio_client(params, errlog=errlog) as (r, w):
            async with ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S) as session:
                await session.initialize()
                yield session
    finally:
        errlog.close()


async def error_code(session: ClientSession, tool: str, args: dict) -> str | None:
    res = await session.call_tool(tool, args)
    return res.structured_content["error"]["code"] if res.is_error else None


async def poll(session: ClientSession, tool: str, args: dict, check) -> dict:
    with anyio.fail_after(DEADLINE_S):
        while True:
            res = await session.call_tool(tool, args)
            if not res.is_error and check(res.structured_content):
                return res.structured_content
            await anyio.sleep(0.1)


def table(spec: NodeSpec, sql: str) -> list[tuple]:
    """Rows of the node's store, read-only beside the running node."""
    conn = sqlite3.connect(f"file:{spec.home / 'data' / 'memory.db'}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def wait_rows(spec: NodeSpec, sql: str, want: int) -> None:
    with anyio.fail_after(DEADLINE_S):
        while True:
            if len(table(spec, sql)) >= want:
                return
            await anyio.sleep(0.1)


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/mcp"


async def test_an_agents_link_made_on_node_one_is_peer_attested_on_two_and_three_naming_the_agent(
        tmp_path: Path) -> None:
    layout = new_layout(tmp_path / "m", 3)
    a, b, c = layout.nodes
    with LocalMesh(layout):
        async with agent_session(a, BOT) as bot, http_session(url(b.mcp_http_port)) as sb, \
                http_session(url(c.mcp_http_port)) as sc:
            m1 = await ok(bot, "memory_store", {"content": "written by the agent itself"})
            m2 = await ok(bot, "memory_store", {"content": "and linked by it"})
            link = await ok(bot, "memory_link", {"src_id": m1["id"], "dst_id": m2["id"], "relation": "supports"})
            assert (link["attest_level"], link["signed_by"]) == ("self_signed", BOT)
            for s in (sb, sc):
                v = await poll(s, "memory_verify", {"link_id": link["link_id"]}, lambda r: True)
                assert (v["attest_level"], v["signed_by"], v["signature_verified"]) == ("peer_attested", BOT, True)
                got = await poll(s, "memory_get", {"id": m1["id"]}, lambda r: True)
                assert got["writer"] == BOT
            # Its key: made on first use in the node home, 0600, listed by `identity list`.
            assert (a.home / "keys" / "agents" / f"{BOT}.priv").stat().st_mode & 0o777 == 0o600
            rc, listed, err = run_cli(a, "identity", "list")
            assert rc == 0, err
            assert [r["trust"] for r in listed if r["agent_id"] == BOT] == ["agent"]
            # The audit chain names the agent that acted, and verifies.
            assert {r[0] for r in table(a, "SELECT agent_id FROM signed_events WHERE event_type IN "
                                           "('memory', 'link')")} == {BOT}
            rc, report, err = run_cli(a, "audit", "verify")
            assert rc == 0 and report["ok"] is True, err
            # Revoked beside the running node: the agent's next call is refused there, the revocation reaches
            # the peers, and what it signed before keeps verifying.
            rc, made, err = run_cli(a, "agents", "revoke", BOT)
            assert rc == 0 and len(made) == 1, err
            # (a revocation made by another process reaches the node's doors within a second: polled, bounded)
            with anyio.fail_after(DEADLINE_S):
                while True:
                    if await error_code(bot, "memory_list", {}) == "delegation_revoked":
                        break
                    await anyio.sleep(0.1)
            assert await error_code(bot, "memory_store", {"content": "after the end"}) == "delegation_revoked"
            for spec, s in ((b, sb), (c, sc)):
                await wait_rows(spec, "SELECT revocation_id FROM agent_revocations", 1)
                v = await ok(s, "memory_verify", {"link_id": link["link_id"]})
                assert (v["attest_level"], v["signature_verified"]) == ("peer_attested", True)


def metric_samples(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5.0) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_two_agents_on_one_node_answer_to_their_own_rules_quotas_and_approvals(tmp_path: Path) -> None:
    layout = new_layout(tmp_path / "m", 2, extra_config=AGENTS)
    a = layout.nodes[0]
    (a.home / "permissions.toml").write_text(f"""
mode = "enforce"
[[rules]]
agent = "{CI}"
namespace = "secret"
operations = ["store"]
action = "deny"

[[rules]]
agent = "{BOT}"
namespace = "review"
operations = ["store"]
action = "ask"
""", encoding="utf-8")
    with LocalMesh(layout):
        async with agent_session(a, BOT) as bot, agent_session(a, CI) as ci, agent_session(a, BURST) as burst:
            # Rules: CI may not store in "secret", BOT may; BOT's store in "review" waits for a person.
            assert (await ok(bot, "memory_store", {"content": "bot's secret", "namespace": "secret"}))["id"]
            assert await error_code(ci, "memory_store", {"content": "ci's secret", "namespace": "secret"}) \
                == "permission_denied"
            parked = await bot.call_tool("memory_store", {"content": "bot asks", "namespace": "review"})
            assert parked.is_error and parked.structured_content["error"]["code"] == "approval_required"
            # Quotas: CI holds at most 300 bytes; BOT's 100 MB default lets it store far more.
            assert await error_code(ci, "memory_store", {"content": "c" * 200}) is None
            assert await error_code(ci, "memory_store", {"content": "c" * 200}) == "quota_exceeded"
            assert await error_code(bot, "memory_store", {"content": "b" * 1000}) is None
            # BURST makes one request a second: a run of calls meets its limit (bounded: 30 calls).
            codes = [await error_code(burst, "memory_list", {}) for _ in range(30)]
            assert "rate_limited" in codes
            # The approval names the agent, and the approved write is the agent's.
            rc, pending, err = run_cli(a, "approvals", "list")
            assert rc == 0 and [p["agent"] for p in pending] == [BOT], err
            rc, decided, err = run_cli(a, "approvals", "approve", pending[0]["id"])
            assert rc == 0, err
            hits = await ok(bot, "memory_list", {"namespace": "review"})
            assert [m["writer"] for m in hits["results"]] == [BOT]
            # Counts per agent: capabilities (and status), and /metrics.
            caps = await ok(ci, "memory_capabilities")
            by_agent = {x["agent_id"]: x for x in caps["agents"]["agents"]}
            assert set(by_agent) == {BOT, CI, BURST}
            assert (by_agent[CI]["memories"], by_agent[CI]["quota_bytes"]) == (1, 300)
            assert by_agent[BOT]["quota_bytes"] == 100 * 1024 * 1024 and by_agent[BOT]["memories"] == 3
            assert by_agent[BURST]["requests_per_second"] == 1
            assert by_agent[CI]["calls"]["permission_denied"] == 1
            assert by_agent[CI]["calls"]["quota_exceeded"] == 1
            rc, status, err = run_cli(a, "status")
            assert rc == 0 and {x["agent_id"] for x in status["agents"]["agents"]} == {BOT, CI, BURST}, err
            got = metric_samples(a.health_port)
            assert got[("aimem_mcp_agent_calls_total", (("agent", CI), ("outcome", "quota_exceeded")))] == 1
            assert got[("aimem_mcp_agent_calls_total", (("agent", BURST), ("outcome", "rate_limited")))] >= 1
