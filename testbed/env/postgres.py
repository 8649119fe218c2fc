"""A throwaway PostgreSQL 15 cluster (the tests' fixtures and the knowledge-graph bench use it): initdb + pg_ctl
(as the `postgres` user when run as root), a Unix socket in a temp dir, no TCP; stopped and removed on exit,
always. The server binaries are found where testbed/env/doctor.py says (``PG_BIN``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from testbed.env import doctor

# Bounds on the cluster's own commands; a healthy initdb/start/stop takes a few seconds.
PG_CMD_TIMEOUT_S = 120


@dataclass(frozen=True)
class Cluster:
    root: Path
    port: int = 5432

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.root} port={self.port} user=postgres dbname={dbname}"

    def has_age(self) -> bool:
        with psycopg.connect(self.dsn(), autocommit=True) as c:
            return c.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'age'").fetchone() is not None

    def create_db(self, *, age: bool = False) -> str:
        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.dsn(), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name} STRATEGY = FILE_COPY")
        if age:
            with psycopg.connect(self.dsn(name), autocommit=True) as c:
                c.execute("CREATE EXTENSION age")
        return name

    def drop_db(self, name: str) -> None:
        with psycopg.connect(self.dsn(), autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _run(cmd: list[str]) -> None:
    done = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, timeout=PG_CMD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    """initdb + pg_ctl start in a fresh temp dir (Unix socket only); stopped and removed on exit, always."""
    root = Path(tempfile.mkdtemp(prefix="am-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    started = False
    try:
        _run([str(doctor.PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
              "--locale=C", "--no-sync"])
        opts = f"-k {root} -c listen_addresses='' -c fsync=off -c synchronous_commit=off -p 5432"
        _run([str(doctor.PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "server.log"), "-w",
              "-t", "60", "start"])
        started = True
        yield Cluster(root)
    finally:
        if started:
            subprocess.run(_as_postgres([str(doctor.PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                                         "-t", "60", "stop"]), capture_output=True, timeout=PG_CMD_TIMEOUT_S)
        shutil.rmtree(root, ignore_errors=True)


def server_binaries_present() -> bool:
    return doctor.missing("postgres") is None
