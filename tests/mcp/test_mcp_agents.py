"""Which agent an MCP request acts as, at each door (docs/mcp.md, "Agents"): an HTTP request's bearer token, a
socket connection's hello, a stdio process's --agent-id; and the ids a node refuses to act as."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from mesh import agentkeys
from mesh.agentkeys import AgentTokens
from node.agents.acting import acting_as
from node.assemble import open_service
from node.errors import ServiceError
from node.mcp.backend import ServiceBackend
from node.mcp.server import start_http
from node.mcp.socket import SocketClientBackend, start_local_socket
from tests.mcp.conftest import AGENT, CALL_TIMEOUT_S, Home, http_session, ok

BOT = "ai:claude-code@laptop"
CI = "ai:ci-bot@laptop"
TEST_TIMEOUT_S = 60


@contextlib.asynccontextmanager
async def bearer_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, streamable_http_client(url, http_client=client) as (r, w):
        async with ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S) as session:
            await session.initialize()
            yield session


async def test_an_http_request_with_an_agents_token_acts_as_that_agent_and_an_unknown_token_is_401(
        home: Home, service) -> None:
    token = agentkeys.agent_token(home.cfg.keys_dir, BOT, create=True)
    assert token is not None
    assert (home.cfg.keys_dir / "agents" / f"{BOT}.token").stat().st_mode & 0o777 == 0o600
    handle = await start_http(ServiceBackend(service), "127.0.0.1", 0, tokens=AgentTokens(home.cfg.keys_dir))
    try:
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with bearer_session(handle.url, token) as s, http_session(handle.url) as plain:
                mine = await ok(s, "memory_store", {"content": "through the agent's token"})
                node = await ok(plain, "memory_store", {"content": "through no token"})
                assert (await ok(s, "memory_get", {"id": mine["id"]}))["writer"] == BOT
                assert (await ok(plain, "memory_get", {"id": node["id"]}))["writer"] == AGENT
            async with httpx2.AsyncClient() as c:
                r = await c.post(handle.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=5,
                                 headers={"Authorization": "Bearer not-a-token",
                                          "Accept": "application/json, text/event-stream"})
                assert r.status_code == 401 and r.json()["error"]["code"] == -32001
    finally:
        with anyio.fail_after(TEST_TIMEOUT_S):
            await handle.stop()


async def test_a_socket_connection_names_its_agent_once_and_each_call_runs_as_it(home: Home, service) -> None:
    handle = await start_local_socket(ServiceBackend(service), home.cfg.socket_path)
    try:
        with anyio.fail_after(TEST_TIMEOUT_S):
            client = await SocketClientBackend.connect(home.cfg.socket_path, limits=home.cfg.limits, agent=BOT)
            try:
                assert client.whoami is not None and client.whoami["agent"] == BOT
                made = await client.call("memory_store", {"content": "over the socket as the agent"})
                assert (await service.memory_get(made["id"]))["writer"] == BOT
            finally:
                await client.close()
            # A hello naming no valid agent id is refused, and the client says so.
            with pytest.raises(ServiceError) as e:
                await SocketClientBackend.connect(home.cfg.socket_path, limits=home.cfg.limits, agent="not an id")
            assert e.value.code == "bad_input"
    finally:
        await handle.stop()


async def test_declared_admission_refuses_an_agent_the_config_does_not_name(home: Home) -> None:
    from node.agentconfig import AgentConfig

    cfg = replace(home.cfg, mcp=replace(home.cfg.mcp, agent_ids="declared", agents=(AgentConfig(CI),)))
    svc = await open_service(cfg, require_identity=True)
    try:
        with pytest.raises(ServiceError) as e:
            await svc.agents.principal(BOT)
        assert e.value.code == "agent_not_declared"
        principal = await svc.agents.principal(CI)
        assert principal is not None
        with acting_as(principal):
            assert (await svc.memory_store("declared"))["writer"] == CI
        assert await svc.agents.principal(AGENT) is None  # the node's own id: the node
    finally:
        await svc.close()


async def test_capabilities_count_an_agents_memories_and_calls_apart_from_the_nodes(home: Home, service) -> None:
    backend = ServiceBackend(service)
    await backend.call("memory_store", {"content": "as the agent"}, BOT)
    assert await err_code(backend, "memory_store", {"content": 5}, BOT) == "bad_input"
    caps = await backend.capabilities()
    (bot,) = caps["agents"]["agents"]
    assert (bot["agent_id"], bot["memories"], bot["calls"]) == (BOT, 1, {"ok": 1, "bad_input": 1})
    assert caps["agents"]["node"]["memories"] == 0


async def err_code(backend: ServiceBackend, tool: str, args: dict, agent: str) -> str:
    try:
        await backend.call(tool, args, agent)
    except ServiceError as e:
        return e.code
    raise AssertionError("the call succeeded")
