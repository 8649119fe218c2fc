"""A home the node's user may not use, as the usual systemd mistake makes it: created by root, the node run as its
own user. Every file it reads or writes that it cannot gets one line naming the file, what is wrong and the
command that fixes it; the exit is 1 and nothing is left half-created. Real files, real users: the homes are made
by root here and the commands run as ``nobody`` (``runuser``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.mesh import NodeSpec, build_layout

ROOT = Path(__file__).resolve().parents[2]
USER = "nobody"
RUN_TIMEOUT_S = 60.0


def _runner() -> tuple[list[str], dict[str, str]] | str:
    """(the argv prefix that runs ``python -m node.cli`` as USER, its environment), or why it cannot be had."""
    if os.geteuid() != 0:
        return "runs commands as another user: needs root (it makes the home as root, runs the node as nobody)"
    if shutil.which("runuser") is None:
        return "needs runuser (apt-get install -y util-linux)"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
           "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]])}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # This interpreter may sit under root's home (pyenv); the system's of the same version reads the same wheels.
    for python in (sys.executable, f"/usr/bin/python{version}"):
        argv = ["runuser", "-u", USER, "--", python]
        probe = subprocess.run([*argv, "-c", "import node.cli"], env=env, capture_output=True, timeout=RUN_TIMEOUT_S)
        if probe.returncode == 0:
            return [*argv, "-m", "node.cli"], env
    return (f"no Python {version} that {USER} may run with this checkout and its packages (apt-get install -y "
            f"python{version}, and a checkout outside root's home)")


RUNNER = _runner()
pytestmark = pytest.mark.skipif(isinstance(RUNNER, str), reason=str(RUNNER))


def as_user(spec: NodeSpec, *args: str) -> subprocess.CompletedProcess[str]:
    assert not isinstance(RUNNER, str)
    argv, env = RUNNER
    return subprocess.run([*argv, "--config", str(spec.config_path), *args], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL, cwd="/")


def as_root(spec: NodeSpec, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AI_MEMORY_HOME", None)
    return subprocess.run([sys.executable, "-m", "node.cli", "--config", str(spec.config_path), *args], env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)


def tree(home: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``home`` with its owner and mode: what a refused command must leave as it was."""
    return {str(p.relative_to(home)): (p.lstat().st_uid, p.lstat().st_mode) for p in sorted(home.rglob("*"))}


def chown(path: Path, user: str) -> None:
    subprocess.run(["chown", "-R", f"{user}:", str(path)], check=True)


@pytest.fixture
def node() -> Iterator[NodeSpec]:
    """Node 1 of a two-node layout made by root, in a directory others may pass through (pytest's tmp is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="homefiles-", dir="/tmp"))
    try:
        root.chmod(0o755)
        layout = build_layout(root / "mesh", 2)
        (root / "mesh").chmod(0o755)
        yield layout.node(1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def one_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, (p.returncode, p.stderr)
    return lines[0]


@pytest.mark.parametrize("command", [["serve"], ["status"], ["store", "hello"], ["mcp", "--embedded"]])
def test_a_home_made_by_root_is_refused_in_one_line_that_names_the_file_and_the_chown(node: NodeSpec,
                                                                                      command: list[str]) -> None:
    before = tree(node.home)
    line = one_line(as_user(node, *command))
    assert line.startswith("ai-memory: error [file_unreadable]: ")
    assert f"{node.home}/keys" in line and "owned by root:root, mode 0700" in line and f"user {USER}" in line
    assert line.endswith(f"run: chown -R {USER}:nogroup {node.home}")
    assert tree(node.home) == before  # nothing created: no data/, no run/

    chown(node.home, USER)  # the command the line named
    assert as_user(node, "store", "hello").returncode == 0


def _break_config(node: NodeSpec) -> str:
    os.chown(node.config_path, 0, 0)
    node.config_path.chmod(0o600)
    return f"[config_unreadable]: the config file {node.config_path} cannot be read"


def _break_key(node: NodeSpec) -> str:
    priv = node.home / "keys" / f"{node.agent_id}.priv"
    os.chown(priv, 0, 0)
    return f"{priv} cannot be read by user {USER} (owned by root:root, mode 0600)"


def _break_tls(node: NodeSpec) -> str:
    cert = node.home / "tls" / "node.crt"
    os.chown(cert, 0, 0)
    cert.chmod(0o600)
    return f"the node certificate {cert} cannot be read"


def _break_database(node: NodeSpec) -> str:
    assert as_root(node, "store", "made by root").returncode == 0  # root ran a command first: the file is root's
    data = node.home / "data"
    shutil.chown(data, USER)  # and only its directory was handed back
    return f"the database {data}/memory.db cannot be written by user {USER} (owned by root:root"


def _break_hooks(node: NodeSpec) -> str:
    hooks = node.home / "hooks.toml"
    hooks.write_text("hooks = []\n")
    os.chown(hooks, 0, 0)
    hooks.chmod(0o600)
    return f"the hooks file {hooks} cannot be read"


def _break_rules(node: NodeSpec) -> str:
    rules = node.home / "permissions.toml"
    rules.write_text('mode = "enforce"\n')
    os.chown(rules, 0, 0)
    rules.chmod(0o600)
    return f"the permission rules file {rules} cannot be read"


def _break_run(node: NodeSpec) -> str:
    run = node.home / "run"
    run.mkdir()
    os.chown(run, 0, 0)
    return f"the directory of the local socket {run} cannot be written"


BREAKS = {"config": _break_config, "keys": _break_key, "tls": _break_tls, "database": _break_database,
          "hooks.toml": _break_hooks, "permissions rules": _break_rules, "run/": _break_run}


@pytest.mark.parametrize("what", list(BREAKS))
def test_each_file_the_node_cannot_use_is_one_line_with_its_fix_and_nothing_is_created(node: NodeSpec,
                                                                                       what: str) -> None:
    chown(node.home, USER)
    said = BREAKS[what](node)
    before = tree(node.home)
    line = one_line(as_user(node, "serve"))
    assert said in line and "run: chown " in line, line
    assert tree(node.home) == before
    if what not in ("tls", "run/"):  # what only `serve` reads
        for command in (["status"], ["store", "x"], ["mcp", "--embedded"]):
            assert said in one_line(as_user(node, *command))
        assert tree(node.home) == before


def test_a_private_key_others_may_read_names_the_chmod(node: NodeSpec) -> None:
    chown(node.home, USER)
    priv = node.home / "keys" / f"{node.agent_id}.priv"
    priv.chmod(0o644)
    line = one_line(as_user(node, "serve"))
    assert line.startswith("ai-memory: error [key_file_mode]: ") and line.endswith(f"run: chmod 600 {priv}")


def test_a_start_that_fails_after_opening_the_store_leaves_no_new_file(node: NodeSpec) -> None:
    chown(node.home, USER)
    before = tree(node.home)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", node.port))
        taken.listen()
        p = as_user(node, "serve")
    assert p.returncode == 1 and p.stderr.splitlines()[-1].startswith("ai-memory: error [port_in_use]: ")
    assert tree(node.home) == before  # the database it created is gone again
