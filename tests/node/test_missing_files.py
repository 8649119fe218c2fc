"""A file the node needs that is not there: one line naming it and the command that makes it, exit 1, and no new
file left in the home."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli import main
from testbed.mesh import NodeSpec, build_layout

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path) -> NodeSpec:
    return build_layout(tmp_path / "m", 2).node(1)


def tree(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def serve_line(capsys: pytest.CaptureFixture[str], spec: NodeSpec) -> str:
    """``serve``'s stderr, from a process of its own (serve sets up the process's logging)."""
    before = tree(spec.home)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AI_MEMORY_HOME", None)
    p = subprocess.run([sys.executable, "-m", "node.cli", "--config", str(spec.config_path), "serve"], env=env,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, lines
    assert tree(spec.home) == before
    return lines[0]


def test_a_missing_node_certificate_names_the_cert_issue_line(capsys, node: NodeSpec) -> None:
    (node.home / "tls" / "node.crt").unlink()
    line = serve_line(capsys, node)
    assert line.startswith("ai-memory: error [cert_missing]: The node certificate ")
    assert f"ai-memory mesh cert issue --ca CA_DIR --agent-id {node.agent_id} " in line


def test_a_missing_ca_certificate_names_the_copy(capsys, node: NodeSpec) -> None:
    (node.home / "tls" / "ca.crt").unlink()
    line = serve_line(capsys, node)
    assert line.startswith("ai-memory: error [ca_missing]: ") and f"cp CA_DIR/ca.crt {node.home}/tls/ca.crt" in line


def test_a_missing_key_names_identity_generate(capsys, node: NodeSpec) -> None:
    for key in (node.home / "keys").iterdir():
        key.unlink()
    line = serve_line(capsys, node)
    assert line.startswith("ai-memory: error [no_identity]: ") and "ai-memory identity generate" in line


def test_a_missing_config_file_names_the_option(capsys, tmp_path: Path) -> None:
    rc = main(["--config", str(tmp_path / "nope.toml"), "status"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "[config_not_found]" in err and "check --config" in err


def test_an_invalid_rules_file_refuses_the_start_before_the_store_is_made(capsys, node: NodeSpec) -> None:
    (node.home / "permissions.toml").write_text('mode = "sometimes"\n')
    line = serve_line(capsys, node)
    assert line.startswith("ai-memory: error [config_invalid]: ") and "permissions.toml" in line
