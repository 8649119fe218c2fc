"""An ``ai-memory mcp`` started while its node restarts waits for the node and joins it, rather than opening the
node's database beside it."""

from __future__ import annotations

import asyncio
import os
import sys

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.integration.conftest import wait_for
from tests.mcp.conftest import CALL_TIMEOUT_S, ROOT, ok

pytestmark = pytest.mark.integration

TEST_TIMEOUT_S = 120


async def test_an_mcp_started_while_its_node_is_down_waits_and_joins_it(mesh_factory) -> None:
    mesh = mesh_factory(2)
    n1 = mesh.layout.node(1)
    await asyncio.to_thread(mesh.start, [1], want_links=False)
    await asyncio.to_thread(mesh.stop, 1)  # the node restarts: down now, up again below
    env = {"AI_MEMORY_HOME": str(n1.home), "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "node.cli", "mcp", "--config",
                                                                 str(n1.config_path)], env=env, cwd=str(ROOT))
    errlog_path = n1.home / "mcp-stderr.log"
    errlog = await asyncio.to_thread(open, errlog_path, "w")
    with anyio.fail_after(TEST_TIMEOUT_S), errlog:
        async with stdio_client(params, errlog=errlog) as (r, w), \
                ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S) as session:
            init = asyncio.create_task(session.initialize())
            await asyncio.to_thread(wait_for, lambda: "waiting up to" in errlog_path.read_text(),
                                    "the MCP server saying it waits for the node")
            await asyncio.to_thread(mesh.start, [1], want_links=False)
            await init
            caps = await ok(session, "memory_capabilities")
            assert caps["mcp"]["mode"] == "joined"
            stored = await ok(session, "memory_store", {"content": "through the node"})
            assert (await ok(session, "memory_get", {"id": stored["id"]}))["content"] == "through the node"
    assert "embedded" not in errlog_path.read_text()
