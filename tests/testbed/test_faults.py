"""`testbed up --netns` + `testbed fault`: real nodes in network namespaces, bounded waits, cleanup always."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.faults import parse_netem
from tests.integration.conftest import wait_for
from tests.needs import needs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 120
WAIT_S = 60.0


def tb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=CMD_TIMEOUT_S, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def node_cli(home: Path, *args: str) -> tuple[int, object]:
    r = subprocess.run([sys.executable, "-m", "node.cli", "--config", str(home / "config.toml"), *args, "--json"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**{k: v for k, v in os.environ.items() if k != "AI_MEMORY_HOME"},
                            "AI_MEMORY_HOME": str(home), "PYTHONPATH": str(ROOT)})
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, r.stdout


def eventually(check, what: str, timeout_s: float = WAIT_S):
    return wait_for(check, what, timeout_s, poll_s=0.2)


def ours_left(ids: list[str]) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=15).stdout
    return [line.split()[0] for line in out.splitlines() if any(line.startswith(f"am-{i}-") for i in ids)]


def test_parse_netem() -> None:
    em = parse_netem("delay 25ms 5ms loss 1%")
    assert (em.delay_ms, em.jitter_ms, em.loss_pct, em.emulated_rtt_ms) == (25.0, 5.0, 1.0, 50.0)
    assert parse_netem("delay 0.1s").delay_ms == 100.0


@needs("netns", "iptables", "ss")
def test_partition_heal_latency_kill_restart_down(tmp_path: Path) -> None:
    d = tmp_path / "tb"
    net_id = None
    try:
        r = tb("up", "--nodes", "3", "--netns", "--dir", str(d))
        assert r.returncode == 0, r.stderr
        net = json.loads((d / "netns.json").read_text())
        net_id = net["id"]
        assert len(ours_left([net_id])) == 4  # hub + 3 nodes
        st = json.loads(tb("status", "--dir", str(d), "--json").stdout)["nodes"]
        assert all(n["links_up"] == n["links"] == 2 for n in st)
        assert all(n["addr"].startswith("10.231.") for n in st)

        homes = {i: d / f"node-{i}" for i in (1, 2, 3)}
        assert tb("fault", "partition", "1", "2", "--dir", str(d)).returncode == 0

        def peers_of_1() -> dict:
            return json.loads(tb("status", "--dir", str(d), "--json").stdout)["nodes"][0]["peers"]

        eventually(lambda: peers_of_1()["ai:node-2@testbed"] != "up", "node 1 sees node 2 down")
        rc, mem = node_cli(homes[1], "store", "written during the partition")
        assert rc == 0, mem
        eventually(lambda: node_cli(homes[3], "get", mem["id"])[0] == 0, "memory on node 3")
        assert node_cli(homes[2], "get", mem["id"])[0] != 0  # partitioned: not on node 2

        assert tb("fault", "heal", "all", "--dir", str(d)).returncode == 0
        eventually(lambda: node_cli(homes[2], "get", mem["id"])[0] == 0, "memory on node 2 after heal")

        r = tb("fault", "latency", "3", "50ms", "--dir", str(d))
        assert r.returncode == 0, r.stderr
        ns3 = net["nodes"][2]["ns"]
        chain = subprocess.run(["ip", "netns", "exec", ns3, "iptables", "-S", "am_fault"], capture_output=True,
                               text=True, timeout=15).stdout
        assert "NFQUEUE" in chain  # user-space netem: this kernel has no sch_netem
        st = json.loads(tb("status", "--dir", str(d), "--json").stdout)["nodes"]
        assert st[2]["netem"] == "delay 50ms" and st[2]["helper"] == "alive"
        rc, mem2 = node_cli(homes[1], "store", "written with node 3 delayed")
        assert rc == 0
        eventually(lambda: node_cli(homes[3], "get", mem2["id"])[0] == 0, "memory on delayed node 3")

        old_pid = st[1]["pid"]
        assert tb("fault", "kill", "2", "--dir", str(d)).returncode == 0
        r = tb("fault", "restart", "2", "--dir", str(d))
        assert r.returncode == 0, r.stderr
        st = json.loads(tb("status", "--dir", str(d), "--json").stdout)["nodes"]
        assert st[1]["alive"] and st[1]["pid"] != old_pid

        r = tb("down", "--dir", str(d), "--grace", "5")
        assert r.returncode == 0, r.stderr
        assert ours_left([net_id]) == []
        assert not d.exists()
    finally:
        if d.exists():
            tb("down", "--dir", str(d), "--grace", "2")
        if net_id:
            for ns in ours_left([net_id]):
                subprocess.run(["ip", "netns", "del", ns], timeout=15)


@needs("netns")
def test_faults_refused_on_loopback_testbed(tmp_path: Path) -> None:
    d = tmp_path / "tb"
    try:
        assert tb("up", "--nodes", "2", "--dir", str(d)).returncode == 0
        r = tb("fault", "latency", "1", "10ms", "--dir", str(d))
        assert r.returncode == 2 and "--netns" in r.stderr
    finally:
        tb("down", "--dir", str(d), "--grace", "2")
