"""A throwaway PostgreSQL 15 cluster (the tests' fixtures and the knowledge-graph bench use it): initdb + pg_ctl
(as the `postgres` user when run as root), a Unix socket in a temp dir, no TCP; stopped and removed on exit,
always. The server binaries are found where testbed/env/doctor.py says (``PG_BIN``).

The fault tests (tests/storage/test_pg_faults.py, tests/integration/test_postgres_faults.py) and
testbed/bench/pg_faults.py also stop, restart and ``kill -9`` a cluster, and fail it over to a standby made with
``pg_basebackup -R`` (``standby``) and promoted; testbed/bench/storage_faults.py then makes the old primary a
standby of the new one (``rebuild_standby``) to fail over again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from testbed.env import doctor

# Bounds on the cluster's own commands; a healthy initdb/start/stop takes a few seconds.
PG_CMD_TIMEOUT_S = 120
# After a kill -9 of the postmaster its backends notice within moments and exit; a start waits this long for them.
ORPHANS_GONE_S = 30.0
# How long a standby may take to stream from its primary (and to be counted synchronous) after it starts.
STANDBY_READY_S = 60.0


@dataclass(frozen=True)
class Cluster:
    root: Path
    port: int = 5432
    # The server options it was started with (pg_ctl -o), given again at each start.
    options: str = ""

    @property
    def data(self) -> Path:
        return self.root / "data"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.root} port={self.port} user=postgres dbname={dbname}"

    # ---- faults -------------------------------------------------------------------------------

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop (``mode``: smart | fast | immediate), waiting until the server is down."""
        _run([str(doctor.PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def start(self) -> None:
        """pg_ctl start with the cluster's options; after a kill -9, once the old backends have gone."""
        deadline = time.monotonic() + ORPHANS_GONE_S
        while True:
            try:
                _run([str(doctor.PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", self.options, "-l",
                      str(self.root / "server.log"), "-w", "-t", "60", "start"])
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # shared memory still held by the killed postmaster's children

    def restart(self, mode: str = "fast") -> None:
        """pg_ctl restart: stop (``mode``) and start again."""
        self.stop(mode)
        self.start()

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill_postmaster(self) -> None:
        """``kill -9`` the postmaster; its backends end as they notice (a start then runs crash recovery)."""
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + ORPHANS_GONE_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def promote(self) -> None:
        """pg_ctl promote a standby, waiting until it takes writes."""
        _run([str(doctor.PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote"])

    def in_recovery(self) -> bool:
        with psycopg.connect(self.dsn(), autocommit=True) as c:
            row = c.execute("SELECT pg_is_in_recovery()").fetchone()
            return bool(row and row[0])

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _options(root: Path, synchronous_commit: bool) -> str:
    # fsync stays off: the faults these clusters meet are process crashes, which the OS page cache survives.
    # synchronous_commit on makes each acknowledged commit's WAL written before the ACK (what a kill -9 of the
    # postmaster must not lose); off, as the fast fixtures run, a commit may be acknowledged before that.
    return (f"-k {root} -c listen_addresses='' -c fsync=off "
            f"-c synchronous_commit={'on' if synchronous_commit else 'off'} -p 5432")


def _new_root(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    return root


def _remove(cluster: Cluster) -> None:
    subprocess.run(_as_postgres([str(doctor.PG_BIN / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "-w",
                                 "-t", "60", "stop"]), capture_output=True, timeout=PG_CMD_TIMEOUT_S)
    shutil.rmtree(cluster.root, ignore_errors=True)


@contextlib.contextmanager
def throwaway_cluster(*, synchronous_commit: bool = False) -> Iterator[Cluster]:
    """initdb + pg_ctl start in a fresh temp dir (Unix socket only); stopped and removed on exit, always.
    ``synchronous_commit``: an acknowledged commit survives a kill -9 of the server (the fault tests)."""
    root = _new_root("am-pg-")
    cluster = Cluster(root, options=_options(root, synchronous_commit))
    try:
        _run([str(doctor.PG_BIN / "initdb"), "-D", str(cluster.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
              "--locale=C", "--no-sync"])
        cluster.start()
        yield cluster
    finally:
        _remove(cluster)


@contextlib.contextmanager
def standby(primary: Cluster, *, synchronous: bool = True) -> Iterator[Cluster]:
    """A streaming standby of ``primary`` (pg_basebackup -R) on its own socket dir; with ``synchronous`` the
    primary's commits wait for it (synchronous_standby_names = '*'), so a promotion loses no acknowledged commit.
    Stopped and removed on exit, always."""
    root = _new_root("am-pg-standby-")
    cluster = Cluster(root, options=_options(root, synchronous_commit=True))
    try:
        _follow(cluster, primary, synchronous)
        yield cluster
    finally:
        _remove(cluster)


def rebuild_standby(old: Cluster, primary: Cluster) -> None:
    """After a failover: ``old`` (the primary failed over from, stopped or killed) made a synchronous standby of
    ``primary`` (the promoted one) in place, on its own socket dir and port, so a DSN naming both still holds;
    its data is replaced by a new base backup (what ``pg_rewind`` or ``pg_basebackup`` does by hand)."""
    subprocess.run(_as_postgres([str(doctor.PG_BIN / "pg_ctl"), "-D", str(old.data), "-m", "immediate", "-w",
                                 "-t", "60", "stop"]), capture_output=True, timeout=PG_CMD_TIMEOUT_S)
    shutil.rmtree(old.data)
    _follow(old, primary, synchronous=True)


def _follow(cluster: Cluster, primary: Cluster, synchronous: bool) -> None:
    """Base-back ``primary`` up into ``cluster``'s (absent) data dir as its streaming standby, start it, and wait
    until it streams (counted synchronous with ``synchronous``)."""
    _run([str(doctor.PG_BIN / "pg_basebackup"), "-D", str(cluster.data), "-R", "-X", "stream", "-c", "fast",
          "-h", str(primary.root), "-p", str(primary.port), "-U", "postgres"])
    cluster.start()
    if synchronous:
        with psycopg.connect(primary.dsn(), autocommit=True) as c:
            c.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            c.execute("SELECT pg_reload_conf()")
    _wait_streaming(primary, synchronous)


def _wait_streaming(primary: Cluster, synchronous: bool) -> None:
    want = "sync" if synchronous else "async"
    deadline = time.monotonic() + STANDBY_READY_S
    while time.monotonic() < deadline:
        with psycopg.connect(primary.dsn(), autocommit=True) as c:
            states = [r[0] for r in c.execute("SELECT sync_state FROM pg_stat_replication "
                                              "WHERE state = 'streaming'").fetchall()]
        if want in states:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the standby of {primary.root} did not stream ({want}) within {STANDBY_READY_S:g} s")


def server_binaries_present() -> bool:
    return doctor.missing("postgres") is None
