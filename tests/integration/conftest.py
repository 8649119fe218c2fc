"""Shared fixtures for the multi-process integration tests: real node subprocesses on 127.0.0.1.

- ``mesh_factory(n, **build_kwargs)`` lays out an n-node mesh under tmp_path (testbed.mesh) and returns a
  ``LocalMesh`` that is not started yet; every mesh made is stopped on teardown, whatever happened.
- ``cli(node_spec, *args, json=True)`` runs ``ai-memory --config <node config> <args>`` and returns
  ``(rc, parsed JSON or text, stderr)``: the CLI's own ``main`` in this process (tests/node_access.py), as
  ``run_cli``, ``ok`` and ``maybe`` do; ``spawn_cli`` runs ``python -m node.cli`` as a subprocess, for a test
  that pins the CLI as a program.
- ``wait_for(predicate, what, timeout_s)`` polls a condition with a bounded deadline (no timed assertions).
- ``node_log(spec)`` reads a node's JSON-lines log (``<home>/node.log``); ``node_log.has(spec, event, **fields)``.
"""

from __future__ import annotations

import json as jsonlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from testbed.mesh import LocalMesh, MeshLayout, NodeSpec
from tests.layouts import new_layout
from tests.node_access import cli_in_process

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 60.0
POLL_S = 0.1


def run_cli(spec: NodeSpec, *args: str, json: bool = True) -> tuple[int, Any, str]:
    """``ai-memory --config <spec's config> <args> [--json]`` in this process: (rc, parsed stdout, stderr).

    With ``json`` the flag ``--json`` is appended and stdout parsed (left as text when it does not parse).
    """
    return cli_in_process(spec.config_path, spec.home, *args, json=json)


def spawn_cli(spec: NodeSpec, *args: str, json: bool = True, timeout_s: float = CLI_TIMEOUT_S) -> tuple[int, Any, str]:
    """``run_cli`` as a ``python -m node.cli`` subprocess (its environment naming the node's home)."""
    env = {k: v for k, v in os.environ.items() if k != "AI_MEMORY_HOME"}
    env["AI_MEMORY_HOME"] = str(spec.home)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "node.cli", "--config", str(spec.config_path), *args]
    if json:
        argv.append("--json")
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    out: Any = proc.stdout
    if json:
        try:
            out = jsonlib.loads(proc.stdout)
        except ValueError:
            pass
    return proc.returncode, out, proc.stderr


@pytest.fixture
def cli() -> Callable[..., tuple[int, Any, str]]:
    return run_cli


def ok(spec: NodeSpec, *args: str) -> Any:
    rc, out, err = run_cli(spec, *args)
    assert rc == 0, f"{spec.agent_id}: {args} -> {rc}: {err}"
    return out


def maybe(spec: NodeSpec, *args: str) -> Any:
    """Like ``ok`` but None on failure, for polling."""
    rc, out, _ = run_cli(spec, *args)
    return out if rc == 0 else None


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = 30.0, poll_s: float = POLL_S) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout_s``.

    Between two polls it sleeps ``poll_s``, or as long as the poll took if longer: a predicate that opens a
    store (the in-process CLI) then takes at most half a core from the nodes it waits for.
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        started = time.monotonic()
        last = predicate()
        if last:
            return last
        now = time.monotonic()
        if now >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what} (last value: {last!r})")
        time.sleep(max(poll_s, now - started))


def node_log_events(spec: NodeSpec) -> list[dict[str, Any]]:
    """The node's structured log lines (JSON objects); non-JSON lines are skipped."""
    path = spec.home / "node.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(jsonlib.loads(line))
            except ValueError:
                continue
    return out


def log_has(spec: NodeSpec, event: str, **fields: Any) -> bool:
    return any(e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
               for e in node_log_events(spec))


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    return wait_for


@pytest.fixture(name="node_log")
def node_log_fixture() -> Callable[..., list[dict[str, Any]]]:
    """``node_log(spec)`` -> the node's structured log lines; ``node_log.has(spec, event, **fields)``."""
    class NodeLog:
        __call__ = staticmethod(node_log_events)
        has = staticmethod(log_has)
    return NodeLog()


@pytest.fixture
def mesh_factory(tmp_path: Path) -> Iterator[Callable[..., LocalMesh]]:
    """``mesh_factory(n, **build_kwargs)`` -> an unstarted LocalMesh of n nodes under tmp_path.

    build_kwargs go to testbed.mesh.build_layout (retry_delays_s=..., extra_config=..., mcp_http=...).
    Every mesh (and so every node process it started) is stopped on teardown.
    """
    meshes: list[LocalMesh] = []

    def make(n: int = 2, **build_kwargs: Any) -> LocalMesh:
        layout: MeshLayout = new_layout(tmp_path / f"mesh-{len(meshes)}", n, **build_kwargs)
        mesh = LocalMesh(layout)
        meshes.append(mesh)
        return mesh

    yield make
    errors = stop_meshes(meshes)
    assert not errors, errors


def stop_meshes(meshes: list[LocalMesh]) -> list[str]:
    """Stop every running node of ``meshes`` at once (each stop waits for its own node to drain and exit);
    returns what went wrong, one line per node. A node a SIGTERM did not stop is SIGKILLed."""
    def stop(mesh: LocalMesh, idx: int) -> str | None:
        try:
            mesh.stop(idx)
        except Exception as e:  # keep stopping the others; a stuck SIGTERM falls back to SIGKILL
            try:
                mesh.stop(idx, kill=True)
            except Exception:
                pass
            return f"node-{idx}: {e}"
        return None

    jobs = [(mesh, idx) for mesh in meshes for idx in list(mesh.procs)]
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="stop") as pool:
        return [e for e in pool.map(lambda job: stop(*job), jobs) if e]
