"""Signals to a running node: SIGHUP reloads the configuration (a peer added by editing the file comes up, removed
again goes down; a file that does not load is refused and the node keeps serving); SIGTERM stops it cleanly,
logged with the signal."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from testbed.mesh import NodeSpec, health
from tests.integration.conftest import log_has, maybe, node_log_events, ok, wait_for

pytestmark = pytest.mark.integration


def without_peers(spec: NodeSpec) -> str:
    """The node's config with its [[mesh.peers]] tables left out (the layout writes them last)."""
    return spec.config_path.read_text().split("[[mesh.peers]]")[0]


def hup(mesh, index: int) -> None:
    os.kill(mesh.procs[index].pid, signal.SIGHUP)


def links(spec: NodeSpec) -> dict[str, str]:
    h = health(spec)
    assert h is not None, f"{spec.agent_id} stopped answering /healthz"
    return h["peers"]


async def test_a_peer_added_by_sighup_comes_up_and_is_removed_again(mesh_factory) -> None:
    mesh = mesh_factory(2)
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    with_peer = n1.config_path.read_text()
    n1.config_path.write_text(without_peers(n1))
    await asyncio.to_thread(mesh.start)
    assert links(n1) == {}

    n1.config_path.write_text(with_peer)
    hup(mesh, 1)
    wait_for(lambda: links(n1).get(n2.agent_id) == "up", "node-1's new link to node-2")
    assert log_has(n1, "config_reloaded", peers_added=[n2.agent_id], peers_removed=[], changed=["mesh.peers"])
    stored = ok(n1, "store", "written after the reload")
    wait_for(lambda: maybe(n2, "get", stored["id"]), "the memory on node-2")

    n1.config_path.write_text(without_peers(n1))
    hup(mesh, 1)
    wait_for(lambda: links(n1) == {}, "node-1's link to node-2 stopped")
    assert log_has(n1, "config_reloaded", peers_added=[], peers_removed=[n2.agent_id])
    assert ok(n1, "peers")[0]["link_state"] == "not_configured"
    assert mesh.procs[1].poll() is None and not log_has(n1, "config_needs_restart")


async def test_a_bad_config_is_refused_and_the_node_keeps_serving(mesh_factory) -> None:
    mesh = mesh_factory(2)
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    await asyncio.to_thread(mesh.start)
    good = n1.config_path.read_text()

    n1.config_path.write_text(good + "\n[mesh\n")
    hup(mesh, 1)
    refused = wait_for(lambda: [e for e in node_log_events(n1) if e["event"] == "config_reload_refused"],
                       "the refusal")
    assert refused[0]["code"] == "config_malformed" and str(n1.config_path) in refused[0]["error"]
    assert links(n1) == {n2.agent_id: "up"}  # the running configuration is kept: its peer too

    hooks = n1.home / "hooks.toml"
    hooks.write_text("[[hooks]]\nname = 'x'\n")
    n1.config_path.write_text(good)
    hup(mesh, 1)
    wait_for(lambda: len([e for e in node_log_events(n1) if e["event"] == "config_reload_refused"]) == 2,
             "the second refusal")
    assert [e for e in node_log_events(n1) if e["event"] == "config_reload_refused"][1]["code"] == "config_invalid"
    hooks.unlink()

    n1.config_path.write_text(good.replace(f"listen_port = {n1.port}", f"listen_port = {n1.port + 1}"))
    hup(mesh, 1)
    restart = wait_for(lambda: [e for e in node_log_events(n1) if e["event"] == "config_needs_restart"],
                       "the settings that need a restart")
    assert restart[0]["settings"] == ["mesh.listen_port"]
    assert links(n1) == {n2.agent_id: "up"} and ok(n1, "status")["agent_id"] == n1.agent_id
    n1.config_path.write_text(good)

    proc = mesh.procs[1]
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 30) == 0
    mesh.procs.pop(1)
    assert log_has(n1, "node_stopped", reason="SIGTERM") and not log_has(n1, "node_crashed")
