"""Operator papercuts, each pinned: the home a config file implies, an MCP server that will not serve an
empty default home, one-line errors for a port or socket in use, private database files, log formats."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from node.config import ConfigError, from_dict, load_config
from node.log import JsonLines, TextLines
from storage.db import Database
from testbed.mesh import build_layout

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 60.0


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)


def last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    return stderr.strip().splitlines()[-1]


def test_home_defaults_to_the_config_files_directory(tmp_path: Path) -> None:
    (tmp_path / "n1").mkdir()
    toml = tmp_path / "n1" / "node.toml"
    toml.write_text('agent_id = "ai:n1@lab"\n', encoding="utf-8")
    assert load_config(toml, env={}).home == tmp_path / "n1"
    toml.write_text('agent_id = "ai:n1@lab"\nhome = "data-home"\n', encoding="utf-8")
    assert load_config(toml, env={}).home == tmp_path / "n1" / "data-home"
    assert load_config(toml, env={"AI_MEMORY_HOME": str(tmp_path / "env")}).home == tmp_path / "env"


def test_mcp_refuses_an_empty_default_home(tmp_path: Path) -> None:
    (tmp_path / ".config" / "ai-memory").mkdir(parents=True)
    p = run(["-m", "node.cli", "mcp"], {"HOME": str(tmp_path)})
    assert p.returncode == 1 and p.stdout == ""
    assert re.fullmatch(r"ai-memory: error \[home_empty\]: .*--config.*", last_line(p.stderr))
    assert not (tmp_path / ".config" / "ai-memory" / "data").exists()


def test_mcp_refuses_a_home_that_does_not_exist(tmp_path: Path) -> None:
    p = run(["-m", "node.cli", "mcp", "--home", str(tmp_path / "typo")], {"HOME": str(tmp_path)})
    assert p.returncode == 1 and "[home_not_found]" in last_line(p.stderr)
    assert not (tmp_path / "typo").exists()


def test_serve_on_a_port_in_use_is_one_line_error(tmp_path: Path) -> None:
    spec = build_layout(tmp_path / "m", 2, mcp_http=False).node(1)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", spec.port))
        taken.listen()
        p = run(["-m", "node.cli", "--config", str(spec.config_path), "serve"], {"AI_MEMORY_HOME": str(spec.home)})
    assert p.returncode == 1
    assert last_line(p.stderr).startswith(f"ai-memory: error [port_in_use]: 127.0.0.1:{spec.port} (mesh.listen_port)")


def test_serve_on_a_socket_in_use_is_one_line_error(tmp_path: Path) -> None:
    spec = build_layout(tmp_path / "m", 2, mcp_http=False).node(1)
    (spec.home / "run").mkdir(exist_ok=True)
    with socket.socket(socket.AF_UNIX) as taken:
        taken.bind(str(spec.home / "run" / "node.sock"))
        taken.listen()
        p = run(["-m", "node.cli", "--config", str(spec.config_path), "serve"], {"AI_MEMORY_HOME": str(spec.home)})
    assert p.returncode == 1
    assert last_line(p.stderr).startswith("ai-memory: error [socket_in_use]: ")


async def test_database_files_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "data" / "memory.db"
    db = await Database.open(path)
    try:
        await db.write(lambda conn: conn.execute("SELECT 1").fetchone())
        for p in (path, path.with_name("memory.db-wal"), path.with_name("memory.db-shm")):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    finally:
        await db.close()
    path.chmod(0o644)
    db = await Database.open(path)
    await db.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def _record(**ev: object) -> logging.LogRecord:
    record = logging.LogRecord("node", logging.INFO, __file__, 1, "link_up", None, None)
    record.created = 1_767_225_600.5  # 2026-01-01T00:00:00.5Z
    record.ev = ev
    return record


def test_json_log_lines_carry_iso_8601_utc_times() -> None:
    line = json.loads(JsonLines("ai:n1@lab").format(_record(peer="ai:n2@lab")))
    assert line["ts"] == "2026-01-01T00:00:00.500Z" and line["event"] == "link_up" and line["peer"] == "ai:n2@lab"


def test_text_log_format_is_one_readable_line() -> None:
    text = TextLines().format(_record(peer="ai:n2@lab", error="connection refused"))
    assert text == '2026-01-01T00:00:00.500Z info    node link_up peer=ai:n2@lab error="connection refused"'
    assert from_dict({"log": {"format": "text"}}, env={}).log.format == "text"
    with pytest.raises(ConfigError):
        from_dict({"log": {"format": "xml"}}, env={})


def test_log_level_from_the_environment_overrides_the_file() -> None:
    assert from_dict({"log": {"level": "info"}}, env={"AI_MEMORY_LOG_LEVEL": "DEBUG"}).log.level == "debug"
    with pytest.raises(ConfigError) as e:
        from_dict({}, env={"AI_MEMORY_LOG_LEVEL": "loud"})
    assert "AI_MEMORY_LOG_LEVEL" in e.value.message


async def test_writer_busy_time_is_zero_when_idle_and_grows_while_a_batch_runs(tmp_path: Path) -> None:
    import asyncio
    import threading

    db = await Database.open(tmp_path / "data" / "memory.db")
    entered, release = threading.Event(), threading.Event()

    def stuck(conn) -> None:
        entered.set()
        release.wait(30)

    try:
        assert db.writer_busy_s() == 0.0
        job = asyncio.ensure_future(db.write(stuck))
        assert await asyncio.to_thread(entered.wait, 30)
        assert db.writer_busy_s() > 0.0  # what /readyz compares with mesh.ready_writer_stuck_s
        release.set()
        await job
    finally:
        release.set()
        await db.close()
