"""The deployment files in configs/: a systemd unit, a compose file and a Dockerfile that run the node
unprivileged, with the command the CLI really has and a health check on the plain health port."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from node.cli import build_parser
from node.config import MeshConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _argv_parses(argv: list[str]) -> None:
    assert argv[0].endswith("ai-memory")
    build_parser().parse_args(argv[1:])  # exits (SystemExit) on an option the CLI does not have


def test_systemd_unit_runs_serve_unprivileged_and_outwaits_the_drain() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(CONFIGS / "ai-memory.service")
    service = unit["Service"]
    assert service["User"] not in ("", "root")
    _argv_parses(service["ExecStart"].split())
    assert service["ExecStart"].split()[-1] == "serve"
    assert int(service["TimeoutStopSec"]) > MeshConfig().drain_timeout_s
    assert service["UMask"] == "0077"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_unit_has_no_syntax_errors() -> None:
    p = subprocess.run(["systemd-analyze", "verify", str(CONFIGS / "ai-memory.service")], capture_output=True,
                       text=True, timeout=60)
    # The binary is not installed at its path on a test machine; every other complaint is a real error.
    problems = [line for line in p.stderr.splitlines() if line.strip() and "is not executable" not in line]
    assert not problems, p.stderr


def test_dockerfile_runs_as_a_non_root_user_with_a_healthcheck() -> None:
    text = (CONFIGS / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and all(not u.startswith(("root", "0:")) and u != "0" for u in users)
    health = re.search(r"^HEALTHCHECK .*?CMD (.+?)$", text, re.M | re.S)
    assert health and "/healthz" in health.group(1) and "127.0.0.1" in health.group(1)
    cmd = re.search(r"^CMD \[(.*)\]$", text, re.M)
    assert cmd and [a.strip().strip('"') for a in cmd.group(1).split(",")] == ["ai-memory", "serve"]


def test_compose_file_runs_serve_unprivileged_with_a_healthcheck() -> None:
    text = (CONFIGS / "compose.yaml").read_text()
    assert re.search(r'^\s+user: "10001:10001"$', text, re.M)
    command = re.search(r"^\s+command: \[(.*)\]$", text, re.M)
    assert command
    _argv_parses([a.strip().strip('"') for a in command.group(1).split(",")])
    assert re.search(r"^\s+healthcheck:\n\s+test: .*127\.0\.0\.1:7444/healthz", text, re.M)
