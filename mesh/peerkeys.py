"""Trusted peers' key files: ``<home>/peers/<agent_id>.pub`` (one trusted peer a file, named by its agent_id)
and each peer's keyring, ``<home>/peers/retired/<agent_id>.<fingerprint16>.pub`` (the keys it had before it
rotated, moved there by ``import_peer``: they verify old signatures, never pin a TLS peer); and ``list_keys``,
own identities and peers together. The file rules (modes, atomic writes, the trust-file rule) are
:mod:`mesh.keys`'s. Every failure is a :class:`~mesh.errors.MeshError`: ``peer_key_conflict`` here, the key
file codes from :mod:`mesh.keys`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from mesh.errors import MeshCode, MeshError
from mesh.keys import (
    PEERS_DIR_MODE,
    PRIV_SUFFIX,
    PUB_MODE,
    PUB_SUFFIX,
    RETIRED_DIR,
    agent_id_from_name,
    ensure_dir,
    fingerprint,
    list_files,
    load_private_key,
    load_public_key,
    load_retired,
    priv_backups,
    public_pem,
    raw_public_bytes,
    retired_file_name,
    retired_public_keys,
    validate_agent_id,
    write_file_atomic,
    write_retired,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerKey:
    """A trusted peer's public key as stored in ``peers/``."""

    agent_id: str
    public_key: Ed25519PublicKey
    path: Path
    fingerprint: str
    # Set when this import replaced another key for the peer: that key's fingerprint and its keyring file.
    retired_fingerprint: str | None = None
    retired_path: Path | None = None


@dataclass(frozen=True)
class KeyInfo:
    """One row of ``ai-memory identity list``; ``retired`` keys only verify old signatures."""

    agent_id: str
    fingerprint: str
    trust: Literal["self", "peer"]
    path: Path
    retired: bool = False


class BadKeyFile(NamedTuple):
    """A file in ``peers/`` that was skipped, and why."""

    path: Path
    error: MeshError


class PeerKeys(NamedTuple):
    """Result of :func:`load_peer_keys`; unpacks as ``keys, bad = ...``."""

    keys: dict[str, Ed25519PublicKey]
    bad: list[BadKeyFile]


def import_peer(
    peers_dir: Path,
    pub_file: Path,
    *,
    agent_id: str | None = None,
    force: bool = False,
) -> PeerKey:
    """Trust the Ed25519 public key in ``pub_file`` as ``agent_id`` (:func:`trust_peer_key`).

    ``agent_id`` defaults to the file name without ``.pub``
    (``ai:node-2@lab.pub`` → ``ai:node-2@lab``).
    """
    pub_file = Path(pub_file)
    if agent_id is None:
        agent_id = agent_id_from_name(pub_file.name, PUB_SUFFIX)
    validate_agent_id(agent_id)
    return trust_peer_key(peers_dir, agent_id, load_public_key(pub_file), force=force)


def trust_peer_key(peers_dir: Path, agent_id: str, public_key: Ed25519PublicKey, *, force: bool = False) -> PeerKey:
    """Trust ``public_key`` as ``agent_id``'s current key.

    Trusting the same key again is a no-op. A different key for a known peer means the peer rotated: the
    key trusted so far moves to ``peers_dir/retired/<agent_id>.<fp>.pub`` (so what it signed keeps
    verifying) and the result names it in ``retired_fingerprint``/``retired_path``. A trusted file that
    cannot be read cannot be kept: replacing it needs ``force`` (``peer_key_conflict``). Stored as
    ``peers_dir/<agent_id>.pub``, mode 0644, in canonical SPKI PEM.
    """
    validate_agent_id(agent_id)
    peers_dir = Path(peers_dir)
    dest = peers_dir / f"{agent_id}{PUB_SUFFIX}"
    fp = fingerprint(public_key)
    current: Ed25519PublicKey | None = None
    if dest.exists():
        try:
            current = load_public_key(dest)
        except MeshError as exc:
            if not force:
                raise MeshError(
                    MeshCode.PEER_KEY_CONFLICT,
                    f"Peer {agent_id} is trusted with a key file that cannot be read ({exc.message}); "
                    "pass force to replace it without keeping the old key.",
                ) from None
        if current is not None and raw_public_bytes(current) == raw_public_bytes(public_key):
            return PeerKey(agent_id, public_key, dest, fp)
    ensure_dir(peers_dir, PEERS_DIR_MODE)
    retired_path = None
    if current is not None:
        # Keyring first: if writing the new key fails, the old one is still trusted where it was.
        retired_path = keep_retired(peers_dir, agent_id, current)
    write_file_atomic(dest, public_pem(public_key), PUB_MODE, replace=True)
    # A key brought back from the keyring is current again, not also retired.
    (peers_dir / RETIRED_DIR / retired_file_name(agent_id, fp)).unlink(missing_ok=True)
    return PeerKey(agent_id, public_key, dest, fp,
                   retired_fingerprint=fingerprint(current) if current is not None else None,
                   retired_path=retired_path)


def keep_retired(peers_dir: Path, agent_id: str, key: Ed25519PublicKey) -> Path:
    """Keep ``key`` in ``agent_id``'s keyring, ``peers_dir/retired/<agent_id>.<fp>.pub``: it verifies what it
    signed, never pins a TLS peer. Returns the file."""
    return write_retired(Path(peers_dir) / RETIRED_DIR, agent_id, key, PEERS_DIR_MODE)


def load_peer_keyrings(peers_dir: Path) -> dict[str, tuple[Ed25519PublicKey, ...]]:
    """Every trusted peer's keyring: ``{agent_id: (current key, retired key, ...)}``.

    The current key is the one :func:`load_peer_keys` returns (``peers_dir/<agent_id>.pub``) and
    always comes first; retired keys (``peers_dir/retired/<agent_id>.<fp>.pub``) follow in file-name
    order, without repeating the current key. A peer with no current ``.pub`` has no entry at all:
    removing a peer's ``.pub`` withdraws trust in every key it had. Bad files are skipped and logged
    as :func:`load_peer_keys` does; nothing raises. Cost: one directory listing and one small file
    read per key file, so call it when the directories change (:func:`keyring_stamp`), not per
    message. Use a retired key only to verify signatures, never to pin a TLS peer.
    """
    peers_dir = Path(peers_dir)
    current = load_peer_keys(peers_dir).keys
    retired = load_retired(peers_dir / RETIRED_DIR)
    out: dict[str, tuple[Ed25519PublicKey, ...]] = {}
    for agent_id, key in current.items():
        raw = raw_public_bytes(key)
        older = tuple(k for k in retired.get(agent_id, ()) if raw_public_bytes(k) != raw)
        out[agent_id] = (key, *older)
    return out


def keyring_stamp(directory: Path | str) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(mtime_ns, inode) of ``directory`` and of ``directory/retired`` (None where absent).

    Changes whenever a key file is added, removed or renamed in either, so a caller can re-run
    :func:`load_peer_keyrings` only when this differs from the last value (two ``stat`` calls).
    The membership check runs it for every inbound frame, hence plain ``os`` calls on strings:
    ``pathlib`` costs several times the two system calls.
    """
    def one(d: str) -> tuple[int, int] | None:
        try:
            st = os.stat(d)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_ino

    directory = os.fspath(directory)
    return one(directory), one(os.path.join(directory, RETIRED_DIR))


def load_peer_keys(peers_dir: Path) -> PeerKeys:
    """Load every trusted peer key in ``peers_dir``.

    Returns ``PeerKeys(keys={agent_id: key}, bad=[BadKeyFile])``; a bad file
    (unparsable, bad name, writable by group or others — anyone who can
    write it could swap a trust anchor) is skipped, logged as a warning and
    listed in ``bad``, never fatal. A missing directory means no peers.
    """
    keys: dict[str, Ed25519PublicKey] = {}
    bad: list[BadKeyFile] = []
    peers_dir = Path(peers_dir)
    dir_writable = peers_dir.is_dir() and peers_dir.stat().st_mode & 0o022
    for path in sorted(list_files(peers_dir, PUB_SUFFIX)):
        if path.name.startswith("."):
            continue  # temp files from atomic writes, editor droppings
        try:
            if dir_writable or path.stat().st_mode & 0o022:
                where = peers_dir if dir_writable else path
                raise MeshError(MeshCode.KEY_FILE_MODE,
                                f"{where} is writable by group or others, so anyone could replace "
                                f"a trusted key; run: chmod go-w {where}")
            agent_id = validate_agent_id(agent_id_from_name(path.name, PUB_SUFFIX))
            keys[agent_id] = load_public_key(path)
        except MeshError as exc:
            log.warning("skipping peer key file %s: %s", path, exc.message)
            bad.append(BadKeyFile(path, exc))
    return PeerKeys(keys, bad)


def list_keys(keys_dir: Path, peers_dir: Path) -> list[KeyInfo]:
    """Own identities (trust ``self``) then trusted peers (``peer``), by agent_id; each followed by
    its retired keys (``retired=True``, path = the keyring file).

    Unreadable files are logged and left out.
    """
    keys_dir, peers_dir = Path(keys_dir), Path(peers_dir)
    out: list[KeyInfo] = []
    for priv_path in sorted(list_files(keys_dir, PRIV_SUFFIX)):
        if priv_path.name.startswith("."):
            continue
        agent_id = agent_id_from_name(priv_path.name, PRIV_SUFFIX)
        pub_path = priv_path.with_name(f"{agent_id}{PUB_SUFFIX}")
        try:
            validate_agent_id(agent_id)
            key = load_public_key(pub_path) if pub_path.exists() else load_private_key(priv_path).public_key()
        except MeshError as exc:
            log.warning("skipping identity %s: %s", priv_path, exc.message)
            continue
        out.append(KeyInfo(agent_id, fingerprint(key), "self", priv_path))
        for backup in priv_backups(keys_dir / RETIRED_DIR, agent_id):
            log.warning("%s was left by an interrupted key rotation; the next `identity rotate` removes it, "
                        "or delete it once this node runs with key %s", backup, fingerprint(key))
        for old in retired_public_keys(keys_dir, agent_id):
            fp = fingerprint(old)
            out.append(KeyInfo(agent_id, fp, "self", keys_dir / RETIRED_DIR / retired_file_name(agent_id, fp),
                               retired=True))
    for agent_id, ring in sorted(load_peer_keyrings(peers_dir).items()):
        out.append(KeyInfo(agent_id, fingerprint(ring[0]), "peer", peers_dir / f"{agent_id}{PUB_SUFFIX}"))
        for old in ring[1:]:
            fp = fingerprint(old)
            out.append(KeyInfo(agent_id, fp, "peer", peers_dir / RETIRED_DIR / retired_file_name(agent_id, fp),
                               retired=True))
    return out
