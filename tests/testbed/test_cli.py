"""`testbed` CLI end to end: real node subprocesses on loopback, bounded waits, cleanup always."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 120


def run_testbed(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=CMD_TIMEOUT_S, cwd=cwd or ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` (TIME_WAIT leftovers of closed connections do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def kill_recorded(state_file: Path) -> None:
    """Last-resort cleanup: SIGKILL the pids a failed test left recorded."""
    if not state_file.exists():
        return
    for node in json.loads(state_file.read_text())["nodes"]:
        if pid_alive(node["pid"]):
            os.kill(node["pid"], signal.SIGKILL)


@pytest.fixture
def tb_dir(tmp_path: Path):
    d = tmp_path / "tb"
    yield d
    if (d / "testbed.json").exists():
        run_testbed("down", "--dir", str(d), "--grace", "2")
        kill_recorded(d / "testbed.json")


def test_up_status_down_leaves_no_process_and_no_port(tb_dir: Path) -> None:
    r = run_testbed("up", "--nodes", "3", "--dir", str(tb_dir))
    assert r.returncode == 0, r.stderr
    assert "links up" in r.stderr
    state = json.loads((tb_dir / "testbed.json").read_text())
    assert len(state["nodes"]) == 3

    st = run_testbed("status", "--dir", str(tb_dir), "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    nodes = json.loads(st.stdout)["nodes"]
    assert [n["alive"] for n in nodes] == [True] * 3
    assert all(n["health"] == "ok" and n["links_up"] == n["links"] == 2 for n in nodes)

    again = run_testbed("up", "--nodes", "3", "--dir", str(tb_dir))
    assert again.returncode == 0 and "already running" in again.stderr

    logs = run_testbed("logs", "node-2", "--dir", str(tb_dir), "--lines", "5")
    assert logs.returncode == 0 and logs.stdout.strip()

    dn = run_testbed("down", "--dir", str(tb_dir))
    assert dn.returncode == 0, dn.stderr
    assert not any(pid_alive(n["pid"]) for n in state["nodes"])
    ports = [p for n in state["nodes"] for p in (n["port"], n["health_port"], n["mcp_http_port"]) if p]
    assert all(port_free(p) for p in ports)
    assert not (tb_dir / "testbed.json").exists()


@pytest.mark.parametrize("count", ["0", "1", "500"])
def test_bad_node_count_is_refused(tb_dir: Path, count: str) -> None:
    r = run_testbed("up", "--nodes", count, "--dir", str(tb_dir))
    assert r.returncode == 2
    assert "--nodes must be between" in r.stderr
    assert not tb_dir.exists()


def test_dir_holding_foreign_files_is_refused(tb_dir: Path) -> None:
    tb_dir.mkdir()
    (tb_dir / "notes.txt").write_text("mine")
    r = run_testbed("up", "--nodes", "2", "--dir", str(tb_dir))
    assert r.returncode != 0 and "dir_not_empty" in r.stderr
    assert sorted(p.name for p in tb_dir.iterdir()) == ["notes.txt"]


def test_port_in_use_is_refused_and_nothing_runs(tb_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_testbed("up", "--nodes", "2", "--dir", str(tb_dir), "--base-port", str(max(1024, port - 3)))
    assert r.returncode != 0 and "in use" in r.stderr
    assert not (tb_dir / "testbed.json").exists()


def test_status_and_down_without_a_testbed_explain(tb_dir: Path) -> None:
    for cmd in ("status", "down"):
        r = run_testbed(cmd, "--dir", str(tb_dir))
        assert r.returncode != 0 and "no testbed" in r.stderr


def test_bench_smoke_writes_percentiles_for_ours_and_floor(tmp_path: Path, short_tmp: Path) -> None:
    out = tmp_path / "out"
    r = run_testbed("bench", "--nodes", "3", "--messages", "20", "--out", str(out), "--dir", str(short_tmp / "work"),
                    "--no-plot")
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "bench.json").read_text())
    (row,) = report["results"]
    assert row["nodes"] == 3
    for side in ("ours", "floor"):
        assert {"p50_ms", "p95_ms", "p99_ms", "max_ms", "throughput_msg_s"} <= row[side].keys()
        assert row[side]["samples"] == 20
    assert "| 3 |" in r.stdout
    assert report["backend"]["name"] == "local" and "bench 3 nodes [1/3] starting the mesh, local backend" in r.stderr
    assert "bench 3 nodes [3/3] 20 messages each, in 5 rounds" in r.stderr
    assert "Backend: local backend" in (out / "bench.md").read_text()
    assert list((short_tmp / "work").iterdir()) == []
