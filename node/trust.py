"""Whose signatures this node trusts: its own identity and its peers' keys, each with its retired keys.

One ``Keyring`` is shared by the service (local writes, ``memory_verify``) and the federation
(inbound verification). ``<home>/peers`` is read again whenever the directory changes, so an
`identity import` (or a removed file) takes effect on a running node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from mesh import keyhistory, peerkeys
from mesh import keys as mesh_keys
from mesh.errors import MeshError
from node.config import NodeConfig


@dataclass(frozen=True, slots=True)
class SignerHistory:
    """What this node knows of a signer's keys beyond the keys themselves: ``complete`` when it holds the
    signer's whole key history (this node itself; a peer whose key history bundle, signed by the key trusted
    now, was imported), and ``since_ms``, when this node began trusting the signer's current key (unix ms; None
    when not known)."""

    complete: bool
    since_ms: int | None


UNKNOWN_SIGNER = SignerHistory(complete=False, since_ms=None)


class Keyring:
    def __init__(self, cfg: NodeConfig, identity: mesh_keys.Identity | None) -> None:
        self.cfg = cfg
        self.identity = identity
        self._peer_keys: dict[str, Ed25519PublicKey] = {}
        self._peer_rings: dict[str, tuple[Ed25519PublicKey, ...]] = {}
        self._own_retired: tuple[Ed25519PublicKey, ...] = ()
        self._histories: dict[str, SignerHistory] = {}
        self._stamp_seen: tuple[object, ...] | None = None
        # Bumped on every reload: a caller that caches an answer (the WebSocket membership check) asks
        # again only when this moved.
        self.generation = 0
        # As strings once: every inbound frame's membership check stats these, and pathlib would
        # rebuild the paths each time (~5% of a receiving node's loop in the 12-03 native profile).
        self._stamp_dirs = (os.fspath(cfg.peers_dir), os.fspath(cfg.keys_dir))
        self._reload_if_changed()

    @property
    def agent_id(self) -> str:
        if self.identity is not None:
            return self.identity.agent_id
        return self.cfg.agent_id or "anonymous"

    @property
    def peer_keys(self) -> dict[str, Ed25519PublicKey]:
        """Each trusted peer's current key (what TLS pins)."""
        self._reload_if_changed()
        return self._peer_keys

    def keys_for(self, agent_id: str, *, reload: bool = True) -> tuple[Ed25519PublicKey, ...]:
        """Keys a signature by ``agent_id`` may verify under: current first, then retired; () if unknown.
        ``reload=False``: as of the last reload, without looking at the key directories (no stat)."""
        if reload:
            self._reload_if_changed()
        if self.identity is not None and agent_id == self.identity.agent_id:
            return (self.identity.public_key, *self._own_retired)
        return self._peer_rings.get(agent_id, ())

    def history(self, agent_id: str, *, reload: bool = True) -> SignerHistory:
        """What this node knows of ``agent_id``'s key history (``SignerHistory``); as of the last reload when
        ``reload`` is False."""
        if reload:
            self._reload_if_changed()
        if self.identity is not None and agent_id == self.identity.agent_id:
            return SignerHistory(complete=True, since_ms=None)
        return self._histories.get(agent_id, UNKNOWN_SIGNER)

    def refresh(self) -> int:
        """Read the key directories again if they changed (two stats); returns ``generation``."""
        self._reload_if_changed()
        return self.generation

    def is_member(self, agent_id: str) -> bool:
        """A peer with a trusted .pub (membership under ``mesh.trust = "pinned"``)."""
        return agent_id in self.peer_keys

    def _stamps(self) -> tuple[object, ...]:
        # peers/, peers/retired/ and keys/retired/: a key file copied straight into a retired/ directory
        # changes only that directory.
        peers_dir, keys_dir = self._stamp_dirs
        return peerkeys.keyring_stamp(peers_dir), peerkeys.keyring_stamp(keys_dir)

    def _reload_if_changed(self) -> None:
        stamps = self._stamps()
        if stamps == self._stamp_seen:
            return
        self._stamp_seen = stamps
        self.generation += 1
        self._peer_rings = peerkeys.load_peer_keyrings(self.cfg.peers_dir)
        self._peer_keys = {agent: ring[0] for agent, ring in self._peer_rings.items()}
        records = keyhistory.peer_histories(self.cfg.peers_dir)
        self._histories = {
            agent: SignerHistory(
                complete=agent in records and records[agent].complete_for(mesh_keys.fingerprint(ring[0])),
                since_ms=keyhistory.trusted_since_ms(self.cfg.peers_dir, agent))
            for agent, ring in self._peer_rings.items()}
        self._own_retired = (mesh_keys.retired_public_keys(self.cfg.keys_dir, self.identity.agent_id)
                             if self.identity is not None else ())


def load_node_identity(cfg: NodeConfig, *, required: bool) -> mesh_keys.Identity | None:
    """The node's identity from <home>/keys (by cfg.agent_id when set); None when absent and not required."""
    try:
        return mesh_keys.load_identity(cfg.keys_dir, cfg.agent_id or None)
    except MeshError as e:
        if e.code == "no_identity" and not required:
            return None
        raise
