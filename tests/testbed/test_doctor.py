"""`testbed doctor` and the skip reasons tests get from it: each missing tool named with its install command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.env import doctor

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_tool_is_named_with_its_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert doctor.missing("iptables") == "iptables not installed (apt-get install -y iptables)"
    assert doctor.missing("iptables", "nats-server") == ("iptables not installed (apt-get install -y iptables); "
                                                         "nats-server not installed (apt-get install -y nats-server)")


def test_a_tool_on_path_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tool = tmp_path / "nats-server"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert doctor.missing("nats-server") is None
    assert doctor.check("nats-server").detail == str(tool)


def test_every_tool_has_an_install_command() -> None:
    assert all(t.install and t.used_by for t in doctor.TOOLS)
    assert len(doctor.BY_NAME) == len(doctor.TOOLS)


def test_doctor_command_lists_every_tool_and_exits_3_when_one_is_missing(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "doctor", "--json"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env={**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(ROOT)})
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == [t.name for t in doctor.TOOLS]
    iptables = next(row for row in rows if row["name"] == "iptables")
    assert iptables["ok"] is False and iptables["install"] == "apt-get install -y iptables"
    assert r.returncode == doctor.EXIT_SOMETHING_MISSING


def test_doctor_table_says_missing_and_how_to_install(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "doctor"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env={**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert r.returncode == doctor.EXIT_SOMETHING_MISSING
    line = next(ln for ln in r.stdout.splitlines() if " iptables " in ln)
    assert line.startswith("MISSING") and "install: apt-get install -y iptables" in line
    assert r.stdout.rstrip().endswith("missing")


def test_system_deps_installs_every_apt_package_the_table_names() -> None:
    script = (ROOT / "scripts" / "system-deps").read_text()
    listed = set(script.split("packages=(", 1)[1].split(")", 1)[0].split())
    named = {pkg for t in doctor.TOOLS for pkg in t.apt}
    assert named <= listed
    assert all(" ".join(t.apt) in t.install for t in doctor.TOOLS)
