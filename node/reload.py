"""A configuration reload (SIGHUP) as a value: what changed between the configuration in force and the file
read again, what a running node takes on live, and what needs a restart.

Live: ``mesh.peers`` (links started and stopped), ``federation.namespaces`` (who sees and may write what),
``log.level``; the hooks and permission rules files are read again by their owners. Every other setting keeps
its old value until the node restarts, and the reload names it (``needs_restart``). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from node.config import NodeConfig, PeerConfig

# The settings a running node changes without a restart (dotted names, as in the config file).
LIVE = ("mesh.peers", "federation.namespaces", "log.level")


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """``in_force``: the configuration the node runs on after the reload (the old one with the live settings of
    the new one); ``live`` / ``needs_restart``: the settings that changed, by what the reload does with them."""

    in_force: NodeConfig
    live: tuple[str, ...]
    needs_restart: tuple[str, ...]
    peers_added: tuple[PeerConfig, ...]
    peers_removed: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.live or self.needs_restart)


def plan(old: NodeConfig, new: NodeConfig) -> ReloadPlan:
    """What reloading ``new`` over the running ``old`` does. A peer whose URL changed is removed and added again
    (its link restarts on the new address)."""
    changed = changed_settings(old, new)
    before = {p.agent_id: p for p in old.mesh.peers}
    after = {p.agent_id: p for p in new.mesh.peers}
    removed = tuple(a for a, p in before.items() if after.get(a) != p)
    added = tuple(p for a, p in after.items() if before.get(a) != p)
    in_force = dataclasses.replace(
        old, mesh=dataclasses.replace(old.mesh, peers=new.mesh.peers),
        federation=dataclasses.replace(old.federation, namespaces=new.federation.namespaces),
        log=dataclasses.replace(old.log, level=new.log.level))
    return ReloadPlan(in_force=in_force, live=tuple(k for k in changed if k in LIVE),
                      needs_restart=tuple(k for k in changed if k not in LIVE), peers_added=added,
                      peers_removed=removed)


def changed_settings(old: NodeConfig, new: NodeConfig) -> list[str]:
    """The dotted names of the settings whose values differ (``mesh.listen_port``, ``agent_id``), in file order."""
    out: list[str] = []
    for f in dataclasses.fields(NodeConfig):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if dataclasses.is_dataclass(a) and not isinstance(a, type):
            out += [f"{f.name}.{name}" for name in _differing(a, b)]
        elif a != b:
            out.append(f.name)
    return out


def _differing(a: Any, b: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]
