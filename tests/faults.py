"""Real faults for the storage tests: pages of a SQLite file overwritten in its middle, a small filesystem that
fills up, and a node home with its TLS files to run a node on them (in this process, the CLI beside it in its
own)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mesh import ca, keys
from node.config import NodeConfig
from node.node import Node, Signals
from testbed.env import disk
from testbed.env.disk import fill as fill  # the tests that fill a disk import it from here
from testbed.errors import TestbedError

ROOT = Path(__file__).resolve().parents[1]

AGENT = "ai:faults@lab"
# What a damaged page is overwritten with: not a b-tree page header, cells pointing out of the page.
GARBAGE = 0xA5


def btree_pages(path: Path, name: str) -> list[int]:
    """Every page of the b-tree of table or index ``name`` in the (checkpointed) file at ``path``, root first."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()
    finally:
        conn.close()
    root = 1 if name == "sqlite_master" else row[0]
    data = path.read_bytes()
    size = int.from_bytes(data[16:18], "big")
    size = 65536 if size == 1 else size
    pages, todo = [], [root]
    while todo:
        page = todo.pop()
        pages.append(page)
        start = (page - 1) * size
        head = start + (100 if page == 1 else 0)
        if data[head] in (0x02, 0x05):  # interior index / table page: its children
            cells = int.from_bytes(data[head + 3:head + 5], "big")
            todo.append(int.from_bytes(data[head + 8:head + 12], "big"))
            for i in range(cells):
                at = start + int.from_bytes(data[head + 12 + 2 * i:head + 14 + 2 * i], "big")
                todo.append(int.from_bytes(data[at:at + 4], "big"))
    return pages


def damage(path: Path, name: str, pages: int = 1) -> list[int]:
    """Overwrite ``pages`` pages from the middle of ``name``'s b-tree (never page 1, the header) with garbage,
    keeping each page's first 8 bytes; returns the page numbers. The file must be closed and checkpointed."""
    tree = [p for p in btree_pages(path, name) if p != 1]
    assert len(tree) >= pages, f"{name} has only {len(tree)} pages"
    middle = sorted(tree)[len(tree) // 2:len(tree) // 2 + pages]
    size = int.from_bytes(path.read_bytes()[16:18], "big")
    with open(path, "r+b") as f:
        for page in middle:
            f.seek((page - 1) * size + 8)
            f.write(bytes([GARBAGE]) * (size - 16))
    return middle


def put_back(path: Path, sound: bytes, pages: list[int]) -> None:
    """Write ``pages`` of the file at ``path`` back from ``sound`` (its bytes before the damage)."""
    size = int.from_bytes(sound[16:18], "big")
    with open(path, "r+b") as f:
        for page in pages:
            f.seek((page - 1) * size)
            f.write(sound[(page - 1) * size:page * size])


def checkpointed(path: Path) -> None:
    """Fold the WAL into the file (no other connection may be open), so its pages can be damaged in place."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


@contextlib.contextmanager
def tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``where`` for the block (testbed/env/disk.py); skips the test (saying
    why) where mounting is refused (not root, no CAP_SYS_ADMIN in a container)."""
    with contextlib.ExitStack() as stack:
        try:
            fs = stack.enter_context(disk.tmpfs(where, size_bytes))
        except TestbedError as e:
            pytest.skip(e.message)
        yield fs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_home(home: Path, *, storage: str = "") -> Path:
    """A node home with an identity, its mesh CA and certificate, and a config with no peers (nothing but the
    store decides readiness) serving /readyz on a free health port; returns the config file."""
    ident = keys.generate_identity(home / "keys", AGENT)
    (home / "tls").mkdir(parents=True, exist_ok=True)
    ca.init_ca(home / "ca")
    ca.issue_node_cert(home / "ca", AGENT, ident.pub_path, home / "tls" / "node.crt")
    shutil.copyfile(home / "ca" / ca.CA_CERT_NAME, home / "tls" / "ca.crt")
    config = home / "config.toml"
    config.write_text(f'agent_id = "{AGENT}"\nhome = "{home}"\n\n[mesh]\nlisten_host = "127.0.0.1"\n'
                      f"listen_port = {free_port()}\nhealth_port = {free_port()}\n\n[storage]\n{storage}\n",
                      encoding="utf-8")
    return config


@contextlib.asynccontextmanager
async def running_node(cfg: NodeConfig, *, ready_within_s: float = 30.0) -> AsyncIterator[Node]:
    """A node on ``cfg`` in this process until the block ends (then drained as SIGTERM would); it is up once it
    has written run/node.json (after its listeners and local socket) and its health port answers."""
    node = await Node.open(cfg, lambda: cfg)
    signals = Signals()
    task = asyncio.create_task(node.run(signals), name="node")
    status = cfg.home / "run" / "node.json"
    try:
        deadline = time.monotonic() + ready_within_s
        while not await asyncio.to_thread(status.exists) or await http_get(cfg.mesh.health_port, "/healthz") is None:
            assert not task.done(), f"the node ended: {task.exception() if not task.cancelled() else 'cancelled'}"
            assert time.monotonic() < deadline, f"the node did not answer /healthz within {ready_within_s} s"
            await asyncio.sleep(0.05)
        yield node
    finally:
        signals.stop_for("SIGTERM")
        await asyncio.wait_for(task, 60.0)


async def http_get(port: int, path: str) -> tuple[int, str] | None:
    """(status, body) of GET http://127.0.0.1:<port><path>, or None when nothing answers."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as s, \
                s.get(f"http://127.0.0.1:{port}{path}") as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, OSError):
        return None


async def poll(predicate: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 30.0) -> Any:
    """Await ``predicate()`` until it returns something truthy (returned), or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what} (last: {got!r})")
        await asyncio.sleep(0.1)


def ai_memory(config: Path, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``ai-memory --config <config> <args>`` as its own process (beside a node this test runs)."""
    env = {k: v for k, v in os.environ.items() if k != "AI_MEMORY_HOME"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "node.cli", "--config", str(config), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
