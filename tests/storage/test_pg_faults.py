"""The Postgres backend under real server faults: a restart, a stop, a kill -9 of the postmaster, a failover to a
promoted streaming standby. Concurrent writers count every acknowledged write; each must be stored exactly once
afterwards, and every refused one must have been told ``storage_unavailable``.

Each test owns its cluster (synchronous_commit on: an acknowledged commit is in the WAL before the ACK, as in
production; fsync off: these are process crashes, which the OS page cache survives).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from storage import StorageError, memories
from storage.pg import PgDatabase
from storage.pglink import redact
from testbed.env import doctor
from testbed.env.postgres import Cluster, standby, throwaway_cluster
from tests.faults import fill, tmpfs
from tests.storage.storage_helpers import make_memory

# Bounds on waiting for the store to come back (polled, never a timed assertion).
BACK_WITHIN_S = 60.0
# A call during an outage must answer, not hang: far above the 0.5 s it takes.
ANSWERS_WITHIN_S = 20.0
PASSWORD = "s3cret-never-shown"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    if reason := doctor.missing("postgres"):
        pytest.skip(reason)
    with throwaway_cluster(synchronous_commit=True) as c:
        yield c


@pytest.fixture
async def db(cluster: Cluster) -> AsyncIterator[PgDatabase]:
    database = await PgDatabase.open_pg(f"{cluster.dsn(cluster.create_db())} password={PASSWORD}")
    try:
        yield database
    finally:
        await database.close()


class Writers:
    """``n`` tasks writing memories as fast as they are answered; what was acknowledged, what was refused."""

    def __init__(self, db: PgDatabase, n: int = 4) -> None:
        self.db = db
        self.n = n
        self.acked: list[str] = []
        self.refused: Counter[str] = Counter()
        self._stop = False
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Writers:
        self._tasks = [asyncio.create_task(self._write(i)) for i in range(self.n)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop = True
        await asyncio.wait_for(asyncio.gather(*self._tasks), ANSWERS_WITHIN_S + 35)

    async def _write(self, i: int) -> None:
        k = 0
        while not self._stop:
            k += 1
            content = f"writer {i} write {k}"
            try:
                await self.db.write(memories.insert, make_memory(content=content))
            except StorageError as e:
                self.refused[str(e.code)] += 1
                await asyncio.sleep(0.01)
            else:
                self.acked.append(content)

    async def more_than(self, n: int) -> None:
        """Wait (bounded) until more than ``n`` writes are acknowledged."""
        deadline = time.monotonic() + BACK_WITHIN_S
        while len(self.acked) <= n:
            assert time.monotonic() < deadline, f"writes did not go on ({len(self.acked)} acked, {self.refused})"
            await asyncio.sleep(0.02)


def stored_counts(dsn: str) -> Counter[str]:
    with psycopg.connect(dsn) as c:
        return Counter({content: n for content, n in c.execute(
            "SELECT content, count(*) FROM memories GROUP BY content").fetchall()})


def assert_each_acked_stored_once(acked: list[str], dsn: str) -> None:
    stored = stored_counts(dsn)
    lost = [c for c in acked if stored[c] == 0]
    doubled = [c for c, n in stored.items() if n > 1]
    assert (lost, doubled) == ([], [])
    assert len(acked) == len(set(acked))


async def back(db: PgDatabase) -> None:
    deadline = time.monotonic() + BACK_WITHIN_S
    while db.health.conditions():
        assert time.monotonic() < deadline, db.health.conditions()
        await asyncio.sleep(0.02)


async def test_writes_across_a_restart_are_stored_once_or_refused_as_storage_unavailable(
        cluster: Cluster, db: PgDatabase) -> None:
    async with Writers(db) as w:
        await w.more_than(50)
        await asyncio.to_thread(cluster.restart)
        before = len(w.acked)
        await back(db)
        await w.more_than(before + 50)
    assert set(w.refused) <= {"storage_unavailable"}
    assert_each_acked_stored_once(w.acked, db.dsn)
    assert not db.health.conditions()


async def test_while_the_server_is_stopped_calls_answer_storage_unavailable_and_health_holds_it(
        cluster: Cluster, db: PgDatabase) -> None:
    await db.write(memories.insert, make_memory(content="before"))
    await asyncio.to_thread(cluster.stop)
    for call in (db.write(memories.insert, make_memory(content="while away")), db.read(memories.count)):
        with pytest.raises(StorageError) as err:
            await asyncio.wait_for(call, ANSWERS_WITHIN_S)
        assert err.value.code == "storage_unavailable" and err.value.http_status == 503
    [condition] = db.health.conditions()
    assert condition.code == "storage_unavailable" and "not answering" in condition.message
    await asyncio.to_thread(cluster.start)
    await back(db)
    await db.write(memories.insert, make_memory(content="after"))
    assert stored_counts(db.dsn) == Counter({"before": 1, "after": 1})


async def test_an_idle_store_is_ready_again_without_a_write(cluster: Cluster, db: PgDatabase) -> None:
    await asyncio.to_thread(cluster.stop)
    with pytest.raises(StorageError):
        await db.read(memories.count)
    assert db.health.conditions()
    await asyncio.to_thread(cluster.start)
    await back(db)  # nothing was written: the idle writer found the server again


async def test_a_kill_9_of_the_postmaster_loses_no_acknowledged_write(cluster: Cluster, db: PgDatabase) -> None:
    async with Writers(db) as w:
        await w.more_than(50)
        await asyncio.to_thread(cluster.kill_postmaster)
        await asyncio.to_thread(cluster.start)
        before = len(w.acked)
        await back(db)
        await w.more_than(before + 50)
    assert set(w.refused) <= {"storage_unavailable"}
    assert_each_acked_stored_once(w.acked, db.dsn)


@pytest.mark.parametrize("fault", ["stop", "kill -9"])
async def test_a_multi_host_dsn_follows_a_failover_to_the_promoted_standby(cluster: Cluster, fault: str) -> None:
    name = cluster.create_db()
    with standby(cluster) as replica:
        dsn = (f"host={cluster.root},{replica.root} port=5432,5432 user=postgres dbname={name} "
               "target_session_attrs=read-write")
        db = await PgDatabase.open_pg(dsn)
        try:
            async with Writers(db) as w:
                await w.more_than(50)
                await asyncio.to_thread(cluster.stop if fault == "stop" else cluster.kill_postmaster)
                await asyncio.to_thread(replica.promote)
                before = len(w.acked)
                await back(db)
                await w.more_than(before + 50)
        finally:
            await db.close()
        assert set(w.refused) <= {"storage_unavailable"}
        assert_each_acked_stored_once(w.acked, replica.dsn(name))


async def test_a_commit_whose_answer_was_lost_is_settled_by_its_marker(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    name = cluster.create_db()
    with standby(cluster) as replica:
        db = await PgDatabase.open_pg(cluster.dsn(name))
        try:
            await db.write(memories.insert, make_memory(content="before"))
            # With its synchronous standby gone, the primary holds each COMMIT (already in its WAL) unanswered.
            await asyncio.to_thread(replica.stop, "immediate")
            held = asyncio.create_task(db.write(memories.insert, make_memory(content="in doubt")))
            await _waiting_for_sync_rep(cluster)
            # The server dies with that COMMIT unanswered: the writer cannot know from the reply whether it was
            # stored. It comes back (without the standby requirement) after crash recovery.
            with caplog.at_level(logging.INFO, logger="storage.pg"):
                await asyncio.to_thread(cluster.kill_postmaster)
                # Held, that write does not hold the others up: they are refused at once while the server is away.
                with pytest.raises(StorageError) as err:
                    await asyncio.wait_for(db.write(memories.insert, make_memory(content="refused")),
                                           ANSWERS_WITHIN_S)
                assert err.value.code == "storage_unavailable" and not held.done()
                _drop_synchronous_standby(cluster)
                await asyncio.to_thread(cluster.start)
                await asyncio.wait_for(held, BACK_WITHIN_S)  # the marker says it was committed: acknowledged
            assert stored_counts(db.dsn) == Counter({"before": 1, "in doubt": 1})
            assert [r.ev["committed"] for r in caplog.records if r.getMessage() == "commit_in_doubt_settled"] == [True]
        finally:
            await db.close()


async def _waiting_for_sync_rep(cluster: Cluster) -> None:
    deadline = time.monotonic() + BACK_WITHIN_S
    while True:
        with psycopg.connect(cluster.dsn(), autocommit=True) as c:
            if c.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchone():
                return
        assert time.monotonic() < deadline, "no COMMIT waited for the standby"
        await asyncio.sleep(0.02)


def _drop_synchronous_standby(cluster: Cluster) -> None:
    conf = cluster.data / "postgresql.auto.conf"
    conf.write_text("".join(line for line in conf.read_text().splitlines(keepends=True)
                            if not line.startswith("synchronous_standby_names")))


async def test_the_dsn_password_is_in_no_error_and_no_log_line(
        cluster: Cluster, db: PgDatabase, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    errors: list[str] = []
    with caplog.at_level(logging.DEBUG):
        await asyncio.to_thread(cluster.stop)
        for call in (db.write(memories.insert, make_memory()), db.read(memories.count)):
            with pytest.raises(StorageError) as err:
                await asyncio.wait_for(call, ANSWERS_WITHIN_S)
            errors.append(err.value.message)
        with pytest.raises(StorageError) as err:
            await PgDatabase.open_pg(f"host={tmp_path} dbname=x user=y password={PASSWORD}")
        errors.append(err.value.message)
        await asyncio.to_thread(cluster.start)
        await back(db)
    errors += [c.message for c in db.health.conditions()]
    logged = [f"{r.getMessage()} {getattr(r, 'ev', '')}" for r in caplog.records]
    assert any("password=***" in e for e in errors) and any("storage_unavailable" in line for line in logged)
    assert [s for s in errors + logged if PASSWORD in s] == []


def test_a_dsn_is_shown_without_its_password() -> None:
    shown = redact("host=/a,/b port=5432,5433 user=u password=pw target_session_attrs=read-write")
    assert conninfo.conninfo_to_dict(shown) == {"host": "/a,/b", "port": "5432,5433", "user": "u", "password": "***",
                                                "target_session_attrs": "read-write"}
    assert "pw" not in redact("postgresql://u:pw@h1:5432,h2:5433/db")
    assert redact("host=a password=se cret") == "<a DSN libpq cannot parse>"  # libpq's error would quote it


async def test_a_full_disk_under_postgres_is_storage_full_until_space_returns(cluster: Cluster) -> None:
    """The database's tablespace on a small tmpfs that fills up: writes are refused storage_full (retryable), the
    store's health says so, nothing acknowledged is lost, and it is writable again once space is freed."""
    with tmpfs(cluster.root / "small", 48 * 1024 * 1024) as mount:  # where the server's user may reach it
        location = mount / "ts"
        location.mkdir()
        shutil.chown(mount, "postgres", "postgres")
        shutil.chown(location, "postgres", "postgres")
        with psycopg.connect(cluster.dsn(), autocommit=True) as c:
            c.execute(f"CREATE TABLESPACE small LOCATION '{location}'")
            c.execute("CREATE DATABASE on_small TABLESPACE small")
        db = await PgDatabase.open_pg(cluster.dsn("on_small"))
        try:
            acked = []
            await db.write(memories.insert, make_memory(content="before"))
            acked.append("before")
            fill(mount / "filler")
            refused: StorageError | None = None
            for k in range(100_000):  # the pages left in the table's last extents take a few first
                try:
                    await db.write(memories.insert, make_memory(content=f"filling {k}", title="x" * 2000))
                except StorageError as e:
                    refused = e
                    break
                acked.append(f"filling {k}")
            assert refused is not None and refused.code == "storage_full" and refused.http_status == 503
            [condition] = db.health.conditions()
            assert condition.code == "storage_full" and "no space left" in condition.message
            assert await db.recheck_full()  # still full
            (mount / "filler").unlink()
            assert not await db.recheck_full()
            await db.write(memories.insert, make_memory(content="after"))
            acked.append("after")
            assert_each_acked_stored_once(acked, db.dsn)
        finally:
            await db.close()
            with psycopg.connect(cluster.dsn(), autocommit=True) as c:
                c.execute("DROP DATABASE on_small")
                c.execute("DROP TABLESPACE small")
