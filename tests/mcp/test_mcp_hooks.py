"""A hook refusal seen through the SDK's stdio client: an MCP tool error carrying the hook's code."""

from __future__ import annotations

import anyio

from tests.hooks.scripts import hook, write_hooks_toml, write_scripts
from tests.mcp.conftest import Home, err, ok, stdio_session

TEST_TIMEOUT_S = 90


async def test_denied_store_is_an_mcp_error_result_with_the_hooks_code(home: Home) -> None:
    exe, _ = write_scripts(home.cfg.home / "hooks")
    write_hooks_toml(home.cfg.hooks_path, [
        hook("no-secrets", ["pre_store"], exe, "deny", "secret_detected"),
        hook("ask-links", ["pre_link"], exe, "ask", "Link these two?"),
    ])
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_session(home) as s:
            res = await s.call_tool("memory_store", {"content": "the password is hunter2"})
            assert res.is_error
            assert res.content[0].text.startswith("[secret_detected] hook 'no-secrets' denied pre_store")
            assert res.structured_content["error"]["code"] == "secret_detected"
            assert (await ok(s, "memory_list", {"limit": 5}))["results"] == []
            caps = await ok(s, "memory_capabilities")
            assert caps["hooks"]["by_event"] == {"pre_store": ["no-secrets"], "pre_link": ["ask-links"]}
            counts = {h["name"]: h["counts"] for h in caps["hooks"]["hooks"]}
            assert counts["no-secrets"] == {"fired": 1, "denied": 1}
            assert await err(s, "memory_link", {"src_id": "a", "dst_id": "b", "relation": "r"}) == "approval_required"
