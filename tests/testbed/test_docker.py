"""`testbed --backend docker` end to end: base image, a 3-node mesh in host-network containers started by each
compose implementation installed here (Compose v2's plugin, Debian 12's docker-compose 1.29) and by `docker run`,
every container healthy in Docker's eyes, a memory stored on one node and recalled on another, status, down leaves
no container; a node image never kept across a change of base; the bench on containers says so; configs/compose.yaml
run by both composes as an operator would, healthy and drained through tini. Skips (with the
reason) wherever `docker info` does not answer; never installs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.env import doctor, engine, image
from testbed.mesh import build_layout
from testbed.mesh.docker import COMPOSE_FILE, project_name, render_compose
from tests.layouts import new_layout
from tests.needs import needs
from tests.node_access import cli_in_process

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 300
BASE_TIMEOUT_S = 1800  # debootstrap + apt-get from the Debian mirror, once per session


def run_testbed(*args: str, timeout: float = CMD_TIMEOUT_S, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


needs_engine = needs("docker")
WAIT_S = 90.0
# `testbed up --compose CHOICE` and the tool it needs (tests/needs.py), or none for `docker run`.
STARTERS = {"plugin": "compose-plugin", "standalone": "docker-compose", "run": None}


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
        # Each container's health check asks the health port of its own node's config.
        assert json.dumps(["CMD", "ai-memory", "--config", str(spec.config_path), "health"]) in text


@pytest.mark.parametrize("tool", ["docker-compose", "compose-plugin"])
def test_the_generated_file_is_taken_by_compose_1x_and_v2(tmp_path: Path, tool: str) -> None:
    """Compose 1.x refuses a top-level `name:`; the project name goes on the command line instead."""
    if reason := doctor.missing(tool):
        pytest.skip(reason)
    layout = build_layout(tmp_path / "tb", 3)
    (tmp_path / COMPOSE_FILE).write_text(render_compose(layout, "attested-mesh-node:test", "am-test"))
    cmd = ["docker-compose"] if tool == "docker-compose" else ["docker", "compose"]
    r = subprocess.run([*cmd, "-p", "am-test", "-f", str(tmp_path / COMPOSE_FILE), "config"], capture_output=True,
                       text=True, timeout=CMD_TIMEOUT_S, cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    assert r.stdout.count("network_mode: host") == 3


def _wait_for(what: str, predicate, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout_s:g} s")


def _docker_health(cid: str) -> str:
    return engine.docker("inspect", "--format", "{{.State.Health.Status}}", cid, check=False).stdout.decode().strip()


@needs_engine
@pytest.mark.parametrize("starter", list(STARTERS))
def test_up_status_use_down(short_tmp: Path, base_image: str, starter: str) -> None:
    if STARTERS[starter] and (reason := doctor.missing(STARTERS[starter])):
        pytest.skip(reason)
    d = short_tmp / "tb"
    ids: list[str] = []
    try:
        r = run_testbed("up", "--nodes", "3", "--backend", "docker", "--compose", starter, "--dir", str(d),
                        "--timeout", "90")
        assert r.returncode == 0, r.stderr
        assert "3 nodes up, every link up" in r.stdout
        ds = json.loads((d / "docker.json").read_text())
        assert ds["mode"] == ("run" if starter == "run" else "compose"), r.stderr
        if starter != "run":
            assert f"-p {project_name(d.resolve())} -f {d.resolve() / COMPOSE_FILE} up -d" in r.stderr
        ids = list(ds["containers"].values())
        assert len(ids) == 3
        state = json.loads((d / "testbed.json").read_text())
        assert state["backend"] == "docker"

        # Docker's own health check follows each node's configured health port: healthy, not "unhealthy".
        _wait_for("every container healthy", lambda: all(_docker_health(c) == "healthy" for c in ids))
        r = run_testbed("status", "--dir", str(d), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = json.loads(r.stdout)["nodes"]
        assert [(n["alive"], n["health"], n["docker_health"], n["links_up"], n["links"]) for n in rows] == \
            [(True, "ok", "healthy", 2, 2)] * 3

        # Use it as docs/testbed.md says: store on node 1 from the host, recall on node 3 once replicated.
        n1, n3 = (d / "node-1", d / "node-3")
        rc, stored, err = cli_in_process(n1 / "config.toml", n1, "store", "kept by a container mesh")
        assert rc == 0, err
        _wait_for("the memory recalled on node 3", lambda: any(
            hit["id"] == stored["id"] for hit in cli_in_process(n3 / "config.toml", n3, "recall", "container")[1]
            or []))

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


@needs_engine
def test_a_node_image_built_on_another_base_is_rebuilt(base_image: str) -> None:
    """`image node --base X --tag T` never keeps a T built on another base."""
    other, tag = f"am-test-base:{os.getpid()}", f"am-test-node:{os.getpid()}"
    try:
        # Another base: the same files under another image id (a label; no network).
        engine.docker("build", "-t", other, "-", input=f"FROM {base_image}\nLABEL am.test={other}\n".encode(),
                      timeout=CMD_TIMEOUT_S, env={**os.environ, "DOCKER_BUILDKIT": "0"})
        r = run_testbed("image", "node", "--base", other, "--tag", tag)
        assert r.returncode == 0, r.stderr
        r = run_testbed("image", "node", "--base", base_image, "--tag", tag)
        assert r.returncode == 0 and "was built on another base" in r.stderr and "rebuilding" in r.stderr, r.stderr
        label = engine.docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{image.BASE_ID_LABEL}"}}}}',
                              tag).stdout.decode().strip()
        assert label == image.image_id(base_image)
        r = run_testbed("image", "node", "--base", base_image, "--tag", tag)
        assert r.returncode == 0 and "kept" in r.stderr
    finally:
        engine.docker("rmi", "-f", tag, other, check=False)


@needs_engine
def test_the_bench_on_containers_says_which_backend_ran(short_tmp: Path, base_image: str) -> None:
    r = run_testbed("bench", "--backend", "docker", "--nodes", "3", "--messages", "20", "--no-plot",
                    "--out", str(short_tmp / "out"), "--dir", str(short_tmp / "w"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bench 3 nodes [1/3] starting the mesh, docker backend: one host-network container each" in r.stderr
    report = json.loads((short_tmp / "out" / "bench.json").read_text())
    assert report["backend"]["name"] == "docker" and report["backend"]["image"].startswith(image.NODE_REPO + ":")
    assert "Backend: docker backend" in (short_tmp / "out" / "bench.md").read_text()
    assert list((short_tmp / "w").iterdir()) == []


DEPLOY_COMPOSE = ROOT / "configs" / "compose.yaml"


@needs_engine
@pytest.mark.parametrize("tool", ["compose-plugin", "docker-compose"])
def test_the_deployment_compose_file_runs_a_node_docker_calls_healthy(short_tmp: Path, base_image: str,
                                                                       tool: str) -> None:
    """configs/compose.yaml as an operator uses it: the tag it names (made by `image node`), a host home owned by
    the image's uid, tini as init, and the image's `ai-memory health` check on the config's own port."""
    if reason := doctor.missing(tool, "root"):
        pytest.skip(reason)
    image.build_node(base=base_image)  # kept when it exists; tags the release tag compose.yaml names
    spec = new_layout(short_tmp / "tb", 2).node(1)
    # The home as docs/operations.md makes it: no `home =` line, so the home is the config's directory.
    config = spec.config_path.read_text().splitlines()
    spec.config_path.write_text("\n".join(line for line in config if not line.startswith("home =")) + "\n")
    subprocess.run(["chown", "-R", "10001:10001", str(spec.home)], check=True, timeout=CMD_TIMEOUT_S)
    cmd = ["docker-compose"] if tool == "docker-compose" else ["docker", "compose"]
    compose = [*cmd, "-p", f"amtest{os.getpid()}", "-f", str(DEPLOY_COMPOSE)]
    env = {**os.environ, "AI_MEMORY_HOST_HOME": str(spec.home)}
    ids: list[str] = []
    try:
        r = subprocess.run([*compose, "up", "-d"], capture_output=True, text=True, timeout=CMD_TIMEOUT_S, env=env,
                           cwd=short_tmp)
        assert r.returncode == 0, r.stderr
        ids = subprocess.run([*compose, "ps", "-q"], capture_output=True, text=True, timeout=CMD_TIMEOUT_S, env=env,
                             cwd=short_tmp).stdout.split()
        assert len(ids) == 1
        # The image's check runs every 30 s: the first one, once the node serves, reads healthy.
        _wait_for("the container healthy", lambda: _docker_health(ids[0]) == "healthy", WAIT_S)
        init = engine.docker("inspect", "--format", "{{.HostConfig.Init}} {{.Config.Image}}", ids[0])
        assert init.stdout.decode().split() == ["true", image.release_tag()]
        # `stop` sends SIGTERM through tini: the node drains and says so.
        for step in ("stop", "down"):
            r = subprocess.run([*compose, step], capture_output=True, text=True, timeout=CMD_TIMEOUT_S, env=env,
                               cwd=short_tmp)
            assert r.returncode == 0, r.stderr
            if step == "stop":
                assert '"reason":"SIGTERM"' in engine.docker("logs", ids[0]).stderr.decode()
    finally:
        for cid in ids:  # last resort: only the container this test started
            engine.docker("rm", "-f", cid, check=False)
