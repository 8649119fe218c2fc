"""AskUser over MCP (the SDK's stdio client, a real `ai-memory mcp` process): the write lands exactly once
after memory_approval_decide approves, never after a deny, also when the MCP process (the embedded node)
was restarted while the action was pending."""

from __future__ import annotations

import re

import anyio

from tests.mcp.conftest import Home, err, ok, stdio_session
from tests.permissions.conftest import ASK_TEAM_STORES as ASK_TEAM

TEST_TIMEOUT_S = 120


async def _park(s, content: str) -> str:
    res = await s.call_tool("memory_store", {"content": content, "namespace": "team/x"})
    assert res.is_error and res.structured_content["error"]["code"] == "approval_required"
    found = re.search(r"pending action ([0-9a-f-]{36})", res.content[0].text)
    assert found, res.content[0].text
    return found.group(1)


async def test_ask_approved_over_mcp_lands_once_and_a_denied_one_never(home: Home) -> None:
    home.cfg.permissions_path.write_text(ASK_TEAM, encoding="utf-8")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_session(home) as s:
            kept = await _park(s, "approved plans")
            dropped = await _park(s, "denied plans")
            listed = await ok(s, "memory_approval_list", {})
            assert [a["id"] for a in listed["results"]] == [kept, dropped]
            assert (await ok(s, "memory_list", {}))["results"] == []
        # The MCP process (and its embedded service) ends with the actions still pending.
        async with stdio_session(home) as s:
            decided = await ok(s, "memory_approval_decide", {"id": kept, "choice": "approve", "decided_by": "ops"})
            assert decided["status"] == "applied"
            assert await err(s, "memory_approval_decide", {"id": kept, "choice": "approve"}) == "already_decided"
            assert (await ok(s, "memory_approval_decide", {"id": dropped, "choice": "deny"}))["status"] == "denied"
            assert await err(s, "memory_approval_decide", {"id": dropped, "choice": "approve"}) == "already_decided"
            assert await err(s, "memory_approval_decide", {"id": kept, "choice": "maybe"}) == "bad_input"
            contents = [m["content"] for m in (await ok(s, "memory_list", {}))["results"]]
            assert contents == ["approved plans"]
            caps = await ok(s, "memory_capabilities")
            assert caps["permissions"]["mode"] == "enforce"
            assert caps["permissions"]["rule_summary"] == ["ask store on team for * (permissions.toml: rules[0])"]
