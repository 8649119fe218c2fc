"""`testbed bench --everything-on`: the files it writes, nodes that start with them and report them loaded,
and a tiny fan-out that completes. Real node subprocesses on loopback; no timing assertions."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import pytest

from node.config import load_config
from node.mcp.socket import ask_node
from testbed.bench import everything_on
from testbed.mesh import LocalMesh
from tests.layouts import new_layout
from tests.testbed.test_cli import run_testbed

pytestmark = pytest.mark.integration


def test_mesh_with_everything_on_has_the_files_and_every_node_reports_them_loaded(tmp_path: Path) -> None:
    layout = new_layout(tmp_path / "m", 3, mcp_http=False)
    everything_on.apply(layout)
    for spec in layout.nodes:
        hooks = tomllib.loads((spec.home / "hooks.toml").read_text())["hooks"]
        assert [(h["name"], h["mode"], h["events"]) for h in hooks] == [(everything_on.HOOK_NAME, "daemon",
                                                                          ["post_recall"])]
        assert Path(hooks[0]["command"][1]).read_text() == everything_on.DAEMON
        perms = tomllib.loads((spec.home / "permissions.toml").read_text())
        assert perms["mode"] == "enforce" and len(perms["rules"]) == everything_on.RULES
        mine = [r for r in perms["rules"] if r["agent"] == spec.agent_id]
        assert mine == [{"agent": spec.agent_id, "namespace": "*", "operations": ["*"], "action": "allow",
                         "inherit": True}]
    with LocalMesh(layout):
        for spec in layout.nodes:
            cfg = load_config(spec.config_path, env={})
            caps = asyncio.run(ask_node(cfg, "memory_capabilities"))
            assert isinstance(caps, dict)
            assert everything_on.loaded(caps)["hook_runners"][everything_on.HOOK_NAME]["state"] == "not_started"
            # The node's own recall passes the 1,000-rule gate and fires the daemon hook, which starts it.
            assert asyncio.run(ask_node(cfg, "memory_recall", {"query": "anything"})) == []
            caps = asyncio.run(ask_node(cfg, "memory_capabilities"))
            assert isinstance(caps, dict)
            got = everything_on.check(caps, spec.agent_id)  # raises unless all three are on, daemon running
            assert got["rules"] == everything_on.RULES and got["permissions_mode"] == "enforce"
            assert got["hooks"] == [everything_on.HOOK_NAME] and got["signing"] is True
            assert all(p["link_state"] == "up" for p in caps["peers"])
            assert caps["hooks"]["hooks"][0]["counts"] == {"fired": 1, "allowed": 1}


def test_bench_everything_on_quick_completes_and_says_which_mode_ran(tmp_path: Path, short_tmp: Path) -> None:
    out = tmp_path / "out"
    r = run_testbed("bench", "--quick", "--messages", "10", "--warmup", "2", "--everything-on", "--out", str(out),
                    "--dir", str(short_tmp / "work"), "--no-plot")
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "bench.json").read_text())
    assert report["mode"].startswith("everything on")
    (row,) = report["results"]
    assert row["ours"]["samples"] == 10
    assert set(row["everything_on_loaded"]) == {f"ai:node-{i}@testbed" for i in (1, 2, 3)}
    assert all(v["rules"] == everything_on.RULES and v["signing"] for v in row["everything_on_loaded"].values())
    assert "Mode: everything on" in (out / "bench.md").read_text()
    assert list((short_tmp / "work").iterdir()) == []


def test_everything_on_is_refused_with_docker_and_default_mode_is_reported(tmp_path: Path, short_tmp: Path) -> None:
    r = run_testbed("bench", "--backend", "docker", "--everything-on", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "--everything-on applies to the local backend only" in r.stderr
    out = tmp_path / "out"
    r = run_testbed("bench", "--nodes", "3", "--messages", "5", "--warmup", "1", "--out", str(out),
                    "--dir", str(short_tmp / "work"), "--no-plot")
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "bench.json").read_text())
    assert report["mode"].startswith("default") and report["results"][0]["everything_on_loaded"] is None
