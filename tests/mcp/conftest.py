"""Shared pieces for the MCP tests: a node home with an identity, its TOML file, and SDK client sessions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from mesh import keys
from node.assemble import open_service
from node.config import NodeConfig, from_dict

AGENT = "ai:mcp-test@lab"
ROOT = Path(__file__).resolve().parents[2]
# Per-request bound for every client call; the whole test is bounded by CALL_TIMEOUT_S multiples too.
CALL_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Home:
    cfg: NodeConfig
    toml: Path


def make_home(root: Path, *, identity: bool = True) -> Home:
    # Short paths: a Unix socket path must stay under ~100 bytes.
    home = root / "h"
    home.mkdir(parents=True, exist_ok=True)
    cfg = from_dict({"agent_id": AGENT, "home": str(home)}, env={})
    if identity:
        keys.generate_identity(cfg.keys_dir, AGENT)
    toml = home / "node.toml"
    toml.write_text(f'agent_id = "{AGENT}"\nhome = "{home}"\n', encoding="utf-8")
    return Home(cfg, toml)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return make_home(tmp_path)


@pytest.fixture
async def service(home: Home):
    svc = await open_service(home.cfg, require_identity=True)
    try:
        yield svc
    finally:
        await svc.close()


def stdio_params(h: Home) -> StdioServerParameters:
    """``ai-memory mcp --config <toml>`` as a subprocess, via the module entry that behaves the same."""
    env = {"AI_MEMORY_HOME": str(h.cfg.home), "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    return StdioServerParameters(command=sys.executable, args=["-m", "node.cli", "mcp", "--config", str(h.toml)],
                                 env=env, cwd=str(ROOT))


@contextlib.asynccontextmanager
async def stdio_session(h: Home, message_handler: Any = None) -> AsyncIterator[ClientSession]:
    """``message_handler`` (optional) is handed every notification the server sends."""
    errlog = await asyncio.to_thread(open, h.cfg.home / "mcp-stderr.log", "a")
    try:
        async with stdio_client(stdio_params(h), errlog=errlog) as (r, w):
            async with ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S,
                                     message_handler=message_handler) as session:
                await session.initialize()
                yield session
    finally:
        errlog.close()


@contextlib.asynccontextmanager
async def http_session(url: str, message_handler: Any = None) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(url) as (r, w):
        async with ClientSession(r, w, read_timeout_seconds=CALL_TIMEOUT_S,
                                 message_handler=message_handler) as session:
            await session.initialize()
            yield session


async def ok(session: ClientSession, tool: str, args: dict | None = None) -> dict:
    """Call a tool that must succeed; returns its structured content."""
    res = await session.call_tool(tool, args or {})
    assert not res.is_error, f"{tool} failed: {res.content[0].text}"
    assert res.content and res.content[0].type == "text"
    return res.structured_content


async def err(session: ClientSession, tool: str, args: dict | None) -> str:
    """Call a tool that must fail; returns the error code from the ``[code] message`` text."""
    res = await session.call_tool(tool, args)
    assert res.is_error, f"{tool} unexpectedly succeeded: {res.content[0].text}"
    text = res.content[0].text
    assert text.startswith("[") and "] " in text, text
    code = text[1:text.index("]")]
    assert res.structured_content["error"]["code"] == code
    return code
