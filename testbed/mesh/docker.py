"""The Docker backend: the same on-disk layout as the local backend, one container per node.

Every container runs with host networking (never a bridge), so each node listens on its own
127.0.0.1 port exactly as a local node does, and health is polled on the same loopback ports. Each
node's home is mounted at the same absolute path inside its container, so the absolute paths the
layout writes into config.toml (``home = "..."``) hold unchanged.

State: DIR/testbed.json (backend "docker"; ``pid`` is the container's node process as seen from the
host, so CPU figures and liveness work as for local nodes) plus DIR/docker.json with the container
ids this testbed started. `down` removes exactly those container ids, nothing else.
DIR/compose.yaml is always written (one service per node, network_mode: host; valid for Compose 1.x and
v2 alike: the project name goes on the command line, `-p`); it is used when a compose implementation exists
(`docker compose` or `docker-compose`), otherwise each node is started with `docker run -d --network host`.
Every container's health check is `ai-memory --config <its config> health`, which asks the health port that
node's config names (each testbed node has its own).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.env import image
from testbed.env.engine import Say, docker, docker_bin, require_engine, say_stderr
from testbed.errors import TestbedError
from testbed.mesh import local
from testbed.mesh.build import MeshLayout, NodeSpec, build_layout
from testbed.mesh.control import check_free_dir, check_node_count, remove_layout, require_state, status_row
from testbed.mesh.state import NodeState, TestbedState, read_state, start_ticks, state_path, write_state
from testbed.progress import Progress

DOCKER_STATE = "docker.json"
COMPOSE_FILE = "compose.yaml"
READY_TIMEOUT_S = 60.0
POLL_S = 0.2
INSPECT_EVERY_S = 1.0
STOP_GRACE_S = 10
# The image checks every 30 s; a testbed node is "healthy" in `docker ps` within seconds of serving.
HEALTH_INTERVAL_S = 5
LABEL = "attested-mesh.testbed"


@dataclass
class DockerState:
    image: str
    mode: str  # "compose" or "run"
    project: str
    containers: dict[str, str] = field(default_factory=dict)  # node index -> container id
    compose: list[str] = field(default_factory=list)  # the compose command used, when mode == "compose"


def _docker_state_path(root: Path) -> Path:
    return root / DOCKER_STATE


def write_docker_state(root: Path, ds: DockerState) -> None:
    tmp = _docker_state_path(root).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(ds.__dict__, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, _docker_state_path(root))


def read_docker_state(root: Path) -> DockerState:
    path = _docker_state_path(root)
    try:
        return DockerState(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as e:
        raise TestbedError("bad_state", f"{path} is missing or not a docker testbed state ({e})") from None


def project_name(root: Path) -> str:
    return "am-" + hashlib.sha256(str(root).encode()).hexdigest()[:10]


# `testbed up --compose`: which compose implementation starts the containers ("run": none, `docker run`).
COMPOSE_CHOICES = ("auto", "plugin", "standalone", "run")


def compose_command(choice: str = "auto") -> list[str] | None:
    """`docker compose` (plugin) or `docker-compose` (standalone), whichever answers first (``choice`` "auto") or
    the one named; None if it does not answer (or ``choice`` is "run")."""
    candidates = []
    if choice in ("auto", "plugin"):
        candidates.append([docker_bin(), "compose"])
    if choice in ("auto", "standalone") and (standalone := shutil.which("docker-compose")):
        candidates.append([standalone])
    for cmd in candidates:
        try:
            if subprocess.run([*cmd, "version"], capture_output=True, timeout=20).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def _user() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def container_name(project: str, spec: NodeSpec) -> str:
    return f"{project}-node-{spec.index}"


def node_argv(spec: NodeSpec) -> list[str]:
    return ["ai-memory", "--config", str(spec.config_path), "serve"]


def health_argv(spec: NodeSpec) -> list[str]:
    """The container's health check: the health port of this node's own config (the image's default reads
    $AI_MEMORY_HOME/config.toml, the same file; named here so that nothing depends on that)."""
    return ["ai-memory", "--config", str(spec.config_path), "health"]


def render_compose(layout: MeshLayout, img: str, project: str) -> str:
    """One service per node: host networking, the home mounted at the same absolute path. No top-level
    ``name:`` (Compose 1.x refuses it): the project name is given with ``-p``."""
    q = json.dumps  # JSON strings are valid YAML scalars
    lines = [f"# generated by `testbed up --backend docker`; project {project} (compose -p {project})", "services:"]
    for spec in layout.nodes:
        home = str(spec.home)
        lines += [
            f"  node-{spec.index}:",
            f"    image: {q(img)}",
            f"    container_name: {q(container_name(project, spec))}",
            "    network_mode: host",
            f"    user: {q(_user())}",
            f"    environment:\n      AI_MEMORY_HOME: {q(home)}",
            f"    volumes:\n      - {q(home + ':' + home)}",
            f"    labels:\n      {LABEL}: {q(str(layout.root))}",
            f"    command: {json.dumps(node_argv(spec))}",
            f"    healthcheck:\n      test: {json.dumps(['CMD', *health_argv(spec)])}\n"
            f"      interval: {HEALTH_INTERVAL_S}s\n      start_period: {HEALTH_INTERVAL_S}s",
        ]
    return "\n".join(lines) + "\n"


def _run_container(spec: NodeSpec, img: str, project: str, root: Path) -> str:
    home = str(spec.home)
    r = docker("run", "-d", "--name", container_name(project, spec), "--network", "host",
                     "--user", _user(), "-e", f"AI_MEMORY_HOME={home}", "-v", f"{home}:{home}",
                     "--label", f"{LABEL}={root}", "--health-cmd", shlex.join(health_argv(spec)),
                     "--health-interval", f"{HEALTH_INTERVAL_S}s", "--health-start-period", f"{HEALTH_INTERVAL_S}s",
                     img, *node_argv(spec), timeout=120)
    return r.stdout.decode().strip()


def inspect(cid: str) -> dict | None:
    """{running, pid, status, exit_code, health} of container ``cid`` (health: Docker's health check state,
    "starting", "healthy", "unhealthy" or "none"), or None when it does not exist."""
    r = docker("inspect", "--type", "container", "--format",
                     "{{.State.Running}} {{.State.Pid}} {{.State.Status}} {{.State.ExitCode}} "
                     "{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}", cid,
                     check=False, timeout=30)
    if r.returncode != 0:
        return None
    running, pid, status, code, health = r.stdout.decode().split()
    return {"running": running == "true", "pid": int(pid), "status": status, "exit_code": int(code),
            "health": health}


def logs(cid: str, lines: int = 20) -> str:
    args = ["logs"] + (["--tail", str(lines)] if lines > 0 else []) + [cid]
    r = docker(*args, check=False, timeout=30)
    return (r.stdout + r.stderr).decode(errors="replace").rstrip()


def wait_ready(layout: MeshLayout, containers: dict[str, str], *, timeout_s: float,
               progress: Callable[[int, int], None] | None = None) -> None:
    """Poll every node's loopback /healthz until it reports every peer link up; fail fast on an exit."""
    local.wait_ready(layout, layout.nodes, timeout_s=timeout_s, progress=progress,
                     exited=_container_exited(containers), poll_s=POLL_S)


def _container_exited(containers: dict[str, str]) -> Callable[[int], str | None]:
    """For local.wait_ready: why node i's container is gone (with its log), or None while it runs;
    each container is inspected at most once per INSPECT_EVERY_S."""
    next_inspect: dict[int, float] = {}

    def exited(idx: int) -> str | None:
        if time.monotonic() < next_inspect.get(idx, 0.0):
            return None
        next_inspect[idx] = time.monotonic() + INSPECT_EVERY_S
        cid = containers[str(idx)]
        st = inspect(cid)
        if st is not None and st["running"]:
            return None
        what = "is gone" if st is None else f"exited with {st['exit_code']}"
        return f"node-{idx} container {what}:\n{logs(cid) if st else ''}"

    return exited


def _alive(state: TestbedState, ds: DockerState) -> list[NodeState]:
    out = []
    for n in state.nodes:
        cid = ds.containers.get(str(n.index))
        st = inspect(cid) if cid else None
        if st and st["running"]:
            out.append(n)
    return out


def up(root: Path, nodes: int, *, base_port: int | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
       node_image: str | None = None, base_image: str = image.BASE_TAG, compose_choice: str = "auto",
       say: Say = say_stderr) -> tuple[TestbedState, bool]:
    """As testbed.mesh.control.up, with one host-network container per node. Returns (state, already_running).
    ``compose_choice`` (COMPOSE_CHOICES): the compose implementation to use; one that is absent or refuses the
    generated file falls back to `docker run`, said on stderr."""
    check_node_count(nodes)
    require_engine()
    root = root.resolve()
    running = _running_docker_testbed(root)
    if running is not None:
        return running, True
    check_free_dir(root)
    img = node_image or image.build_node(base=base_image, say=say)
    created_root = not root.exists()
    layout = build_layout(root, nodes, base_port=base_port)
    project = project_name(root)
    (root / COMPOSE_FILE).write_text(render_compose(layout, img, project), encoding="utf-8")
    compose = _usable_compose(compose_choice, root, project, say)
    ds = DockerState(image=img, mode="compose" if compose else "run", project=project, compose=compose or [])
    state = TestbedState(root=str(root), backend="docker", created_at=time.time())
    write_state(state)
    write_docker_state(root, ds)
    try:
        progress = Progress("starting", nodes)
        if compose:
            _compose_up(compose, root, layout, ds, say)
        for spec in layout.nodes:
            if not compose:
                ds.containers[str(spec.index)] = _run_container(spec, img, project, root)
                write_docker_state(root, ds)  # recorded as soon as started, so `down` can always find it
            st = inspect(ds.containers[str(spec.index)]) or {"pid": 0}
            state.nodes.append(NodeState(index=spec.index, agent_id=spec.agent_id, home=str(spec.home),
                                         port=spec.port, health_port=spec.health_port,
                                         mcp_http_port=spec.mcp_http_port, fingerprint=spec.fingerprint,
                                         pid=st["pid"], pid_start_ticks=start_ticks(st["pid"]) or 0))
            write_state(state)
            progress.update(spec.index, "containers started")
        progress.done()
        links = Progress("links up", nodes)
        wait_ready(layout, ds.containers, timeout_s=ready_timeout_s,
                   progress=lambda done, total: links.update(done, "nodes with every peer link up"))
        links.done()
    except BaseException:
        _remove_containers(ds, grace_s=0)
        _remove_files(root, remove_root=created_root)
        raise
    return state, False


def _usable_compose(choice: str, root: Path, project: str, say: Say) -> list[str] | None:
    """The compose command to start the mesh with, or None (then `docker run`), saying why on stderr."""
    if choice == "run":
        say("docker: --compose run: starting each node with `docker run -d --network host`")
        return None
    compose = compose_command(choice)
    if compose is None:
        which = {"plugin": "`docker compose`", "standalone": "`docker-compose`"}.get(
            choice, "`docker compose` / `docker-compose`")
        say(f"docker: no compose implementation answers ({which}); starting each node with "
            "`docker run -d --network host`")
        return None
    r = subprocess.run([*compose, "-p", project, "-f", str(root / COMPOSE_FILE), "config", "-q"],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        say(f"docker: {' '.join(compose)} refuses {root / COMPOSE_FILE} "
            f"({r.stderr.decode(errors='replace').strip()}); starting each node with `docker run` instead")
        return None
    return compose


def _running_docker_testbed(root: Path) -> TestbedState | None:
    """The docker testbed already running in ``root``; None when there is none; raises on stale state."""
    existing = read_state(root)
    if existing is None:
        return None
    if existing.backend != "docker":
        raise TestbedError("stale_state", f"{state_path(root)} records a {existing.backend} testbed; "
                                          f"use `testbed down --dir {root}` first")
    if _alive(existing, read_docker_state(root)):
        return existing
    raise TestbedError("stale_state", f"{state_path(root)} records a testbed whose containers are not "
                                      f"running; run `testbed down --dir {root}` first")


def _compose_up(compose: list[str], root: Path, layout: MeshLayout, ds: DockerState,
                say: Callable[[str], None]) -> None:
    """`compose up -d` the rendered file, then record whichever containers it started (even on failure)."""
    say(f"docker: {' '.join(compose)} -p {ds.project} -f {root / COMPOSE_FILE} up -d")
    r = subprocess.run([*compose, "-p", ds.project, "-f", str(root / COMPOSE_FILE), "up", "-d"],
                       capture_output=True, timeout=300)
    ids = {}
    for spec in layout.nodes:
        cid = inspect_id(container_name(ds.project, spec))
        if cid:
            ids[str(spec.index)] = cid
    ds.containers = ids
    write_docker_state(root, ds)
    if r.returncode != 0:
        raise TestbedError("docker_failed", f"compose up failed: {r.stderr.decode(errors='replace')}")


def inspect_id(name: str) -> str | None:
    r = docker("inspect", "--type", "container", "--format", "{{.Id}}", name, check=False, timeout=30)
    return r.stdout.decode().strip() if r.returncode == 0 else None


def _remove_containers(ds: DockerState, grace_s: float = STOP_GRACE_S) -> list[tuple[str, str, str]]:
    """Stop and remove exactly the recorded container ids; returns (index, id, what happened)."""
    out = []
    for idx, cid in ds.containers.items():
        if inspect(cid) is None:
            out.append((idx, cid, "already gone"))
            continue
        docker("stop", "-t", str(int(grace_s)), cid, check=False, timeout=grace_s + 60)
        docker("rm", "-f", cid, check=False, timeout=60)
        out.append((idx, cid, "stopped and removed" if inspect(cid) is None else "NOT removed"))
    return out


def _remove_files(root: Path, *, remove_root: bool) -> None:
    for name in (COMPOSE_FILE, DOCKER_STATE, DOCKER_STATE + ".tmp"):
        (root / name).unlink(missing_ok=True)
    remove_layout(root, remove_root=remove_root)


def down(root: Path, *, grace_s: float | None = None) -> list[tuple[NodeState, str]]:
    """Remove exactly the containers this testbed started (by recorded id), then the layout."""
    state = require_state(root)
    require_engine()
    ds = read_docker_state(Path(state.root))
    done = {idx: (cid, what) for idx, cid, what in
            _remove_containers(ds, STOP_GRACE_S if grace_s is None else grace_s)}
    left = [f"{cid[:12]} (node-{idx})" for idx, (cid, what) in done.items() if what == "NOT removed"]
    if left:
        raise TestbedError("stop_failed", f"containers {left} were not removed; state kept in {state.root}")
    _remove_files(Path(state.root), remove_root=True)
    return [(n, f"container {done[str(n.index)][0][:12]} {done[str(n.index)][1]}" if str(n.index) in done
             else "no container recorded") for n in state.nodes]


def node_rows(state: TestbedState) -> list[dict]:
    """testbed status rows (testbed.mesh.control.status_row, with the container)."""
    ds = read_docker_state(Path(state.root))
    rows = []
    for n in state.nodes:
        cid = ds.containers.get(str(n.index), "")
        st = inspect(cid) if cid else None
        row = status_row(n, n.spec(), bool(st and st["running"]), n.mcp_endpoint, container=cid[:12])
        rows.append({**row, "docker_health": st["health"] if st else "gone"})
    return rows


def log_tail(root: Path, name: str, lines: int) -> str:
    state = require_state(root)
    node = state.node(name)
    cid = read_docker_state(Path(state.root)).containers.get(str(node.index))
    if not cid or inspect(cid) is None:
        raise TestbedError("no_log", f"node-{node.index} has no container")
    return logs(cid, lines)


class DockerMesh:
    """``with DockerMesh(layout) as mesh:`` runs a laid-out mesh in containers (used by `testbed bench
    --backend docker`); ``mesh.procs[i].pid`` is node i's process as seen from the host."""

    @dataclass
    class _Proc:
        pid: int

    def __init__(self, layout: MeshLayout, img: str | None = None, ready_timeout_s: float = READY_TIMEOUT_S):
        self.layout = layout
        self.image = img
        self.timeout = ready_timeout_s
        self.ds = DockerState(image="", mode="run", project=project_name(layout.root.resolve()))
        self.procs: dict[int, DockerMesh._Proc] = {}

    def __enter__(self) -> DockerMesh:
        require_engine()
        self.ds.image = self.image or image.build_node()
        try:
            for spec in self.layout.nodes:
                self.ds.containers[str(spec.index)] = _run_container(spec, self.ds.image, self.ds.project,
                                                                     self.layout.root.resolve())
                self.procs[spec.index] = self._Proc((inspect(self.ds.containers[str(spec.index)]) or {"pid": 0})["pid"])
            wait_ready(self.layout, self.ds.containers, timeout_s=self.timeout)
        except BaseException:
            _remove_containers(self.ds, grace_s=0)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        _remove_containers(self.ds, grace_s=5)
