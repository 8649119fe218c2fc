from collections.abc import Sequence
from pathlib import Path

import pytest

from mesh import keys
from node.assemble import open_service
from node.cli import main
from node.config import NodeConfig, from_dict

BACKENDS = ("sqlite", "postgres")

AGENT = "ai:test-node@lab"


class Acks:
    """An outbox sender's listener for tests: the correlation ids ACKed (into ``acked``) and the peers that refused
    links.put."""

    def __init__(self, acked: list[str] | None = None) -> None:
        self.acked = acked if acked is not None else []
        self.refused: list[str] = []

    async def on_ack(self, peer: str, correlation_ids: Sequence[str]) -> None:
        self.acked.extend(correlation_ids)

    def on_ack_latency(self, peer: str, seconds: float) -> None:
        pass

    def link_batches_refused(self, peer: str) -> None:
        self.refused.append(peer)


def make_config(home: Path, **sections) -> NodeConfig:
    return from_dict({"agent_id": AGENT, "home": str(home), **sections}, env={})


def config_on(request: pytest.FixtureRequest, backend: str, **sections) -> NodeConfig:
    """The test's node config (``<tmp_path>/home``, ``sections`` as given) with an identity, on ``backend``:
    on Postgres a fresh database of the worker's cluster, dropped after the test. Each directory's ``cfg``."""
    if backend == "postgres":
        cluster = request.getfixturevalue("pg_cluster")
        name = cluster.create_db()
        request.addfinalizer(lambda: cluster.drop_db(name))
        sections = {**sections, "storage": {"backend": "postgres", "dsn": cluster.dsn(name)}}
    c = make_config(request.getfixturevalue("tmp_path") / "home", **sections)
    keys.generate_identity(c.keys_dir, AGENT)
    return c


@pytest.fixture(params=BACKENDS)
def cfg(request: pytest.FixtureRequest) -> NodeConfig:
    """A node config with an identity, on each storage backend in turn (Postgres: a fresh database)."""
    return config_on(request, request.param)


@pytest.fixture
async def svc(cfg: NodeConfig):
    s = await open_service(cfg, require_identity=True)
    yield s
    await s.close()


def dump_tables(cfg: NodeConfig, tables: tuple[str, ...]) -> list:
    """Every row of ``tables`` behind the service's back, on the config's backend."""
    if cfg.storage.backend == "postgres":
        from storage.pg import connect
        with connect(cfg.storage.dsn) as conn:
            return [conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in tables]
    import sqlite3
    conn = sqlite3.connect(cfg.db_path)
    try:
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in tables]
    finally:
        conn.close()


def tamper(cfg: NodeConfig, sql: str, params: tuple = (), *, drop_trigger: str | None = None) -> None:
    """Change stored rows behind the service's back (``?`` placeholders), optionally dropping a
    signed_events trigger first, on the config's backend."""
    if cfg.storage.backend == "postgres":
        from storage.pg import PgConn, connect
        conn = PgConn(connect(cfg.storage.dsn))
        try:
            if drop_trigger:
                conn.execute(f"DROP TRIGGER {drop_trigger} ON signed_events")
            conn.execute(sql, params)
        finally:
            conn.close()
        return
    import sqlite3
    lite = sqlite3.connect(cfg.db_path)
    try:
        if drop_trigger:
            lite.execute(f"DROP TRIGGER {drop_trigger}")
        lite.execute(sql, params)
        lite.commit()
    finally:
        lite.close()


# The node of a bare home for CLI tests (`home`).
LAB_NODE = "ai:node-1@lab"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``ai-memory ARGS`` in this process: its exit code, stdout and stderr."""
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A node home with only its identity (no config file, no store)."""
    h = tmp_path / "n1"
    keys.generate_identity(h / "keys", LAB_NODE)
    return h
