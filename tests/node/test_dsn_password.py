"""A Postgres DSN's password is in no error the CLI prints, whatever form the DSN takes and however the connection
fails: a real cluster that checks passwords (scram-sha-256 on its socket), a wrong one, a URL, a DSN libpq cannot
parse, a database that is not there, a server that is not there."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from mesh import keys
from testbed.env import doctor
from testbed.env.postgres import Cluster, throwaway_cluster
from tests.node_access import cli_in_process

PASSWORD = "Pw-s3cret-7f2a"
AGENT = "ai:node-1@lab"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A cluster of its own whose socket asks every role but postgres for its password."""
    if reason := doctor.missing("postgres"):
        pytest.skip(reason)
    with throwaway_cluster() as c:
        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE aimem LOGIN PASSWORD '{PASSWORD}'")
            conn.execute("CREATE DATABASE aimem OWNER aimem")
        hba = c.data / "pg_hba.conf"
        hba.write_text("local all postgres trust\nlocal all all scram-sha-256\n", encoding="utf-8")
        if os.geteuid() == 0:  # the server runs as postgres
            shutil.chown(hba, "postgres", "postgres")
        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield c


def _dsns(c: Cluster) -> dict[str, str]:
    where = f"host={c.root} port={c.port}"
    return {
        "right": f"{where} dbname=aimem user=aimem password={PASSWORD}",
        "wrong password": f"{where} dbname=aimem user=aimem password={PASSWORD}x",
        "url": f"postgresql://aimem:{PASSWORD}x@/aimem?host={c.root}&port={c.port}",
        "unparseable": f"{where} dbname=aimem user=aimem password={PASSWORD} stray",
        "unknown option": f"{where} dbname=aimem user=aimem password={PASSWORD} colour=blue",
        "no database": f"{where} dbname=nosuch user=aimem password={PASSWORD}",
        "no server": f"host=/nonexistent port=5 dbname=aimem user=aimem password={PASSWORD}",
    }


@pytest.mark.parametrize("form", ["right", "wrong password", "url", "unparseable", "unknown option", "no database",
                                  "no server"])
def test_the_password_is_in_no_cli_output(cluster: Cluster, tmp_path: Path, form: str) -> None:
    home = tmp_path / "n1"
    keys.generate_identity(home / "keys", AGENT)
    config = home / "config.toml"
    config.write_text(f'agent_id = "{AGENT}"\n[storage]\nbackend = "postgres"\ndsn = """{_dsns(cluster)[form]}"""\n',
                      encoding="utf-8")
    said = []
    for command in (["store", "hello"], ["list"], ["recall", "hello"], ["status"], ["doctor"]):
        rc, out, err = cli_in_process(config, home, *command, json=False)
        said.append(f"{command[0]} -> {rc}: {out} {err}")
        assert (rc == 1) == (form != "right") or command == ["status"], said[-1]
    assert [s for s in said if PASSWORD in s] == []
    if form != "right":
        assert all("[storage_unavailable]" in s for s in said), said
