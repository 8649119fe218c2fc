from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from node import assemble
from node.config import NodeConfig
from node.service import Service
from tests.hooks.scripts import write_hooks_toml, write_scripts
from tests.node.conftest import config_on


@pytest.fixture
def cfg(request: pytest.FixtureRequest) -> NodeConfig:
    # Reload checks on every fire, quick daemon restarts: the tests wait on behaviour, never on a clock.
    return config_on(request, "sqlite", hooks={"reload_check_s": 0.01, "daemon_restart_min_s": 0.05,
                                               "daemon_restart_max_s": 0.2, "daemon_stop_grace_s": 2.0})


@pytest.fixture
def scripts(tmp_path: Path) -> tuple[Path, Path]:
    return write_scripts(tmp_path / "hooks")


@pytest.fixture
def hook_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "hook.log"
    monkeypatch.setenv("HOOK_LOG", str(path))
    return path


@pytest.fixture
async def open_service(cfg: NodeConfig) -> AsyncIterator[Callable[..., Any]]:
    """``await open_service(hooks)`` writes hooks.toml and opens a Service on it; all are closed after."""
    opened: list[Service] = []

    async def go(hooks: list[dict[str, Any]] | None = None) -> Service:
        if hooks is not None:
            cfg.home.mkdir(parents=True, exist_ok=True)
            write_hooks_toml(cfg.hooks_path, hooks)
        svc = await assemble.open_service(cfg, require_identity=True)
        opened.append(svc)
        return svc

    yield go
    for svc in opened:
        await svc.close()


def rows(cfg: NodeConfig, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(cfg.db_path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
