"""Where ``ai-memory mcp`` runs the service: joined to the node serving its home (waited for, bounded), embedded in
its own process only where no node is configured to serve the home, or when asked (``--embedded``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import anyio
from mcp import ClientSession, stdio_client

from tests.mcp.conftest import CALL_TIMEOUT_S, ROOT, Home, make_home, ok, stdio_params

TEST_TIMEOUT_S = 90


def served(h: Home, join_wait_s: float = 30.0) -> Home:
    """``h`` with a [mesh] table in its config: a node is configured to serve it (none runs here)."""
    h.toml.write_text(h.toml.read_text() + f"[mesh]\nlisten_port = 7999\n[mcp]\njoin_wait_s = {join_wait_s}\n")
    return h


async def mode(h: Home, *extra: str) -> tuple[str, str]:
    """The MCP session's mode as memory_capabilities reports it, and what the server said on stderr."""
    params = stdio_params(h)
    params.args = [*params.args, *extra]
    log = h.cfg.home / "mcp-stderr.log"
    errlog = await asyncio.to_thread(open, log, "w")
    with anyio.fail_after(TEST_TIMEOUT_S), errlog:
        async with stdio_client(params, errlog=errlog) as (r, w), \
                ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S) as session:
            await session.initialize()
            caps = await ok(session, "memory_capabilities")
    return caps["mcp"]["mode"], log.read_text()


async def test_a_home_no_node_serves_is_opened_in_the_mcp_process_without_waiting(home: Home) -> None:
    got, stderr = await mode(home)
    assert got == "embedded" and "waiting" not in stderr


async def test_embedded_forces_the_store_open_where_a_node_is_configured(tmp_path: Path) -> None:
    got, stderr = await mode(served(make_home(tmp_path)), "--embedded")
    assert got == "embedded" and "waiting" not in stderr


def test_a_configured_node_that_does_not_come_is_waited_for_then_one_clear_error(tmp_path: Path) -> None:
    h = served(make_home(tmp_path), join_wait_s=1.0)
    env = {"AI_MEMORY_HOME": str(h.cfg.home), "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    p = subprocess.run([sys.executable, "-m", "node.cli", "mcp", "--config", str(h.toml)], env=env, cwd=ROOT,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=TEST_TIMEOUT_S)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 2, p.stderr
    assert lines[0].startswith("ai-memory mcp: waiting up to 1 s for the node serving ")
    assert "its config has a [mesh] table" in lines[0]
    assert lines[1].startswith("ai-memory: error [node_unavailable]: no node answered on ") and "--embedded" in lines[1]
    assert not h.cfg.db_path.exists()  # its store was not opened beside the absent node
