"""A node whose disk fills up, on a real small filesystem (a tmpfs mounted by the test holding the node's home):
writes are refused storage_full (retryable), the node is not ready while it lasts and says so once, the CLI beside
it is refused the same way, a WAL checkpoint on the full disk damages nothing, and once space returns the node is
ready again by itself, a write succeeds, and every write acknowledged before is stored once, also across a stop
while the disk was full (its closing checkpoint could not run)."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from node.config import NodeConfig, load_config
from node.errors import ServiceError
from node.mcp.socket import ask_node
from tests.faults import ai_memory, fill, http_get, node_home, poll, running_node, tmpfs

# Room for the node's home, its store and some memories; the rest is filled by the test.
TMPFS_BYTES = 8 * 1024 * 1024
# Writes tried at most before the disk must have refused one (each memory is a few KB of WAL frames).
MAX_WRITES = 5_000


async def store(cfg: NodeConfig, i: int) -> str:
    """memory_store through the node's local socket (a client of the node); the id it acknowledged."""
    got = await ask_node(cfg, "memory_store", {"content": f"memory {i} " + "filler words " * 30})
    assert isinstance(got, dict)
    return str(got["id"])


async def write_until_full(cfg: NodeConfig, acked: list[str]) -> ServiceError:
    for i in range(MAX_WRITES):
        try:
            acked.append(await store(cfg, len(acked) + i))
        except ServiceError as e:
            return e
    pytest.fail(f"{MAX_WRITES} writes fitted on a full disk")


async def readiness(cfg: NodeConfig) -> tuple[int, list[dict[str, Any]]]:
    got = await http_get(cfg.mesh.health_port, "/readyz")
    assert got is not None
    return got[0], json.loads(got[1])["reasons"]


def stored_once(db_path: Path, ids: list[str]) -> list[str]:
    """The ids not stored exactly once; and the file must pass quick_check."""
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        return [i for i in ids if conn.execute("SELECT count(*) FROM memories WHERE id = ?", (i,)).fetchone()[0] != 1]
    finally:
        conn.close()


def checkpoint(db_path: Path) -> str:
    """A WAL checkpoint from another connection: what SQLite answered (on a full disk it cannot write the pages)."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        return repr(conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
    except sqlite3.Error as e:
        return f"{getattr(e, 'sqlite_errorname', '')}: {e}"
    finally:
        conn.close()


def events(caplog: pytest.LogCaptureFixture, name: str) -> int:
    return sum(1 for r in caplog.records if r.getMessage() == name)


async def test_a_full_disk_refuses_writes_retryably_and_the_node_is_ready_again_when_space_returns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with tmpfs(tmp_path / "fs", TMPFS_BYTES) as fs:
        config = node_home(fs / "h")
        cfg = load_config(config, env={})
        filler = fs / "filler"
        acked: list[str] = []
        async with running_node(cfg):
            for i in range(20):
                acked.append(await store(cfg, i))
            await asyncio.to_thread(fill, filler)
            refused = await write_until_full(cfg, acked)
            assert refused.code == "storage_full" and refused.http_status == 503
            assert str(cfg.db_path) in refused.message
            for i in range(5):  # refused again, logged once
                with pytest.raises(ServiceError) as again:
                    await store(cfg, i)
                assert again.value.code == "storage_full"
            status, reasons = await readiness(cfg)
            assert status == 503 and [r["code"] for r in reasons] == ["storage_full"]
            metrics = await http_get(cfg.mesh.health_port, "/metrics")
            assert metrics is not None and 'aimem_storage_condition{code="storage_full"} 1.0' in metrics[1]

            beside = await asyncio.to_thread(ai_memory, config, "store", "from the CLI beside the node")
            assert beside.returncode == 1 and "Traceback" not in beside.stderr
            assert beside.stderr.splitlines()[-1].startswith("ai-memory: error [storage_full]: ")
            read = await asyncio.to_thread(ai_memory, config, "get", acked[0], "--json")
            assert read.returncode == 0 and json.loads(read.stdout)["id"] == acked[0]
            answered = await asyncio.to_thread(checkpoint, cfg.db_path)
            assert await asyncio.to_thread(stored_once, cfg.db_path, acked) == [], answered

            await asyncio.to_thread(filler.unlink)
            await poll(lambda: _ready(cfg), "the node ready again once space returned")
            acked.append(await store(cfg, -1))
            assert events(caplog, "storage_full") == 1 and events(caplog, "storage_space_available") == 1

            # Full again, and the node stops while it is: its closing checkpoint cannot write the pages.
            await asyncio.to_thread(fill, filler)
            assert (await write_until_full(cfg, acked)).code == "storage_full"
        await asyncio.to_thread(filler.unlink)
        assert await asyncio.to_thread(stored_once, cfg.db_path, acked) == []
        async with running_node(cfg):
            assert (await readiness(cfg))[0] == 200
            acked.append(await store(cfg, -2))
        assert await asyncio.to_thread(stored_once, cfg.db_path, acked) == []


async def _ready(cfg: NodeConfig) -> bool:
    return (await readiness(cfg))[0] == 200
