"""``ai-memory migrate`` as an operator meets it: a store with memories of several versions, links, an invalidation,
a transcript, a pending approval and a key rotated halfway moves to Postgres and back, every row as it was, and on
each side `ai-memory audit verify` passes and every memory version and link verifies; a run killed with kill -9
goes on from where it stopped; a run refused (the node running, the file held, the target holding rows) changes
nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mesh import keyhistory, keys
from node.assemble import open_service
from node.config import load_config
from node.errors import ServiceError
from node.service import now_ms
from storage import Database, changelog, memories
from storage.backend import open_database
from storage.portsides import MARKS, TABLES
from tests.faults import ROOT, node_home, running_node
from tests.node.conftest import AGENT
from tests.node_access import cli_in_process
from tests.permissions.conftest import ASK_TEAM_STORES as ASK_TEAM
from tests.storage.storage_helpers import make_memory

# Memories added through the storage layer's batch path for the kill -9 test: enough batches of KILL_BATCH rows
# that the run is caught part way.
BULK = 3_000
KILL_BATCH = 10


@dataclass
class Home:
    home: Path
    config: Path
    memories: list[str]
    links: list[str]

    def cli(self, *args: str, json_out: bool = True) -> tuple[int, Any, str]:
        return cli_in_process(self.config, self.home, *args, json=json_out)

    def use(self, storage: str) -> None:
        """Point the config's [storage] at another store (what the operator does after a migration)."""
        text = self.config.read_text(encoding="utf-8")
        head = text[:text.index("[storage]")]
        self.config.write_text(f"{head}[storage]\n{storage}\n", encoding="utf-8")


def _config(home: Path, storage: str = "") -> Path:
    home.mkdir(parents=True, exist_ok=True)
    config = home / "config.toml"
    config.write_text(f'agent_id = "{AGENT}"\nhome = "{home}"\n\n[transcripts]\nenabled = true\nreplay = "allow"\n\n'
                      f"[storage]\n{storage}\n", encoding="utf-8")
    return config


async def _rich(home: Path) -> Home:
    """A home whose SQLite store holds every kind of row, written through the service; the key rotated halfway."""
    keys.generate_identity(home / "keys", AGENT)
    (home / "permissions.toml").write_text(ASK_TEAM, encoding="utf-8")
    config = _config(home)
    cfg = load_config(config, env={})
    mems, lks = [], []
    svc = await open_service(cfg, require_identity=True)
    try:
        a = (await svc.memory_store("the first version of a", title="a"))["id"]
        await svc.memory_update(a, content="the second version of a")
        await svc.memory_update(a, content="the third version of a, café ☕")
        b = (await svc.memory_store("b, linked from a", title="b"))["id"]
        c = (await svc.memory_store("c, linked from b", title="c", tags=["x", "y"]))["id"]
        mems += [a, b, c]
        lks.append((await svc.memory_link(a, b, "related_to"))["link_id"])
        lks.append((await svc.memory_link(b, c, "supports"))["link_id"])
        await svc.kg.invalidate(lks[0])
        await svc.transcripts.store("user: what of a?\nassistant: the third version", spans=[
            {"memory_id": a, "start": 0, "end": 16}])
        with pytest.raises(ServiceError) as parked:
            await svc.memory_store("plans", namespace="team")
        assert parked.value.code == "approval_required"
    finally:
        await svc.close()
    keyhistory.rotate(cfg.keys_dir, AGENT, now_ms())
    svc = await open_service(cfg, require_identity=True)
    try:
        d = (await svc.memory_store("d, written under the new key", title="d"))["id"]
        await svc.memory_update(b, content="b, a second version under the new key")
        mems.append(d)
        lks.append((await svc.memory_link(c, d, "derived_from"))["link_id"])
    finally:
        await svc.close()
    db = await Database.open(cfg.db_path)  # a peer heard from (peer_state.accepts, migration 10)
    try:
        await db.write(changelog.set_peer_accepts, "peer-b", ["memory.put.v2"])
    finally:
        await db.close()
    return Home(home, config, mems, lks)


@pytest.fixture
async def rich(tmp_path: Path) -> Home:
    return await _rich(tmp_path / "home")


def _verified(h: Home) -> None:
    """On the store the config names: the audit chain passes, every memory version and link verifies."""
    rc, out, err = h.cli("audit", "verify")
    assert rc == 0 and out["ok"], (out, err)
    assert out["checked"] >= 12
    for ident in h.memories + h.links:
        rc, out, err = h.cli("verify", ident)
        assert rc == 0 and out["signature_verified"] is True, (ident, out, err)
    rc, out, _ = h.cli("get", h.memories[0])
    assert out["version"] == 3 and "café" in out["content"]
    rc, out, _ = h.cli("recall", "café")
    assert [m["id"] for m in out] == [h.memories[0]]
    rc, out, _ = h.cli("transcript", "replay", h.memories[0])
    assert rc == 0 and out["transcripts"][0]["spans"][0]["text"] == "user: what of a?"
    rc, out, _ = h.cli("approvals", "list")
    assert rc == 0 and [a["namespace"] for a in out] == ["team"]


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the SQLite store at ``path``, rowids included, in key order."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT rowid, * FROM {t} ORDER BY rowid").fetchall() for t in TABLES}
    finally:
        conn.close()


def _schema(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_stat%' "
                            "ORDER BY type, name").fetchall()
    finally:
        conn.close()


def _pg_indexes(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as c:
        return c.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                         "ORDER BY 1").fetchall()


async def test_a_store_moves_to_postgres_and_back_with_every_signature_and_the_chain_intact(
        rich: Home, pg_dsn: str, pg_cluster: Any) -> None:
    source = rich.home / "data" / "memory.db"
    before = _rows(source)

    rc, out, err = rich.cli("migrate", "--to", "postgres", "--dsn", pg_dsn)
    assert rc == 0 and out["ok"], (out, err)
    assert err == ""  # --json: no progress on stderr
    assert {t["table"]: t["source"] for t in out["tables"] if t["source"]} == {
        t: len(r) for t, r in before.items() if r}
    assert all(t["ok"] for t in out["tables"]) and out["audit_head"]["ok"] and out["audit_chain"]["ok"]
    assert out["audit_head"]["source"]["seq"] == len(before["signed_events"])
    assert 'backend = "postgres"' in out["next"] and str(source) in out["next"]
    assert _rows(source) == before  # the source only read

    fresh = pg_cluster.create_db()  # the same indexes as a store the node made itself
    try:
        made = await open_database(backend="postgres", path=Path(), dsn=pg_cluster.dsn(fresh))
        await made.close()
        assert _pg_indexes(pg_dsn) == _pg_indexes(pg_cluster.dsn(fresh))
    finally:
        pg_cluster.drop_db(fresh)

    rich.use(f'backend = "postgres"\ndsn = "{pg_dsn}"')
    _verified(rich)

    back = rich.home / "data" / "back.db"
    rc, out, err = rich.cli("migrate", "--to", "sqlite", "--path", str(back))
    assert rc == 0 and out["ok"], (out, err)
    assert f'path = "{back}"' in out["next"]
    assert _rows(back) == before  # every row as it was, rowids included
    assert _schema(back) == _schema(source)
    rich.use(f'path = "{back}"')
    _verified(rich)

    rc, out, _ = rich.cli("store", "after the move")  # the node's sequences carry on past the copied keys
    assert rc == 0
    rc, out, _ = rich.cli("audit", "verify")
    assert out["ok"] and out["checked"] == len(before["signed_events"]) + 1


async def test_the_human_output_says_what_was_compared_and_what_to_change(rich: Home, pg_dsn: str) -> None:
    rc, out, err = rich.cli("migrate", "--to", "postgres", "--dsn", pg_dsn, json_out=False)
    assert rc == 0, err
    assert "compared, rows in the source | in the target" in out
    assert "memories" in out and "audit chain head" in out and "events walked, intact" in out
    assert 'next: set [storage] backend = "postgres"' in out
    assert "memories" in err and "done" in err  # the progress, on stderr


def _target_rows(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as c:
        return c.execute("SELECT tablename, 0 FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1").fetchall()


async def test_a_run_refused_while_the_node_runs_changes_nothing(tmp_path: Path, pg_dsn: str) -> None:
    home = tmp_path / "h"
    config = node_home(home)
    cfg = load_config(config, env={})
    svc = await open_service(cfg, require_identity=True)
    await svc.memory_store("held by the node")
    await svc.close()
    before = _rows(cfg.db_path)
    async with running_node(cfg):
        rc, _, err = await asyncio.to_thread(cli_in_process, config, home, "migrate", "--to", "postgres", "--dsn",
                                             pg_dsn)
        assert rc == 1 and "error [in_use]: the node is running" in err, err
    assert _rows(cfg.db_path) == before and _target_rows(pg_dsn) == []


def _hold_open(path: Path) -> subprocess.Popen[str]:
    """Another process with the SQLite file open (as `ai-memory mcp` would have it), until its stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                               "c.execute('SELECT count(*) FROM memories').fetchall(); print('open', flush=True); "
                               "sys.stdin.read()", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
    return holder


async def test_a_run_refused_while_another_process_has_the_file_open_changes_nothing(
        rich: Home, pg_dsn: str) -> None:
    source = rich.home / "data" / "memory.db"
    before = _rows(source)
    holder = _hold_open(source)
    try:
        rc, _, err = rich.cli("migrate", "--to", "postgres", "--dsn", pg_dsn)
        assert rc == 1 and "error [in_use]" in err and "is open in another process" in err, err
    finally:
        holder.communicate("", timeout=30)
    assert _rows(source) == before and _target_rows(pg_dsn) == []


async def test_a_target_holding_rows_is_refused_naming_them_and_nothing_changes(rich: Home, pg_dsn: str) -> None:
    other = load_config(_config(rich.home.parent / "other", f'backend = "postgres"\ndsn = "{pg_dsn}"'), env={})
    keys.generate_identity(other.keys_dir, AGENT)
    svc = await open_service(other, require_identity=True)
    await svc.memory_store("already here")
    await svc.close()
    with psycopg.connect(pg_dsn) as c:
        held = [c.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in TABLES]
    before = _rows(rich.home / "data" / "memory.db")

    rc, _, err = rich.cli("migrate", "--to", "postgres", "--dsn", pg_dsn)
    assert rc == 1 and "error [target_not_empty]" in err, err
    assert "memories: 1" in err and "signed_events: 1" in err and "nothing was changed" in err
    with psycopg.connect(pg_dsn) as c:
        assert [c.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in TABLES] == held
        assert c.execute("SELECT to_regclass(%s)", (MARKS,)).fetchone() == (None,)
    assert _rows(rich.home / "data" / "memory.db") == before


# ---- kill -9 and resume ----------------------------------------------------------------------------

async def _bulk(h: Home) -> None:
    """BULK more memories through the storage layer's batch path (the migrate bench's), so a run takes a while."""
    from testbed.bench.migrate_bench import Sizes, fill, store_rows
    mems, rows = store_rows(Sizes(BULK, BULK, 1))
    db = await Database.open(h.home / "data" / "memory.db")
    try:
        await fill(db, mems, rows)
    finally:
        await db.close()


def _copied(dsn: str) -> tuple[int, bool]:
    """Rows the run's record says are copied so far, and whether every table is done (0, False before it began)."""
    with psycopg.connect(dsn) as c:
        if c.execute("SELECT to_regclass(%s)", (MARKS,)).fetchone() == (None,):
            return 0, False
        r = c.execute(f"SELECT coalesce(sum(copied), 0), bool_and(done = 1) FROM {MARKS} "
                      "WHERE name NOT IN ('*', '~')").fetchone()
        assert r is not None
        return int(r[0]), bool(r[1])


def _spawn_migrate(h: Home, *target: str) -> subprocess.Popen[str]:
    """`ai-memory migrate` as its own process (the test kills it), KILL_BATCH rows per batch; its progress goes
    to ``progress.log`` in the home."""
    env = {k: v for k, v in os.environ.items() if k != "AI_MEMORY_HOME"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with (h.home / "progress.log").open("w", encoding="utf-8") as progress:
        return subprocess.Popen([sys.executable, "-m", "node.cli", "--config", str(h.config), "migrate", *target,
                                 "--batch-rows", str(KILL_BATCH)], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=progress, text=True)


async def _kill_when(run: subprocess.Popen[str], far: Callable[[], bool]) -> None:
    """kill -9 the run once ``far()`` says it is part way (within 60 s)."""
    try:
        deadline = time.monotonic() + 60
        while not far():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the run got nowhere within 60 s"
            await asyncio.sleep(0.02)
        os.kill(run.pid, signal.SIGKILL)
    finally:
        run.kill()
        run.communicate(timeout=30)
    assert run.returncode == -signal.SIGKILL


@pytest.mark.integration
async def test_a_run_killed_part_way_goes_on_from_where_it_stopped(rich: Home, pg_dsn: str) -> None:
    await _bulk(rich)
    source = rich.home / "data" / "memory.db"
    before = _rows(source)
    run = _spawn_migrate(rich, "--to", "postgres", "--dsn", pg_dsn)
    await _kill_when(run, lambda: _copied(pg_dsn)[0] >= 20 * KILL_BATCH)
    copied, done = _copied(pg_dsn)
    assert 0 < copied < sum(len(r) for r in before.values()) and not done
    assert _rows(source) == before  # the killed run left the source as it was

    # A resumed run takes only the source it began with: the same store with one more memory is refused.
    changed = rich.home / "data" / "changed.db"
    conn = sqlite3.connect(source)
    conn.execute("VACUUM INTO ?", (str(changed),))
    conn.close()
    db = await Database.open(changed)
    await db.write(memories.insert, make_memory())
    await db.close()
    rich.use(f'path = "{changed}"')
    rc, _, err = rich.cli("migrate", "--to", "postgres", "--dsn", pg_dsn)
    assert rc == 1 and "error [source_changed]" in err and "memories" in err, err
    assert _copied(pg_dsn) == (copied, False)

    rich.use("")
    rc, out, err = rich.cli("migrate", "--to", "postgres", "--dsn", pg_dsn)
    assert rc == 0 and out["ok"] and out["resumed"], (out, err)
    assert sum(out["copied"].values()) == sum(len(r) for r in before.values()) - copied
    assert {t["table"]: t["target"] for t in out["tables"]} == {t: len(r) for t, r in before.items()}
    assert _copied(pg_dsn) == (0, False)  # the run's record went with its end
    rich.use(f'backend = "postgres"\ndsn = "{pg_dsn}"')
    _verified(rich)


def _pg_digest(dsn: str) -> dict[str, tuple[int, str]]:
    """Every table of the Postgres store at ``dsn``: its rows and a digest of them all."""
    with psycopg.connect(dsn) as c:
        return {t: tuple(c.execute(f"SELECT count(*), coalesce(md5(string_agg(r::text, ',' ORDER BY r::text)), '') "
                                   f"FROM {t} r").fetchone() or ()) for t in TABLES}


def _sqlite_run_record(path: Path) -> tuple[int, bool]:
    """Rows the run's record in the SQLite file says are copied, and whether every table is done."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        r = conn.execute(f"SELECT coalesce(sum(copied), 0), min(done) FROM {MARKS} "
                         "WHERE name NOT IN ('*', '~')").fetchone()
        return int(r[0]), bool(r[1])
    finally:
        conn.close()


def _begun(h: Home, table: str) -> bool:
    """The run's progress names ``table``: every table before it is copied (TABLES' order)."""
    return any(line.startswith(f"{table} ") for line in (h.home / "progress.log").read_text("utf-8").splitlines())


@pytest.mark.integration
async def test_a_run_into_sqlite_killed_part_way_is_never_served_and_goes_on(rich: Home, pg_dsn: str) -> None:
    await _bulk(rich)
    rc, out, err = rich.cli("migrate", "--to", "postgres", "--dsn", pg_dsn)
    assert rc == 0 and out["ok"], (out, err)
    rich.use(f'backend = "postgres"\ndsn = "{pg_dsn}"')
    before = _pg_digest(pg_dsn)
    back = rich.home / "data" / "back.db"

    # The run holds the file in exclusive mode (nobody may read it meanwhile): its progress says how far it got.
    run = _spawn_migrate(rich, "--to", "sqlite", "--path", str(back))
    await _kill_when(run, lambda: _begun(rich, "memory_links"))
    copied, done = _sqlite_run_record(back)
    assert 0 < copied < sum(n for n, _ in before.values()) and not done
    assert _pg_digest(pg_dsn) == before  # the killed run left the source as it was

    rich.use(f'path = "{back}"')  # the half-copied file is no store the node takes
    rc, _, err = rich.cli("recall", "café")
    assert rc == 1 and "error [foreign_database]" in err and MARKS in err, err

    # Its session may outlive the killed process a moment on the server: the run waits for it, then goes on.
    rich.use(f'backend = "postgres"\ndsn = "{pg_dsn}"')
    rc, out, err = rich.cli("migrate", "--to", "sqlite", "--path", str(back))
    assert rc == 0 and out["ok"] and out["resumed"], (out, err)
    assert sum(out["copied"].values()) == sum(n for n, _ in before.values()) - copied
    assert _pg_digest(pg_dsn) == before
    rich.use(f'path = "{back}"')
    _verified(rich)


async def test_a_postgres_source_with_another_client_connected_is_refused_and_nothing_changes(
        rich: Home, pg_dsn: str) -> None:
    rc, out, err = rich.cli("migrate", "--to", "postgres", "--dsn", pg_dsn)
    assert rc == 0 and out["ok"], (out, err)
    rich.use(f'backend = "postgres"\ndsn = "{pg_dsn}"')
    before = _pg_digest(pg_dsn)
    back = rich.home / "data" / "back.db"
    with psycopg.connect(pg_dsn, application_name="psql") as other:
        other.execute("SELECT 1")
        rc, _, err = rich.cli("migrate", "--to", "sqlite", "--path", str(back))
    assert rc == 1 and "error [in_use]" in err and "1 other client(s) connected" in err and "psql" in err, err
    assert _pg_digest(pg_dsn) == before and not back.exists()


def test_the_progress_line_says_rows_rate_and_time_left() -> None:
    from node.cli.migrate import progress_line
    from storage.port import Progress
    line = progress_line(Progress("memories", 40_000, 100_000, 30_000, 2.0, False))
    assert line.split() == ["memories", "40,000", "/", "100,000", "40.0%", "15,000", "rows/s", "ETA", "4", "s"]
    done = progress_line(Progress("memories", 100_000, 100_000, 90_000, 6.0, True))
    assert done.endswith("100.0%  done (15,000 rows/s, 6.0 s)")
