"""What a SIGHUP does with each changed setting, as plain values (node/reload.py)."""

from __future__ import annotations

from pathlib import Path

from node import reload
from node.config import NodeConfig, PeerConfig, from_dict

HOME = "/srv/n1"
B = {"agent_id": "ai:b@lab", "url": "https://127.0.0.1:7444"}
C = {"agent_id": "ai:c@lab", "url": "https://127.0.0.1:7445"}


def cfg(**sections: object) -> NodeConfig:
    return from_dict({"agent_id": "ai:a@lab", "home": HOME, **sections}, env={})


def test_an_unchanged_file_changes_nothing() -> None:
    plan = reload.plan(cfg(mesh={"peers": [B]}), cfg(mesh={"peers": [B]}))
    assert not plan.changed and plan.peers_added == () and plan.peers_removed == ()


def test_a_peer_added_and_a_peer_removed_are_live() -> None:
    plan = reload.plan(cfg(mesh={"peers": [B]}), cfg(mesh={"peers": [C]}))
    assert plan.live == ("mesh.peers",) and plan.needs_restart == ()
    assert plan.peers_added == (PeerConfig(**C),) and plan.peers_removed == ("ai:b@lab",)
    assert plan.in_force.mesh.peers == (PeerConfig(**C),)


def test_a_peer_that_moved_is_removed_and_added_again() -> None:
    moved = {**B, "url": "https://10.0.0.2:7444"}
    plan = reload.plan(cfg(mesh={"peers": [B]}), cfg(mesh={"peers": [moved]}))
    assert plan.peers_removed == ("ai:b@lab",) and plan.peers_added == (PeerConfig(**moved),)


def test_the_listen_port_the_backend_and_the_identity_need_a_restart_and_keep_their_running_values() -> None:
    old = cfg(mesh={"listen_port": 7443})
    new = from_dict({"agent_id": "ai:other@lab", "home": HOME, "mesh": {"listen_port": 9443},
                     "storage": {"backend": "postgres", "dsn": "dbname=x"}, "limits": {"max_tags": 8}}, env={})
    plan = reload.plan(old, new)
    assert plan.needs_restart == ("agent_id", "limits.max_tags", "storage.backend", "storage.dsn", "mesh.listen_port")
    assert plan.in_force.mesh.listen_port == 7443 and plan.in_force.agent_id == "ai:a@lab"
    assert plan.in_force.storage.backend == "sqlite" and plan.in_force.home == Path(HOME)


def test_namespace_policies_and_the_log_level_are_live() -> None:
    new = cfg(federation={"namespaces": {"team": {"peers": ["ai:b@lab"]}}}, log={"level": "debug"})
    plan = reload.plan(cfg(), new)
    assert plan.live == ("federation.namespaces", "log.level") and plan.needs_restart == ()
    assert plan.in_force.federation.namespaces == new.federation.namespaces and plan.in_force.log.level == "debug"
