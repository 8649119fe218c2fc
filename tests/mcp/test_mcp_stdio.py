"""``ai-memory mcp`` as a real subprocess, driven by the SDK's stdio client."""

from __future__ import annotations

import anyio

from node.mcp.socket import MAX_FRAME_BYTES  # noqa: F401  (import proves the module loads without the SDK server)
from tests.mcp.conftest import Home, err, ok, stdio_session
from tests.mcp.flows import walk_through

TEST_TIMEOUT_S = 90


async def test_stdio_embedded_walk_through_signs_and_verifies(home: Home) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_session(home) as s:
            out = await walk_through(s)
            assert out["caps"]["mcp"] == {"transport": "stdio", "mode": "embedded", "profile": "core",
                                          "loaded": ["core", "full"]}


async def test_bad_calls_are_tool_errors_and_the_server_keeps_serving(home: Home) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_session(home) as s:
            big = "x" * (home.cfg.limits.max_content_bytes + 1)
            cases = [
                ("memory_nope", {}, "unknown_tool"),
                ("memory_store", {}, "bad_input"),                              # missing argument
                ("memory_store", {"content": "x", "priority": "high"}, "bad_input"),  # wrong type
                ("memory_store", {"content": "x", "bogus": 1}, "bad_input"),    # unknown argument
                ("memory_store", {"content": big}, "too_large"),
                ("memory_store", {"content": "é" * 40_000}, "too_large"),      # chars fit, bytes do not
                ("memory_get", {"id": "00000000-0000-4000-8000-000000000000"}, "not_found"),
                ("memory_verify", {"link_id": "ab" * 32}, "not_found"),
                ("memory_link", {"src_id": "nope-1", "dst_id": "nope-2", "relation": "r"}, "unknown_memory"),
                ("memory_recall", {"query": "x", "limit": 0}, "bad_input"),
            ]
            for tool, args, code in cases:
                assert await err(s, tool, args) == code, (tool, args)
                # still serving after each failure
                assert (await ok(s, "memory_list", {"limit": 1}))["results"] is not None

            m = await ok(s, "memory_store", {"content": 'a "quoted" NEAR(thing) with * stars'})
            for hostile in ['"', "NEAR(", "*", 'a" OR "b', "NEAR(x y", "col:", "^", "(", ")"]:
                res = await s.call_tool("memory_recall", {"query": hostile})
                # either ranked hits or a reasoned tool error, never a crash
                if res.is_error:
                    assert res.content[0].text.startswith("["), res.content[0].text
                else:
                    assert isinstance(res.structured_content["results"], list)
            hits = (await ok(s, "memory_recall", {"query": 'NEAR(thing)'}))["results"]
            assert m["id"] in [h["id"] for h in hits]
            caps = await ok(s, "memory_capabilities")
            assert caps["agent_id"]


async def test_unsigned_links_without_identity(tmp_path) -> None:
    from tests.mcp.conftest import make_home

    h = make_home(tmp_path, identity=False)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_session(h) as s:
            a = await ok(s, "memory_store", {"content": "one"})
            b = await ok(s, "memory_store", {"content": "two"})
            link = await ok(s, "memory_link", {"src_id": a["id"], "dst_id": b["id"], "relation": "r"})
            assert link["attest_level"] == "unsigned"
            v = await ok(s, "memory_verify", {"link_id": link["link_id"]})
            assert v["signature_verified"] is False and v["reason"] == "link is unsigned"
            caps = await ok(s, "memory_capabilities")
            assert caps["key_fingerprint"] is None and caps["signing"] is False
