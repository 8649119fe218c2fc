"""The least privileges docs/operations.md ("A role and a database") gives the node are enough, and no more: its
set-up statements, run as they stand there on a throwaway cluster, make a role that runs the node's migrations,
writes, recall, links and their walks and the audit chain, takes an `ai-memory migrate`, and is backed up and
restored with pg_dump/pg_restore as the docs say; and that role can create nothing outside its schema."""

from __future__ import annotations

import asyncio
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mesh import keys
from node.assemble import open_service
from node.config import from_dict
from storage.errors import StorageError
from storage.port import migrate
from storage.portsides import TABLES, Store
from testbed.env import doctor
from testbed.env.postgres import Cluster

ROOT = Path(__file__).resolve().parents[2]
AGENT = "ai:roles@local"


def _setup_sql() -> tuple[list[str], list[str]]:
    """The two sql blocks of the docs' "A role and a database": (in any database, in the new one)."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text[text.index("### A role and a database"):]
    blocks = re.findall(r"```sql\n(.*?)```", section, re.S)[:2]
    return tuple([s.strip() for s in b.split(";") if s.strip()] for b in blocks)  # type: ignore[return-value]


def _as_superuser(cluster: Cluster, dbname: str, statements: list[str]) -> None:
    with psycopg.connect(cluster.dsn(dbname), autocommit=True) as c:
        for s in statements:
            c.execute(s)


def _set_up(cluster: Cluster, name: str) -> None:
    first, second = _setup_sql()
    _as_superuser(cluster, "postgres", [re.sub(r"\baimem\b", name, s) for s in first])
    _as_superuser(cluster, name, [re.sub(r"\baimem\b", name, s) for s in second])


@pytest.fixture
def role(pg_cluster: Cluster) -> Iterator[str]:
    """A role and its database, named alike, made by the docs' statements; the role's DSN."""
    name = "am_" + uuid.uuid4().hex[:12]
    _set_up(pg_cluster, name)
    try:
        yield f"host={pg_cluster.root} port={pg_cluster.port} user={name} dbname={name}"
    finally:
        for db in (name, f"{name}_restored"):
            pg_cluster.drop_db(db)
        _as_superuser(pg_cluster, "postgres", [f"DROP ROLE IF EXISTS {name}"])


async def _work(home: Path, dsn: str, *, age: str = "off") -> dict[str, Any]:
    """What a node does with its store, through the service: the chain at the end, and the walks' engine."""
    keys.generate_identity(home / "keys", AGENT)
    svc = await open_service(_config(home, dsn, age), require_identity=True)
    try:
        a = (await svc.memory_store("alpha beta gamma", title="a"))["id"]
        b = (await svc.memory_store("beta delta", title="b"))["id"]
        await svc.memory_update(a, content="alpha beta gamma, again")
        await svc.memory_link(a, b, "related_to")
        assert [m["id"] for m in await svc.memory_recall("beta")] == [b, a]
        walk = await svc.kg.query(a, depth=2)
        assert [n["memory_id"] for n in walk["neighbours"]] == [b]
        return {**await svc.audit_verify(), "kg_backend": walk["kg_backend"]}
    finally:
        await svc.close()


def _config(home: Path, dsn: str, age: str) -> Any:
    return from_dict({"agent_id": AGENT, "home": str(home),
                      "storage": {"backend": "postgres", "dsn": dsn, "age": age}}, env={})


def _age_sql() -> list[str]:
    """The superuser's statements of the docs' "Apache AGE with the node's role"."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text[text.index("### Apache AGE with the node's role"):]
    block = re.findall(r"```sql\n(.*?)```", section, re.S)[0]
    statements, current = [], ""
    for line in block.splitlines(keepends=True):
        current += line
        if line.rstrip().endswith(";") and current.count("$$") % 2 == 0:  # not inside a $$ body
            statements.append(current.strip())
            current = ""
    return statements


def _needs_age() -> None:
    if reason := doctor.missing("age", "age-plugin"):
        pytest.skip(reason)


async def test_age_runs_as_the_documented_role_after_the_documented_steps(role: str, tmp_path: Path,
                                                                          pg_cluster: Cluster) -> None:
    _needs_age()
    name = role.rsplit("=", 1)[1]
    _as_superuser(pg_cluster, name, [re.sub(r"\baimem\b", name, s) for s in _age_sql()])
    got = await _work(tmp_path / "home", role, age="on")
    assert got["ok"] and got["kg_backend"] == "postgres-age"


async def test_a_role_that_cannot_use_age_walks_with_ctes_on_auto_and_refuses_on(
        role: str, tmp_path: Path, pg_cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """The extension made, none of the rest of the steps: "auto" says why and uses CTEs, "on" refuses to start."""
    _needs_age()
    _as_superuser(pg_cluster, role.rsplit("=", 1)[1], ["CREATE EXTENSION age"])
    got = await _work(tmp_path / "home", role, age="auto")
    assert got["ok"] and got["kg_backend"] == "postgres-cte"
    [warned] = [r for r in caplog.records if r.getMessage() == "age_not_usable"]
    assert "USAGE on schema ag_catalog" in warned.ev["reason"]  # type: ignore[attr-defined]
    with pytest.raises(StorageError) as e:
        await open_service(_config(tmp_path / "home", role, "on"), require_identity=True)
    assert e.value.code == "age_unavailable" and "Apache AGE with the node's role" in e.value.message


def _counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as c:
        return {t: int(c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in TABLES}  # type: ignore[index]


async def test_the_documented_role_runs_the_node_and_nothing_more(role: str, tmp_path: Path) -> None:
    audit = await _work(tmp_path / "home", role)
    assert audit["ok"] and audit["checked"] == 4
    with psycopg.connect(role, autocommit=True) as c:
        assert c.execute("SELECT current_schema()").fetchone() == (role.rsplit("=", 1)[1],)
        for outside in ("CREATE TABLE public.t (i int)", "CREATE DATABASE elsewhere", "CREATE SCHEMA other",
                        "CREATE ROLE other"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(outside)


async def test_a_store_migrates_into_the_documented_role(role: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    keys.generate_identity(home / "keys", AGENT)
    cfg = from_dict({"agent_id": AGENT, "home": str(home)}, env={})
    svc = await open_service(cfg, require_identity=True)
    try:
        for i in range(20):
            await svc.memory_store(f"memory {i}")
    finally:
        await svc.close()
    report = await migrate(Store("sqlite", cfg.db_path), Store("postgres", dsn=role), observer=lambda p: None)
    assert report.ok and report.chain.checked == 20
    assert _counts(role)["memories"] == 20


def _tool(name: str, *args: str) -> None:
    subprocess.run([str(doctor.PG_BIN / name), *args], check=True, capture_output=True, timeout=120)


async def test_pg_dump_and_pg_restore_as_the_docs_say(role: str, tmp_path: Path, pg_cluster: Cluster) -> None:
    await _work(tmp_path / "home", role)
    name = role.rsplit("=", 1)[1]
    dump = tmp_path / "store.dump"
    await asyncio.to_thread(_tool, "pg_dump", "--format=custom", f"--schema={name}", f"--file={dump}", role)
    restored = f"{name}_restored"
    first, second = _setup_sql()
    _as_superuser(pg_cluster, "postgres", [re.sub(r"\baimem\b", name, s).replace(f"DATABASE {name}",
                                                                                    f"DATABASE {restored}")
                                           for s in first if not s.startswith("CREATE ROLE")])
    _as_superuser(pg_cluster, restored, [re.sub(r"\baimem\b", name, s).replace(f"DATABASE {name}",
                                                                                  f"DATABASE {restored}")
                                         for s in second if not s.startswith("CREATE SCHEMA")])
    await asyncio.to_thread(_tool, "pg_restore", "--exit-on-error", "--single-transaction",
                            f"--dbname={pg_cluster.dsn(restored)}", str(dump))
    back = role.replace(f"dbname={name}", f"dbname={restored}")
    assert _counts(back) == _counts(role)
    svc = await open_service(_config(tmp_path / "home", back, "off"), require_identity=True)
    try:
        audit = await svc.audit_verify()
        assert audit["ok"] and audit["checked"] == 4
        await svc.memory_store("after the restore")  # the restored sequences and triggers take writes
        assert (await svc.audit_verify())["checked"] == 5
    finally:
        await svc.close()
