"""`ai-memory mcp` joined to a running node survives the node's restart: the next call reconnects."""

from __future__ import annotations

import asyncio
import os
import sys

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.mcp.conftest import CALL_TIMEOUT_S, ROOT, ok

pytestmark = pytest.mark.integration

TEST_TIMEOUT_S = 120


async def test_the_first_call_after_a_node_restart_works(mesh_factory) -> None:
    mesh = mesh_factory(2)
    n1 = mesh.layout.node(1)
    await asyncio.to_thread(mesh.start, [1], want_links=False)
    env = {"AI_MEMORY_HOME": str(n1.home), "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "node.cli", "mcp", "--config",
                                                                 str(n1.config_path)], env=env, cwd=str(ROOT))
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_client(params) as (r, w), \
                ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S) as session:
            await session.initialize()
            caps = await ok(session, "memory_capabilities")
            assert caps["mcp"]["mode"] == "joined"
            before = await ok(session, "memory_store", {"content": "stored before the restart"})

            await asyncio.to_thread(mesh.stop, 1)
            await asyncio.to_thread(mesh.start, [1], want_links=False)

            # A write first: it was never sent on the dead connection, so it goes out on the new one.
            after = await ok(session, "memory_store", {"content": "stored after the restart"})
            assert (await ok(session, "memory_get", {"id": before["id"]}))["content"] == "stored before the restart"
            listed = (await ok(session, "memory_list", {}))["results"]
            assert sorted(m["id"] for m in listed) == sorted([before["id"], after["id"]])  # each stored once

            # And a read first, after a second restart.
            await asyncio.to_thread(mesh.stop, 1)
            await asyncio.to_thread(mesh.start, [1], want_links=False)
            assert (await ok(session, "memory_get", {"id": after["id"]}))["content"] == "stored after the restart"
