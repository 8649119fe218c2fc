"""limits.requests_per_second: an agent (one MCP session) past its budget gets rate_limited, others do not."""

from __future__ import annotations

from pathlib import Path

import anyio

from mesh import keys
from node.assemble import open_service
from node.config import from_dict
from node.mcp.backend import ServiceBackend
from node.mcp.server import start_http
from tests.mcp.conftest import AGENT, http_session, ok

TEST_TIMEOUT_S = 60


async def test_agent_past_its_budget_is_rate_limited_and_others_are_served(tmp_path: Path) -> None:
    home = tmp_path / "h"
    cfg = from_dict({"agent_id": AGENT, "home": str(home), "limits": {"requests_per_second": 3}}, env={})
    keys.generate_identity(cfg.keys_dir, AGENT)
    svc = await open_service(cfg, require_identity=True)
    handle = await start_http(ServiceBackend(svc), "127.0.0.1", 0)
    try:
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with http_session(handle.url) as greedy, http_session(handle.url) as polite:
                codes = []
                for _ in range(6):  # bounded: well past a 3-request burst, within a fraction of a second
                    res = await greedy.call_tool("memory_capabilities", {})
                    codes.append(res.structured_content["error"]["code"] if res.is_error else "ok")
                assert "rate_limited" in codes
                assert (await ok(polite, "memory_capabilities"))["agent_id"] == AGENT
    finally:
        with anyio.fail_after(TEST_TIMEOUT_S):
            await handle.stop()
        await svc.close()
