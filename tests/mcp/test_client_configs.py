"""docs/mcp.md's client configurations are what each client takes: every JSON block marked ``<!-- mcp-config:
CLIENT -->`` is checked against a schema written from that client's documentation (Claude Code's ``.mcp.json``:
stdio entries ``command``/``args``/``env`` with an optional ``"type": "stdio"``, HTTP entries ``"type": "http"`` and
``url``; Claude Desktop's ``claude_desktop_config.json``: stdio only; Cursor's ``mcp.json``: ``command``/``args``/
``env``/``envFile`` or ``url``/``headers``), and each stdio command, given a real home, starts an ``ai-memory mcp``
that answers ``initialize`` to the official SDK client; each HTTP URL, given a running node's port, answers too."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from testbed.mesh.local import node_command, node_env, wait_ready
from tests.layouts import new_layout
from tests.mcp.conftest import CALL_TIMEOUT_S, http_session, make_home

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "mcp.md"
WAIT_S = 60.0

_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_ARGS = {"type": "array", "items": {"type": "string"}}
_LOCAL_URL = {"type": "string", "pattern": r"^https?://"}


def _servers(entry: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["mcpServers"], "additionalProperties": False,
            "properties": {"mcpServers": {"type": "object", "minProperties": 1, "additionalProperties": entry}}}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "additionalProperties": False, "properties": properties}


# Each client's config file, as its documentation describes it (docs/mcp.md names the files).
SCHEMAS = {
    "claude-code": _servers({"oneOf": [
        _object(["command"], type={"const": "stdio"}, command={"type": "string", "minLength": 1}, args=_ARGS,
                env=_STRINGS),
        _object(["type", "url"], type={"enum": ["http", "sse"]}, url=_LOCAL_URL, headers=_STRINGS)]}),
    "claude-desktop": _servers(_object(["command"], command={"type": "string", "minLength": 1}, args=_ARGS,
                                       env=_STRINGS)),
    "cursor": _servers({"oneOf": [
        _object(["command"], command={"type": "string", "minLength": 1}, args=_ARGS, env=_STRINGS,
                envFile={"type": "string"}),
        _object(["url"], url=_LOCAL_URL, headers=_STRINGS)]}),
}


def documented_configs() -> list[tuple[str, dict[str, Any]]]:
    """(client, parsed JSON) for every ``<!-- mcp-config: CLIENT -->`` block of docs/mcp.md, in order."""
    blocks = re.findall(r"<!-- mcp-config: ([\w-]+) -->\n```json\n(.*?)\n```", DOC.read_text(), re.S)
    return [(client, json.loads(text)) for client, text in blocks]


CONFIGS = documented_configs()
IDS = [f"{client}-{'http' if 'url' in next(iter(c['mcpServers'].values())) else 'stdio'}" for client, c in CONFIGS]


def test_every_client_has_a_stdio_entry_and_the_http_clients_an_http_one() -> None:
    assert sorted(IDS) == ["claude-code-http", "claude-code-stdio", "claude-desktop-stdio", "cursor-http",
                           "cursor-stdio"]


@pytest.mark.parametrize(("client", "config"), CONFIGS, ids=IDS)
def test_each_block_is_what_its_client_takes(client: str, config: dict[str, Any]) -> None:
    jsonschema.validate(config, SCHEMAS[client])


def test_an_http_entry_without_type_is_refused_by_claude_codes_schema() -> None:
    """The entry docs/mcp.md used to give every client: Claude Code reads it as stdio and refuses it."""
    bare = {"mcpServers": {"ai-memory": {"url": "http://127.0.0.1:7445/mcp"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bare, SCHEMAS["claude-code"])
    jsonschema.validate(bare, SCHEMAS["cursor"])


def _entry(config: dict[str, Any]) -> dict[str, Any]:
    (entry,) = config["mcpServers"].values()
    return dict(entry)


async def _initialize(params: StdioServerParameters, errlog: Path) -> str:
    err = await asyncio.to_thread(open, errlog, "a")
    try:
        async with stdio_client(params, errlog=err) as (r, w):
            async with ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S) as session:
                result = await asyncio.wait_for(session.initialize(), CALL_TIMEOUT_S)
                tools = await asyncio.wait_for(session.list_tools(), CALL_TIMEOUT_S)
    finally:
        err.close()
    assert "memory_store" in {t.name for t in tools.tools}
    return result.server_info.name


STDIO = [(client, config) for client, config in CONFIGS if "command" in _entry(config)]


@pytest.mark.integration
@pytest.mark.parametrize(("client", "config"), STDIO, ids=[f"{c}-stdio" for c, _ in STDIO])
async def test_the_stdio_command_starts_an_mcp_server_that_answers_initialize(
        tmp_path: Path, client: str, config: dict[str, Any]) -> None:
    home = make_home(tmp_path)
    entry = _entry(config)
    ai_memory = Path(sys.executable).with_name("ai-memory")
    assert entry["command"] == "/abs/path/.venv/bin/ai-memory"
    args = [str(home.toml) if a == "/abs/path/node.toml" else a for a in entry["args"]]
    # As the clients start it: the absolute command, no PATH of the user's shell, another working directory.
    params = StdioServerParameters(command=str(ai_memory), args=args, env={**entry.get("env", {})}, cwd=str(tmp_path))
    assert await _initialize(params, tmp_path / "mcp-stderr.log") == "ai-memory"


HTTP = [(client, config) for client, config in CONFIGS if "url" in _entry(config)]


async def _list_tools(url: str) -> int:
    async with http_session(url) as session:  # initialize, as every client begins
        return len((await session.list_tools()).tools)


@pytest.mark.integration
def test_the_http_url_answers_initialize_on_a_running_node(short_tmp: Path) -> None:
    layout = new_layout(short_tmp / "tb", 2)
    spec = layout.node(1)
    with open(spec.home / "node.log", "ab") as log:
        proc = subprocess.Popen(node_command(spec), env=node_env(spec), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_ready(layout, [spec], {1: proc}, timeout_s=WAIT_S, want_links=False)
        for _, config in HTTP:
            url = _entry(config)["url"].replace("<http_port>", str(spec.mcp_http_port))
            assert asyncio.run(_list_tools(url)) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
