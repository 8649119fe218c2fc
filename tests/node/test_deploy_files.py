"""The deployment files in configs/: a systemd unit (with a drop-in for a local Postgres), a compose file and a
Dockerfile that run the node unprivileged, with the command the CLI really has and a health check on the port the
node's config names. Each is checked by the tool that runs it where that tool is installed (`systemd-analyze
verify` and its security score, `docker compose config`, `docker-compose config`), not only read."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli import build_parser
from node.config import MeshConfig
from testbed.env import image
from tests.needs import needs

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
UNIT = CONFIGS / "ai-memory.service"
POSTGRES_DROP_IN = CONFIGS / "ai-memory.service.d" / "postgres.conf"
COMPOSE = CONFIGS / "compose.yaml"
DOCKERFILE = CONFIGS / "Dockerfile"
# `systemd-analyze security` exposure (0 safest .. 10) the unit must stay under (issue 33: 8.5 before).
MAX_EXPOSURE = 3.0
TOOL_TIMEOUT_S = 120


def _argv_parses(argv: list[str]) -> None:
    assert argv[0].endswith("ai-memory")
    build_parser().parse_args(argv[1:])  # exits (SystemExit) on an option the CLI does not have


def _unit(*paths: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(paths)
    return unit


def _installed_unit(tmp_path: Path, drop_in: bool) -> Path:
    """The unit as installed on this machine: ExecStart names the real `ai-memory` (so verify finds it), with the
    Postgres drop-in in <unit>.d/ when ``drop_in``."""
    ai_memory = Path(sys.executable).with_name("ai-memory")
    assert ai_memory.exists(), ai_memory
    text = UNIT.read_text().replace("/opt/attested-mesh/bin/ai-memory", str(ai_memory))
    (tmp_path / UNIT.name).write_text(text)
    if drop_in:
        (tmp_path / f"{UNIT.name}.d").mkdir()
        shutil.copy(POSTGRES_DROP_IN, tmp_path / f"{UNIT.name}.d" / POSTGRES_DROP_IN.name)
    return tmp_path / UNIT.name


def test_systemd_unit_runs_serve_unprivileged_and_outwaits_the_drain() -> None:
    service = _unit(UNIT)["Service"]
    assert service["User"] not in ("", "root")
    _argv_parses(service["ExecStart"].split())
    assert service["ExecStart"].split()[-1] == "serve"
    assert int(service["TimeoutStopSec"]) > MeshConfig().drain_timeout_s
    assert service["UMask"] == "0077"


def test_systemd_unit_is_notify_with_its_home_as_state_directory() -> None:
    service = _unit(UNIT)["Service"]
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"  # node/sdnotify.py
    home = f"/var/lib/{service['StateDirectory']}"
    assert service["StateDirectoryMode"] == "0700"
    assert service["Environment"] == f"AI_MEMORY_HOME={home}" and service["WorkingDirectory"] == home
    assert f"--config {home}/config.toml" in service["ExecStart"]
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"


def test_the_postgres_drop_in_starts_the_node_after_postgres_without_binding_it() -> None:
    unit = _unit(UNIT, POSTGRES_DROP_IN)["Unit"]
    assert "postgresql.service" in unit["After"].split() and "postgresql.service" in unit["Wants"].split()
    # The node rides out a Postgres stop (docs/operations.md): stopping Postgres must not stop it.
    assert "Requires" not in unit and "BindsTo" not in unit
    assert "postgresql" not in _unit(UNIT)["Unit"].get("After", "")


@needs("systemd-analyze")
@pytest.mark.parametrize("drop_in", [False, True], ids=["sqlite", "postgres"])
def test_systemd_unit_verifies(tmp_path: Path, drop_in: bool) -> None:
    path = _installed_unit(tmp_path, drop_in)
    p = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True,
                       timeout=TOOL_TIMEOUT_S)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr


@needs("systemd-analyze")
@pytest.mark.parametrize("drop_in", [False, True], ids=["sqlite", "postgres"])
def test_systemd_unit_exposure_is_under_3(tmp_path: Path, drop_in: bool) -> None:
    path = _installed_unit(tmp_path, drop_in)
    p = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                       capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    m = re.search(r"Overall exposure level for ai-memory\.service: (\d+\.\d+)", p.stdout)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) < MAX_EXPOSURE, p.stdout


def test_dockerfile_runs_as_a_non_root_user_with_a_healthcheck_the_cli_has() -> None:
    text = DOCKERFILE.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and all(not u.startswith(("root", "0:")) and u != "0" for u in users)
    health = re.search(r"^HEALTHCHECK .*?CMD (\[.+?\])$", text, re.M | re.S)
    assert health
    _argv_parses(json.loads(health.group(1)))
    assert json.loads(health.group(1))[-1] == "health"
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd and json.loads(cmd.group(1)) == ["ai-memory", "serve"]


def test_dockerfile_exposes_its_ports_and_labels_the_image() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^EXPOSE 7443/tcp 7444/tcp$", text, re.M)
    labels = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", text))
    assert {"org.opencontainers.image.title", "org.opencontainers.image.version",
            "org.opencontainers.image.base.name"} <= labels


def test_dockerfile_copies_only_what_the_build_context_holds() -> None:
    # testbed/env/image.py's build_node makes the context: the Dockerfile and wheels/.
    sources = [line.split()[1:-1] for line in DOCKERFILE.read_text().splitlines() if line.startswith(("COPY", "ADD"))]
    assert sources == [["wheels"]]


@pytest.mark.parametrize("path", [UNIT, POSTGRES_DROP_IN, COMPOSE, DOCKERFILE], ids=lambda p: p.name)
def test_every_file_a_deployment_file_names_is_in_the_repository(path: Path) -> None:
    named = set(re.findall(r"\b((?:configs|docs|scripts)/[\w./-]+\w|[A-Z]+\.md)\b", path.read_text()))
    assert named, path
    assert [n for n in named if not (ROOT / n).exists()] == []


def test_compose_file_runs_serve_unprivileged_with_init_log_limits_and_a_healthcheck() -> None:
    text = COMPOSE.read_text()
    assert re.search(r'^\s+user: "10001:10001"$', text, re.M)
    assert re.search(r"^\s+init: true$", text, re.M)
    assert re.search(r'^\s+max-size: "\d+m"$', text, re.M) and re.search(r'^\s+max-file: "\d+"$', text, re.M)
    command = re.search(r"^\s+command: (\[.*\])$", text, re.M)
    assert command
    _argv_parses(json.loads(command.group(1)))
    health = re.search(r"^\s+healthcheck:\n\s+test: (\[.*\])$", text, re.M)
    assert health and json.loads(health.group(1))[0] == "CMD"
    _argv_parses(json.loads(health.group(1))[1:])


def test_compose_names_the_image_tag_the_build_makes() -> None:
    m = re.search(r"^\s+image: \$\{AI_MEMORY_IMAGE:-(.+)\}$", COMPOSE.read_text(), re.M)
    assert m and m.group(1) == image.release_tag()  # `testbed image node` tags it (testbed/env/image.py)


def _compose_config(cmd: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``cmd -f configs/compose.yaml config`` run from a directory outside the checkout."""
    return subprocess.run([*cmd, "-p", "ai-memory", "-f", str(COMPOSE), "config", *(["--format", "json"] if
                          cmd[-1] == "compose" else [])], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                          cwd=tmp_path, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)})


@needs("compose-plugin")
def test_compose_v2_takes_the_file_and_mounts_nothing_from_the_checkout(tmp_path: Path) -> None:
    p = _compose_config(["docker", "compose"], tmp_path)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
    service = json.loads(p.stdout)["services"]["ai-memory"]
    assert service["init"] is True and service["user"] == "10001:10001"
    assert service["image"] == image.release_tag()
    assert service["logging"]["driver"] == "json-file" and set(service["logging"]["options"]) == {"max-size",
                                                                                                   "max-file"}
    assert service["healthcheck"]["test"][-1] == "health"
    sources = [Path(v["source"]) for v in service["volumes"]]
    assert sources and all(ROOT not in s.parents and s != ROOT for s in sources), sources


@needs("docker-compose")
def test_compose_1x_takes_the_file(tmp_path: Path) -> None:
    p = _compose_config(["docker-compose"], tmp_path)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
    assert "init: true" in p.stdout and f"image: {image.release_tag()}" in p.stdout
