"""`testbed bench` with the NATS peer: figures when nats-server and nats-py are here, a stated omission when not.

Without nats-server (`scripts/system-deps` installs it; `testbed doctor` says how) the NATS smoke run skips with
the reason, and the omission test (which hides nats-server from PATH) runs everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.bench import nats_peer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 180


def bench(root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The bench writes under ``root``: a short path (``short_tmp``), as its nodes' Unix sockets live there."""
    return subprocess.run([sys.executable, "-m", "testbed.cli", "bench", "--nodes", "3", "--messages", "20",
                           "--out", str(root / "out"), "--dir", str(root / "w"), "--no-plot"],
                          capture_output=True, text=True, timeout=CMD_TIMEOUT_S, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def leftover_procs(root: Path) -> list[str]:
    """Processes whose command line still names the bench work dir (nodes, receivers, nats-server, responders)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmd:
            found.append(f"{d.name}: {cmd}")
    return found


def test_bench_reports_nats_figures(short_tmp: Path) -> None:
    if reason := nats_peer.unavailable():
        pytest.skip(f"NATS peer not measurable here: {reason}")
    r = bench(short_tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((short_tmp / "out" / "bench.json").read_text())
    assert report["nats"]["available"] is True and report["nats"]["omitted_reason"] is None
    [row] = report["results"]
    n = row["nats"]
    assert n["samples"] == 20
    assert 0 < n["p50_ms"] <= n["p95_ms"] <= n["p99_ms"] <= n["max_ms"] < 10_000
    assert n["throughput_msg_s"] > 0 and len(n["cpu_ms_per_msg_receivers"]) == 2
    assert n["cpu_ms_per_msg_server"] >= 0
    assert row["ratio_p95_nats"] == pytest.approx(row["ours"]["p95_ms"] / n["p95_ms"])
    assert row["p95_le_nats"] == (row["ours"]["p95_ms"] <= n["p95_ms"])
    assert len(json.loads((short_tmp / "out" / "samples.json").read_text())["3"]["nats"]) == 20
    assert "p95 ÷ NATS (rounds)" in (short_tmp / "out" / "bench.md").read_text()
    rounds = row["rounds"]
    assert rounds["count"] == 5 and sum(rounds["messages"]) == 20
    assert rounds["nats"]["held"] == sum(r <= 1 for r in rounds["nats"]["p95_ratios"])
    # nats-py's TLS close line (nats_peer.NATS_PY_TLS_EOF) no longer reaches the terminal, from any process.
    assert "eof_received" not in r.stderr
    assert leftover_procs(short_tmp) == []


def test_bench_without_nats_server_says_so_and_omits_nats(short_tmp: Path) -> None:
    # Hide nats-server: keep only PATH entries without it (the bench runs under sys.executable's full path).
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not (Path(d) / "nats-server").exists())
    r = bench(short_tmp, {"PATH": path})
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((short_tmp / "out" / "bench.json").read_text())
    assert report["nats"]["available"] is False
    assert "nats-server not installed" in report["nats"]["omitted_reason"]
    [row] = report["results"]
    assert row["nats"] is None and row["ratio_p95_nats"] is None
    assert row["ours"]["samples"] == 20 and row["floor"]["samples"] == 20
    assert "NATS peer omitted: nats-server not installed" in (short_tmp / "out" / "bench.md").read_text()
    assert leftover_procs(short_tmp) == []
