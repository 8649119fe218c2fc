from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from node import assemble
from node.config import NodeConfig
from node.service import Service
from tests.node.conftest import BACKENDS, config_on


def write_rules(cfg: NodeConfig, text: str) -> None:
    cfg.home.mkdir(parents=True, exist_ok=True)
    cfg.permissions_path.write_text(text, encoding="utf-8")


def rows(cfg: NodeConfig, sql: str) -> list[tuple[Any, ...]]:
    """``sql``'s rows read behind the service's back, on the config's backend."""
    if cfg.storage.backend == "postgres":
        from storage.pg import connect
        with connect(cfg.storage.dsn) as pg:
            return [tuple(r) for r in pg.execute(sql).fetchall()]
    with sqlite3.connect(f"{cfg.db_path.as_uri()}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture(params=BACKENDS)
def cfg(request: pytest.FixtureRequest) -> NodeConfig:
    """On each storage backend in turn. The gate looks at the rules file on every call: tests change it
    and never wait on a clock."""
    return config_on(request, request.param, permissions={"reload_check_s": 1e-9})


@pytest.fixture
async def open_service(cfg: NodeConfig) -> AsyncIterator[Callable[..., Any]]:
    """``await open_service(rules_toml)`` writes permissions.toml and opens a Service on it."""
    opened: list[Service] = []

    async def go(rules: str | None = None) -> Service:
        if rules is not None:
            write_rules(cfg, rules)
        svc = await assemble.open_service(cfg, require_identity=True)
        opened.append(svc)
        return svc

    yield go
    for svc in opened:
        await svc.close()


# The rules file that asks for approval of every store into namespace "team" (and nothing else).
ASK_TEAM_STORES = """
mode = "enforce"
[[rules]]
agent = "*"
namespace = "team"
operations = ["store"]
action = "ask"
"""
