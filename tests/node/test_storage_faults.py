"""A node on a damaged SQLite store, as an operator meets it: it starts not ready (/readyz 503 storage_corrupt),
says so in one log line naming the file and the recovery, answers clients storage_corrupt, and `ai-memory doctor`
exits 3 naming what is damaged; `ai-memory repair` refuses while the node runs, rebuilds after, and the node is
ready again with every memory it held."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from node.assemble import open_service
from node.config import NodeConfig, load_config
from node.errors import ServiceError
from node.mcp.socket import ask_node
from tests.faults import ai_memory, checkpointed, damage, http_get, node_home, running_node

MEMORIES = 300


async def filled_node(root: Path) -> tuple[Path, NodeConfig, list[str]]:
    """A node home whose store holds MEMORIES signed memories (closed and checkpointed): config, cfg, their ids."""
    config = node_home(root / "h")
    cfg = load_config(config, env={})
    svc = await open_service(cfg, require_identity=True)
    try:
        ids = [(await svc.memory_store(f"memory {i} about needle{i} " + "words " * 40, namespace=f"ns{i % 3}"))["id"]
               for i in range(MEMORIES)]
    finally:
        await svc.close()
    checkpointed(cfg.db_path)
    return config, cfg, ids


async def test_a_store_past_the_start_check_size_is_checked_just_after_the_node_serves(tmp_path: Path) -> None:
    # storage.start_check_max_bytes: start-up does not read the whole of a large store; its watch does at once.
    config, _, _ = await filled_node(tmp_path)
    with config.open("a", encoding="utf-8") as f:
        f.write("start_check_max_bytes = 0\n")  # the [storage] table is the file's last
    cfg = load_config(config, env={})
    damage(cfg.db_path, "memories_ns_created", pages=2)
    async with running_node(cfg) as node:
        assert not node.check_at_start
        deadline = time.monotonic() + 30.0
        while node.watch.checks == 0:
            assert time.monotonic() < deadline, "the watch did not check the store"
            await asyncio.sleep(0.05)
        ready = await http_get(cfg.mesh.health_port, "/readyz")
        assert ready is not None and ready[0] == 503
        assert [r["code"] for r in json.loads(ready[1])["reasons"]] == ["storage_corrupt"]


async def test_a_node_on_a_damaged_store_is_not_ready_says_so_once_and_doctor_names_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config, cfg, ids = await filled_node(tmp_path)
    damage(cfg.db_path, "memories_ns_created", pages=2)
    caplog.set_level(logging.INFO)
    async with running_node(cfg):
        ready = await http_get(cfg.mesh.health_port, "/readyz")
        assert ready is not None and ready[0] == 503
        (reason,) = json.loads(ready[1])["reasons"]
        assert reason["code"] == "storage_corrupt"
        assert str(cfg.db_path) in reason["message"] and "the indexes of table memories" in reason["message"]
        assert "ai-memory repair" in reason["message"] and "from the mesh" in reason["message"]

        with pytest.raises(ServiceError) as refused:  # a client of the node, over its local socket
            await ask_node(cfg, "memory_store", {"content": "after the damage"})
        assert refused.value.code == "storage_corrupt"
        got = await ask_node(cfg, "memory_get", {"id": ids[0]})  # what still reads is served
        assert isinstance(got, dict) and got["id"] == ids[0]

        metrics = await http_get(cfg.mesh.health_port, "/metrics")
        assert metrics is not None and 'aimem_storage_condition{code="storage_corrupt"} 1.0' in metrics[1]
        assert "aimem_ready 0.0" in metrics[1]

        doctor = await asyncio.to_thread(ai_memory, config, "doctor", "--json")
        assert doctor.returncode == 3, doctor.stderr
        found = json.loads(doctor.stdout)["storage_integrity"]
        assert found["ok"] is False and [d["what"] for d in found["damaged"]] == ["the indexes of table memories"]

        repair = await asyncio.to_thread(ai_memory, config, "repair")
        assert repair.returncode == 1 and "error [in_use]: the node is running" in repair.stderr
    logged = [r for r in caplog.records if r.getMessage() == "storage_corrupt"]
    assert len(logged) == 1 and logged[0].ev["path"] == str(cfg.db_path)  # type: ignore[attr-defined]

    repair = await asyncio.to_thread(ai_memory, config, "repair")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "rebuilt every index" in repair.stdout and "after: integrity_check: sound" in repair.stdout
    async with running_node(cfg):
        ready = await http_get(cfg.mesh.health_port, "/readyz")
        assert ready is not None and ready[0] == 200, ready
        stored = await ask_node(cfg, "memory_store", {"content": "after the repair"})
        assert isinstance(stored, dict) and stored["id"]
        for memory_id in ids:  # every memory it held, there once more
            got = await ask_node(cfg, "memory_get", {"id": memory_id})
            assert isinstance(got, dict) and got["id"] == memory_id
        found = await ask_node(cfg, "memory_recall", {"query": "needle7"})
        assert isinstance(found, list) and [m["id"] for m in found] == [ids[7]]
    doctor = await asyncio.to_thread(ai_memory, config, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "storage_integrity: ok (integrity_check" in doctor.stdout


async def test_repair_says_what_it_cannot_rebuild_and_exits_3(tmp_path: Path) -> None:
    config, cfg, _ = await filled_node(tmp_path)
    damage(cfg.db_path, "memories", pages=2)
    repair = await asyncio.to_thread(ai_memory, config, "repair")
    assert repair.returncode == 3, repair.stdout + repair.stderr
    assert "NOT DONE: table memories (rows on damaged pages cannot be read)" in repair.stdout
    assert "restore the store from a backup, or from the mesh" in repair.stdout
