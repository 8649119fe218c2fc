"""The local backend: node subprocesses on 127.0.0.1, started, watched and stopped by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

from testbed.errors import TestbedError
from testbed.mesh.build import MeshLayout, NodeSpec
from testbed.mesh.netns import entered

READY_POLL_S = 0.1


def node_command(spec: NodeSpec) -> list[str]:
    cmd = [sys.executable, "-m", "node.cli", "--config", str(spec.config_path), "serve"]
    # `ip netns exec` execs the command in place: the pid we record is the node's own.
    return (["ip", "netns", "exec", spec.netns] + cmd) if spec.netns else cmd


def node_env(spec: NodeSpec) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AI_MEMORY_HOME"}
    env["AI_MEMORY_HOME"] = str(spec.home)
    return env


def start_node(spec: NodeSpec, *, nice: int = 0) -> subprocess.Popen:
    """The node's process (``nice``: that many steps below this process's priority, every thread of it)."""
    log_path = spec.home / "node.log"
    log = open(log_path, "ab")
    command = node_command(spec)
    if nice:
        command = ["nice", "-n", str(nice), *command]
    try:
        proc = subprocess.Popen(command, env=node_env(spec), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()
    (spec.home / "run").mkdir(parents=True, exist_ok=True)
    (spec.home / "run" / "testbed.pid").write_text(str(proc.pid))
    return proc


def health(spec: NodeSpec, timeout_s: float = 1.0) -> dict | None:
    """The node's /healthz (plain HTTP on its loopback health port), or None when it does not answer.

    A node in a network namespace is asked on that namespace's loopback (this thread enters it briefly).
    """
    if spec.netns:
        try:
            with entered(spec.netns):
                return _healthz(spec, timeout_s)
        except OSError:
            return None
    return _healthz(spec, timeout_s)


def _healthz(spec: NodeSpec, timeout_s: float) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{spec.health_port}/healthz", timeout=timeout_s) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_ready(layout: MeshLayout, specs: list[NodeSpec], procs: dict[int, subprocess.Popen] | None = None, *,
               timeout_s: float = 30.0, want_links: bool = True,
               progress: Callable[[int, int], None] | None = None,
               exited: Callable[[int], str | None] | None = None, poll_s: float = READY_POLL_S) -> None:
    """Wait until each node in ``specs`` answers /healthz and (optionally) reports every peer link up.

    ``exited(index)`` says why a node is gone (an error text) or returns None while it runs; by default
    it checks the node's process in ``procs`` and quotes its log. A gone node fails the wait at once.
    """
    if exited is None:
        exited = partial(_proc_exited, layout, procs or {})
    deadline = time.monotonic() + timeout_s
    pending = {s.index for s in specs}
    total = len(pending)
    while pending:
        for idx in sorted(pending):
            why = exited(idx)
            if why is not None:
                raise TestbedError("node_exited", why)
            h = health(layout.node(idx))
            if h and (not want_links or all(v == "up" for v in h.get("peers", {}).values())):
                pending.discard(idx)
                if progress:
                    progress(total - len(pending), total)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TestbedError("not_ready", f"node(s) {sorted(pending)} not ready within {timeout_s:g} s")
        time.sleep(poll_s)


def _proc_exited(layout: MeshLayout, procs: dict[int, subprocess.Popen], idx: int) -> str | None:
    proc = procs.get(idx)
    if proc is None or proc.poll() is None:
        return None
    return f"node-{idx} exited with {proc.returncode}:\n{_tail(layout.node(idx).home / 'node.log')}"


def stop_node(spec: NodeSpec, proc: subprocess.Popen | None = None, *, timeout_s: float = 10.0,
              kill: bool = False) -> None:
    """SIGTERM (or SIGKILL with ``kill``) the node started by the testbed, by its recorded pid only."""
    pid_file = spec.home / "run" / "testbed.pid"
    pid = proc.pid if proc is not None else (int(pid_file.read_text()) if pid_file.exists() else None)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        return
    if proc is not None:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
    else:
        _wait_gone(pid, timeout_s)
    pid_file.unlink(missing_ok=True)


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(READY_POLL_S)
    os.kill(pid, signal.SIGKILL)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalMesh:
    """A running local mesh: ``with LocalMesh(layout) as mesh:`` starts all nodes, stops them on exit."""

    def __init__(self, layout: MeshLayout) -> None:
        self.layout = layout
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, indices: list[int] | None = None, *, want_links: bool = True, timeout_s: float = 30.0) -> None:
        specs = [self.layout.node(i) for i in (indices or [n.index for n in self.layout.nodes])]
        running = [s.agent_id for s in specs if s.index in self.procs and self.procs[s.index].poll() is None]
        if running:
            # A second process would replace the first in procs, which then nobody stops.
            raise RuntimeError(f"already running: {', '.join(running)}; stop it first")
        for spec in specs:
            self.procs[spec.index] = start_node(spec)
        wait_ready(self.layout, specs, self.procs, timeout_s=timeout_s, want_links=want_links)

    def stop(self, index: int, *, kill: bool = False) -> None:
        stop_node(self.layout.node(index), self.procs.pop(index, None), kill=kill)

    def stop_all(self) -> None:
        for idx in list(self.procs):
            self.stop(idx)

    def __enter__(self) -> LocalMesh:
        try:
            self.start()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
