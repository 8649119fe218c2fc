"""The CLI as an operator meets it on a first day: `status` as a probe, a pipe closed early, the dead letters' times,
recall scores on one scale on either backend, and a missing `mcp --home`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from node.cli.common import resolve_config
from node.config import NodeConfig
from node.log import iso_ms
from node.service import Service, relative_scores
from storage import outbox
from storage.backend import open_database
from tests.node.conftest import run_cli as run

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 60.0


def test_status_of_a_stopped_node_exits_3_so_it_can_be_a_probe(capsys, home: Path) -> None:
    rc, out, err = run(capsys, "--home", str(home), "status")
    assert rc == 3 and "NOT RUNNING" in out and "no node answers" in err


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(capsys, home: Path) -> None:
    assert run(capsys, "--home", str(home), "store", "hello pipe")[0] == 0
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "AI_MEMORY_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "node.cli", "list"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # as `| head -1` does once it has its line: here before the first write
    _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 141 and err == b""


async def _dead_letter(cfg: NodeConfig) -> int:
    db = await open_database(backend="sqlite", path=cfg.db_path)
    try:
        row = await db.write(outbox.enqueue, "c1", "ai:b@lab", "ping", b"\xa1env", 10**13, 0, 0)
        dead = await db.write(outbox.to_dead_letter, row, "link_down: no connection", 1_767_225_600_123)
        assert dead is not None
        return dead
    finally:
        await db.close()


def test_dead_letters_show_when_each_died(capsys, home: Path) -> None:
    dead_id = asyncio.run(_dead_letter(_cfg(home)))
    rc, out, _ = run(capsys, "--home", str(home), "a2a", "dead-letters")
    assert rc == 0 and out.split()[:2] == [str(dead_id), "2026-01-01T00:00:00.123Z"]
    assert iso_ms(1_767_225_600_123) == "2026-01-01T00:00:00.123Z"
    rc, out, _ = run(capsys, "--home", str(home), "a2a", "dead-letters", "--json")
    assert rc == 0 and json.loads(out)[0]["dead_at"] == 1_767_225_600_123  # JSON keeps unix ms


def test_relative_scores_put_the_best_hit_at_one() -> None:
    assert relative_scores([2.2e-6, 1.7e-6, 1.7e-6]) == [1.0, 0.7727, 0.7727]
    assert relative_scores([0.6, 0.0]) == [1.0, 0.0001]
    assert relative_scores([0.0, 0.0]) == [1.0, 1.0] and relative_scores([]) == []


async def test_recall_scores_are_on_one_scale_on_either_backend(svc: Service) -> None:
    await svc.memory_store("hello world, hello again, hello")
    for i in range(3):
        await svc.memory_store(f"hello world {i} with some more words around it")
    hits = await svc.memory_recall("hello world")
    scores = [h["score"] for h in hits]
    assert len(hits) == 4 and scores[0] == 1.0 and all(0 < s <= 1 for s in scores)
    assert scores == sorted(scores, reverse=True) and scores[-1] < 1.0


def test_mcp_with_a_missing_home_says_so_about_home(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    rc, out, err = run(capsys, "mcp", "--home", str(missing))
    assert rc == 1 and out == ""
    assert err.startswith(f"ai-memory: error [home_not_found]: --home {missing}: there is no such directory")
    assert err.count("\n") == 1 and not missing.exists()



def _cfg(home: Path) -> NodeConfig:
    return resolve_config(argparse.Namespace(home=home, config=None))
