from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from mesh import keys
from node import assemble
from node.config import NodeConfig
from node.service import Service
from tests.node.conftest import AGENT, BACKENDS, make_config
from tests.pg import pg_cluster  # noqa: F401  (pytest finds fixtures by name)


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
def cfg(tmp_path: Path, request: pytest.FixtureRequest) -> NodeConfig:
    """On each storage backend in turn. The gate looks at the rules file on every call: tests change it
    and never wait on a clock."""
    sections: dict[str, Any] = {}
    if request.param == "postgres":
        cluster = request.getfixturevalue("pg_cluster")
        name = cluster.create_db()
        request.addfinalizer(lambda: cluster.drop_db(name))
        sections = {"storage": {"backend": "postgres", "dsn": cluster.dsn(name)}}
    c = make_config(tmp_path / "home", permissions={"reload_check_s": 1e-9}, **sections)
    keys.generate_identity(c.keys_dir, AGENT)
    return c


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
