"""Hooks in a real node process: a daemon hook answers over MCP, and stopping the node reaps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.mesh import LocalMesh
from tests.hooks.scripts import hook, write_hooks_toml, write_scripts
from tests.integration.test_mcp_mesh import alive, url
from tests.layouts import new_layout
from tests.mcp.conftest import err, http_session, ok

pytestmark = pytest.mark.integration


async def test_node_runs_a_daemon_hook_and_stop_reaps_it(tmp_path: Path) -> None:
    layout = new_layout(tmp_path / "m", 2)
    a = layout.nodes[0]
    _, daemon = write_scripts(tmp_path / "hooks")
    write_hooks_toml(a.home / "hooks.toml", [hook("dlp", ["post_recall"], daemon)])
    with LocalMesh(layout):
        async with http_session(url(a.mcp_http_port)) as s:
            await ok(s, "memory_store", {"content": "the forbidden archive"})
            assert await err(s, "memory_recall", {"query": "archive"}) == "forbidden_topic"
            caps = await ok(s, "memory_capabilities")
            [dlp] = caps["hooks"]["hooks"]
            assert dlp["runner"]["state"] == "running" and dlp["counts"] == {"fired": 1, "denied": 1}
            pid = dlp["runner"]["pid"]
            assert alive(pid)
    assert not alive(pid), "stopping the node must stop and reap its daemon hooks"
