"""`testbed --backend docker` end to end: base image, a 3-node mesh in host-network containers, status,
down leaves no container. Skips (with the reason) wherever `docker info` does not answer; never installs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.env import doctor, engine, image
from testbed.mesh import build_layout
from testbed.mesh.docker import render_compose
from tests.needs import needs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 300
BASE_TIMEOUT_S = 1800  # debootstrap + apt-get from the Debian mirror, once per session


def run_testbed(*args: str, timeout: float = CMD_TIMEOUT_S, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


needs_engine = needs("docker")


@pytest.fixture(scope="session")
def base_image() -> str:
    if image.image_id(image.BASE_TAG) is None:
        if reason := doctor.missing("root", "debootstrap"):
            pytest.skip(f"no {image.BASE_TAG} and cannot build it here: {reason}")
        r = run_testbed("image", "base", "--tag", image.BASE_TAG, timeout=BASE_TIMEOUT_S)
        assert r.returncode == 0, r.stderr
    r = run_testbed("image", "base", "--tag", image.BASE_TAG)
    assert r.returncode == 0, r.stderr
    assert "already exists" in r.stderr and "kept" in r.stderr  # idempotent without --force
    return image.BASE_TAG


def test_missing_engine_is_reported(tmp_path: Path) -> None:
    """No reachable daemon: a clear message and a non-zero exit, for `image engine` and `up`."""
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-such-docker.sock"}
    r = run_testbed("image", "engine", env=env)
    assert r.returncode != 0
    assert "NOT reachable" in r.stderr
    r = run_testbed("up", "--nodes", "2", "--backend", "docker", "--dir", str(tmp_path / "tb"), env=env)
    assert r.returncode != 0
    assert "engine_unavailable" in r.stderr and "not reachable" in r.stderr
    assert not (tmp_path / "tb").exists()


def test_compose_is_host_network_with_same_path_mounts(tmp_path: Path) -> None:
    layout = build_layout(tmp_path / "tb", 3)
    text = render_compose(layout, "attested-mesh-node:test", "am-test")
    assert text.count("network_mode: host") == 3
    assert "networks:" not in text
    for spec in layout.nodes:
        assert json.dumps(f"{spec.home}:{spec.home}") in text
        assert json.dumps(["ai-memory", "--config", str(spec.config_path), "serve"]) in text


@needs_engine
def test_up_status_down(tmp_path: Path, base_image: str) -> None:
    d = tmp_path / "tb"
    ids: list[str] = []
    try:
        r = run_testbed("up", "--nodes", "3", "--backend", "docker", "--dir", str(d), "--timeout", "90")
        assert r.returncode == 0, r.stderr
        assert "3 nodes up, every link up" in r.stdout
        ids = list(json.loads((d / "docker.json").read_text())["containers"].values())
        assert len(ids) == 3
        state = json.loads((d / "testbed.json").read_text())
        assert state["backend"] == "docker"

        r = run_testbed("status", "--dir", str(d), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = json.loads(r.stdout)["nodes"]
        assert [(n["alive"], n["health"], n["links_up"], n["links"]) for n in rows] == [(True, "ok", 2, 2)] * 3

        r = run_testbed("logs", "2", "--dir", str(d), "--lines", "0")
        assert r.returncode == 0 and "node_ready" in r.stdout

        r = run_testbed("up", "--nodes", "3", "--backend", "docker", "--dir", str(d))
        assert r.returncode == 0 and "already running" in r.stderr

        r = run_testbed("down", "--dir", str(d), "--grace", "5")
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("stopped and removed") == 3
        for cid in ids:
            assert engine.docker("inspect", "--type", "container", cid, check=False).returncode != 0
        left = engine.docker("ps", "-aq", "--filter", f"label=attested-mesh.testbed={d}").stdout.decode().split()
        assert left == []
        assert not d.exists()
    finally:
        for cid in ids:  # last resort: only the containers this test started
            engine.docker("rm", "-f", cid, check=False)
