"""A node process on the Postgres backend under real server faults, with clients writing through its local socket
all along (testbed/bench/pg_faults.py's rig: a primary with a synchronous streaming standby, the DSN naming both
with target_session_attrs=read-write, a peer on SQLite).

Across a restart, a stop, a kill -9 of the postmaster and a failover to the promoted standby: the node never
exits, every acknowledged write is stored once and replicated once (and the peer's writes, sent to the node
through the outages, stored on it once), every refused one was told the retryable ``storage_unavailable``; while
the database is away /readyz answers 503 naming it, /healthz answers, the CLI says ``storage_unavailable``, and no
message or log line shows the DSN's password.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testbed.bench import pg_faults
from testbed.bench.pg_faults import PASSWORD, Rig, Writers, readyz, rig, unavailable
from testbed.env import doctor
from testbed.env.postgres import throwaway_cluster
from testbed.mesh import LocalMesh, build_layout
from testbed.mesh.local import health
from tests.integration.conftest import node_log_events, run_cli

pytestmark = pytest.mark.integration

SEEN_WITHIN_S = 60.0  # a bound on polling, never a timed assertion


@pytest.fixture(autouse=True)
def _postgres() -> None:
    if reason := doctor.missing("postgres"):
        pytest.skip(reason)


async def test_a_node_on_postgres_rides_out_a_restart_a_stop_a_kill_9_and_a_failover(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def while_stopped(r: Rig, writers: Writers) -> None:
        """The database stopped for a while: what clients, probes and the operator see."""
        await asyncio.to_thread(r.primary.stop)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
            seen["readyz"] = await _poll(lambda: readyz(http, r.node), lambda got: got[0] == 503
                                         and unavailable(got[1]))
        refused = writers.refused["storage_unavailable"]
        await _poll(lambda: _value(writers.refused["storage_unavailable"]), lambda n: n > refused + 10)
        seen["healthz"] = await asyncio.to_thread(health, r.node)
        seen["socket"] = r.socket.exists()
        seen["cli"] = await asyncio.to_thread(run_cli, r.node, "store", "from the cli while away", json=False)
        await asyncio.to_thread(r.primary.start)

    with rig(tmp_path) as r:
        proc = r.mesh.procs[1]
        results, tally = await pg_faults.run(r, between=while_stopped)
        assert proc.poll() is None, "node-1 exited"
        assert [f.fault for f in results] == ["restart", "kill -9", "promotion"]
        assert (tally.lost, tally.duplicated, tally.peer_lost, tally.peer_duplicated) == (0, 0, 0, 0)
        assert (tally.from_peer_lost, tally.from_peer_duplicated) == (0, 0)  # the peer's sends, NACKed meanwhile
        assert tally.acked > 0 and tally.from_peer > 0 and set(tally.refused) <= {"storage_unavailable"}

        status, body = seen["readyz"]
        [reason] = [x for x in body["reasons"] if x["code"] == "storage_unavailable"]
        assert "not answering" in reason["message"] and "password=***" in reason["message"]
        assert seen["healthz"] is not None and seen["healthz"]["status"] == "ok" and seen["socket"]
        rc, _, err = seen["cli"]
        assert rc != 0 and "error [storage_unavailable]" in err and PASSWORD not in err

        events = node_log_events(r.node)
        assert PASSWORD not in r.node.config_path.parent.joinpath("node.log").read_text()
        names = [e["event"] for e in events]
        # Four outages (the stop among them): each logged once each way, not once per refused call.
        outages = names.count("storage_unavailable")
        assert 4 <= outages <= 8 and names.count("storage_available") == outages
        assert names.count("loop_paused") <= 8 * outages < tally.refused["storage_unavailable"]
        assert "Traceback" not in r.node.config_path.parent.joinpath("node.log").read_text()
        assert "node_crashed" not in names

        r.mesh.stop(1)
        assert proc.returncode == 0 and not r.socket.exists()


async def test_a_node_stopped_while_its_database_is_away_drains_and_removes_its_socket(tmp_path: Path) -> None:
    with throwaway_cluster(synchronous_commit=True) as cluster:
        layout = build_layout(tmp_path / "mesh", 2, mcp_http=False)
        node = layout.node(1)
        with node.config_path.open("a", encoding="utf-8") as f:
            f.write(f'\n[storage]\nbackend = "postgres"\ndsn = "{cluster.dsn(cluster.create_db())}"\n')
        mesh = LocalMesh(layout)
        try:
            await asyncio.to_thread(mesh.start, [1], want_links=False)
            proc: subprocess.Popen[bytes] = mesh.procs[1]
            await asyncio.to_thread(cluster.stop)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
                await _poll(lambda: readyz(http, node), lambda got: unavailable(got[1]))
            await asyncio.to_thread(mesh.stop, 1)
            assert proc.returncode == 0 and not (node.home / "run" / "node.sock").exists()
            assert "node_stopped" in [e["event"] for e in node_log_events(node)]
        finally:
            await asyncio.to_thread(mesh.stop_all)


async def _value(v: Any) -> Any:
    return v


async def _poll(get: Any, good: Any) -> Any:
    deadline = time.monotonic() + SEEN_WITHIN_S
    while True:
        got = await get()
        if good(got):
            return got
        assert time.monotonic() < deadline, f"never saw it; last {got!r}"
        await asyncio.sleep(0.05)
