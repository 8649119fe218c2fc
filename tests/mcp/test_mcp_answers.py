"""Every MCP message a door reads is answered: raw lines on a real ``ai-memory mcp`` process's stdin that the
SDK cannot take (not JSON, arguments nested hundreds of levels deep, lone surrogate escapes) each get their
JSON-RPC error within a bounded wait, and the SDK session on the same stdin keeps serving after each one.
The HTTP door and the node's local socket are tested on a real node (tests/integration/test_mcp_answers_node.py)."""

from __future__ import annotations

import json
import os
import sys

import anyio
import mcp_types as types
import pytest

from node.mcp.edge import refusal
from tests.mcp.conftest import ROOT, Home, ok
from tests.mcp.spliced import spliced_stdio

TEST_TIMEOUT_S = 120


def nested(levels: int) -> dict:
    value: dict = {"content": "x"}
    for _ in range(levels):
        value = {"a": value}
    return value


def call(req_id: str, arguments_json: str, tool: str = "memory_store") -> str:
    """A tools/call line with ``arguments_json`` spliced in as written (escapes and all)."""
    return (f'{{"jsonrpc": "2.0", "id": "{req_id}", "method": "tools/call", '
            f'"params": {{"name": "{tool}", "arguments": {arguments_json}}}}}')


# (raw line, the code that answers it, the id it is answered with)
BAD_LINES = [
    ('{"jsonrpc": "2.0", "id": "raw-1", "method": ', types.PARSE_ERROR, None),      # cut short
    ("hello, server", types.PARSE_ERROR, None),                                    # not JSON at all
    ('{"jsonrpc": "2.0", "id": "raw-2", "method": "tools/call",}', types.PARSE_ERROR, None),  # trailing comma
    (call("raw-3", json.dumps({"content": "x", "tags": [nested(300)]})), types.INVALID_PARAMS, "raw-3"),
    (call("raw-4", '{"content": "a\\ud800b"}'), types.INVALID_PARAMS, "raw-4"),   # lone high surrogate
    (call("raw-5", '{"\\udc00": "a"}'), types.INVALID_PARAMS, "raw-5"),           # lone low surrogate, in a key
    (call("raw-6", '{"content": "a\\ud800\\u0041"}'), types.INVALID_PARAMS, "raw-6"),  # high then not low
    (call("raw-7", "[" * 5000 + "]" * 5000), types.INVALID_PARAMS, "raw-7"),     # past the stdlib parser too
    ('{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}', types.INVALID_REQUEST, None),  # an id that is no text
    ('{"id": "raw-8", "params": {}}', types.INVALID_REQUEST, "raw-8"),             # JSON, not JSON-RPC
    ('{"jsonrpc": "2.0", "id": "raw-9", "method": 5}', types.INVALID_REQUEST, "raw-9"),
]


def stdio_argv(h: Home) -> tuple[list[str], dict[str, str]]:
    env = {"AI_MEMORY_HOME": str(h.cfg.home), "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    return [sys.executable, "-m", "node.cli", "mcp", "--config", str(h.toml)], env


async def test_every_bad_line_is_answered_and_the_session_keeps_serving(home: Home) -> None:
    argv, env = stdio_argv(home)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with spliced_stdio(argv, env, ROOT, home.cfg.home / "mcp-stderr.log") as s:
            for n, (line, code, answered_id) in enumerate(BAD_LINES):
                answer = await s.answer(line)
                assert answer["id"] == answered_id and answer["error"]["code"] == code, (line[:80], answer)
                stored = await ok(s.session, "memory_store", {"content": f"after bad line {n}"})
                assert (await ok(s.session, "memory_get", {"id": stored["id"]}))["content"] == f"after bad line {n}"
            listed = await ok(s.session, "memory_list", {"limit": 100})
            assert sorted(m["content"] for m in listed["results"]) == sorted(
                f"after bad line {n}" for n in range(len(BAD_LINES)))  # no bad line stored anything


async def test_the_errors_say_what_cannot_be_taken(home: Home) -> None:
    argv, env = stdio_argv(home)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with spliced_stdio(argv, env, ROOT, home.cfg.home / "mcp-stderr.log") as s:
            deep = (await s.answer(call("raw-deep", json.dumps({"content": "x", "tags": [nested(300)]}))))["error"]
            message = deep["message"]
            assert message.startswith("Invalid params: params.arguments.tags[0].a.a") and " 305 levels " in message
            lone = (await s.answer(call("raw-lone", '{"content": "a\\ud800b"}')))["error"]
            assert lone["message"] == ("Invalid params: params.arguments.content holds a lone surrogate escape, "
                                       "which is not Unicode text")


async def test_a_paired_surrogate_escape_is_text_and_is_stored(home: Home) -> None:
    argv, env = stdio_argv(home)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with spliced_stdio(argv, env, ROOT, home.cfg.home / "mcp-stderr.log") as s:
            answer = await s.answer(call("raw-pair", '{"content": "smile \\ud83d\\ude00"}'))
            assert "error" not in answer and not answer["result"].get("isError"), answer
            stored = answer["result"]["structuredContent"]
            assert (await ok(s.session, "memory_get", {"id": stored["id"]}))["content"] == "smile \U0001f600"


async def test_a_bad_notification_gets_no_answer_and_the_next_request_gets_its_own(home: Home) -> None:
    """JSON-RPC answers no notification: the first raw answer after a bad one is the next request's."""
    argv, env = stdio_argv(home)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with spliced_stdio(argv, env, ROOT, home.cfg.home / "mcp-stderr.log") as s:
            await s.write('{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"x": "\\ud800"}}')
            answer = await s.answer(call("raw-next", '{"content": "\\udfff"}'))
            assert answer["id"] == "raw-next" and answer["error"]["code"] == types.INVALID_PARAMS
            assert (await ok(s.session, "memory_list", {"limit": 1}))["results"] is not None


# ---- the check itself, on plain values ------------------------------------------------------

@pytest.mark.parametrize(("line", "code", "answered_id"), BAD_LINES)
def test_refusal_codes_and_ids(line: str, code: int, answered_id: str | None) -> None:
    refused = refusal(line)
    assert refused is not None and refused.code == code and refused.error.id == answered_id
    assert not refused.notification
    assert refusal(line.encode()) == refused  # an HTTP body is bytes


@pytest.mark.parametrize("message", [
    {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "memory_store",
                                                                   "arguments": {"content": "x", "tags": ["a"]}}},
    {"jsonrpc": "2.0", "id": "s", "method": "tools/call", "params": {"arguments": nested(150)}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 3, "result": {}},
    {"jsonrpc": "2.0", "id": 4, "error": {"code": -32601, "message": "no"}},
    {"jsonrpc": "2.0", "id": 5, "method": "x", "params": {"s": "smile \U0001f600 and \u00e9"}},
])
def test_what_the_sdk_takes_is_not_refused(message: dict) -> None:
    assert refusal(json.dumps(message)) is None
    assert refusal(json.dumps(message, ensure_ascii=False).encode()) is None


def test_a_lone_surrogate_outside_params_is_an_invalid_request_and_a_notification_is_flagged() -> None:
    refused = refusal('{"jsonrpc": "2.0", "id": 7, "method": "\\ud800"}')
    assert refused is not None and refused.code == types.INVALID_REQUEST and refused.error.id == 7
    note = refusal('{"jsonrpc": "2.0", "method": "notifications/x", "params": {"a": "\\ud800"}}')
    assert note is not None and note.notification and note.code == types.INVALID_PARAMS
