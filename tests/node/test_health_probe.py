"""`ai-memory health`, the probe Docker's HEALTHCHECK and compose run: it asks the health port the node's own config
names and says in its exit code whether a real node answers there."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from node.cli import main
from testbed.mesh.local import node_command, node_env, wait_ready
from tests.layouts import new_layout
from tests.node_access import cli_in_process

WAIT_S = 60.0


@pytest.mark.integration
def test_health_follows_the_running_node_on_its_configured_port(short_tmp: Path) -> None:
    layout = new_layout(short_tmp / "tb", 2)
    spec = layout.node(1)
    assert f"health_port = {spec.health_port}" in spec.config_path.read_text()
    rc, _, err = cli_in_process(spec.config_path, spec.home, "health", json=False)
    assert rc == 1 and f"http://127.0.0.1:{spec.health_port}/healthz: no answer" in err

    with open(spec.home / "node.log", "ab") as log:
        proc = subprocess.Popen(node_command(spec), env=node_env(spec), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_ready(layout, [spec], {1: proc}, timeout_s=WAIT_S, want_links=False)
        rc, out, _ = cli_in_process(spec.config_path, spec.home, "health", json=False)
        assert rc == 0 and out.startswith(f"ok: http://127.0.0.1:{spec.health_port}/healthz answered 200 for "
                                          f"{spec.agent_id}")
        # Its only peer is not running: alive, but not ready, and --ready says why.
        rc, _, err = cli_in_process(spec.config_path, spec.home, "health", "--ready", json=False)
        assert rc == 1 and "answered 503: no_peer_link" in err
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    rc, _, _ = cli_in_process(spec.config_path, spec.home, "health", json=False)
    assert rc == 1


def test_a_config_without_a_health_port_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('agent_id = "ai:n@lab"\n')
    rc, _, err = cli_in_process(tmp_path / "config.toml", tmp_path, "health", json=False)
    assert rc == 2 and "mesh.health_port is 0" in err


def test_a_home_without_a_config_file_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not "health_port is 0" (the defaults'): the probe was pointed at no config at all."""
    assert main(["--home", str(tmp_path / "gone"), "health"]) == 2
    assert f"no config file at {tmp_path / 'gone' / 'config.toml'}" in capsys.readouterr().err
