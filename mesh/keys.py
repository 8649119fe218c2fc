"""Identity key files: the node's Ed25519 keypair and its trusted peers' keys.

Layout (DESIGN.md §2), all directories passed in by the caller:

- ``<home>/keys/<agent_id>.priv``: PKCS#8 PEM, unencrypted, mode 0600
- ``<home>/keys/<agent_id>.pub``: SubjectPublicKeyInfo PEM, mode 0644
- ``<home>/peers/<agent_id>.pub``: one trusted peer per file; the file name is
  the peer's agent_id.

Every failure is a :class:`~mesh.errors.MeshError` with a stable code:
``bad_agent_id``, ``identity_exists``, ``key_missing``, ``key_file_mode``,
``key_invalid``, ``key_pair_mismatch``, ``no_identity``,
``ambiguous_identity``, ``peer_key_conflict``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from mesh.errors import MeshError

log = logging.getLogger(__name__)

PRIV_SUFFIX = ".priv"
PUB_SUFFIX = ".pub"
PRIV_MODE = 0o600
PUB_MODE = 0o644
MAX_AGENT_ID_LEN = 128
# Keys directory holds secrets, so it is private; peers/ only public keys.
KEYS_DIR_MODE = 0o700
PEERS_DIR_MODE = 0o755


# --------------------------------------------------------------------------- ids


def validate_agent_id(agent_id: object) -> str:
    """Return ``agent_id`` if it is safe to use as a file name and identity.

    Allowed: 1..128 characters, no ``/`` or ``\\``, no control or whitespace
    characters, not ``.``/``..`` and no leading ``.``. ``ai:node-1@lab`` is fine.
    """
    if not isinstance(agent_id, str) or not agent_id:
        raise MeshError("bad_agent_id", "The agent_id must be a non-empty string.")
    shown = ascii(agent_id)
    if len(agent_id) > MAX_AGENT_ID_LEN:
        raise MeshError(
            "bad_agent_id",
            f"The agent_id {shown} is {len(agent_id)} characters long; "
            f"the limit is {MAX_AGENT_ID_LEN}.",
        )
    if "/" in agent_id or "\\" in agent_id:
        raise MeshError(
            "bad_agent_id", f"The agent_id {shown} contains a path separator."
        )
    for ch in agent_id:
        # Cc = control, Zs/Zl/Zp = separators; isspace catches the rest.
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Zs", "Zl", "Zp"):
            raise MeshError(
                "bad_agent_id",
                f"The agent_id {shown} contains a control or whitespace character.",
            )
    if agent_id.startswith("."):
        raise MeshError(
            "bad_agent_id",
            f"The agent_id {shown} starts with '.', which would make a hidden "
            "or relative file name.",
        )
    return agent_id


# ----------------------------------------------------------------- small helpers


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    """The raw 32-byte Ed25519 public key."""
    return public_key.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """Hex SHA-256 of the raw 32-byte key, first 16 hex characters."""
    return hashlib.sha256(raw_public_bytes(public_key)).hexdigest()[:16]


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    """SubjectPublicKeyInfo PEM of ``public_key``."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def private_pem(private_key: Ed25519PrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM of ``private_key``."""
    return private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_file_atomic(path: Path, data: bytes, mode: int, *, replace: bool) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory.

    The temp file is created with ``mode`` (never looser at any moment), synced,
    then moved into place. With ``replace=False`` an existing ``path`` is never
    clobbered (hard-link no-clobber) and MeshError('file_exists') is raised.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
    # Create with a mode no looser than wanted (umask may only tighten it),
    # then fchmod to exactly ``mode`` before any byte is written.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & PRIV_MODE)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise MeshError(
                    "file_exists", f"{path} already exists; not overwriting it."
                ) from None
            os.unlink(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename durable; best effort on filesystems that refuse it.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _ensure_dir(directory: Path, mode: int) -> None:
    Path(directory).mkdir(mode=mode, parents=True, exist_ok=True)


def _read_file(path: Path, what: str) -> tuple[bytes, os.stat_result]:
    """Read a key file, returning its bytes and the stat of the opened file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise MeshError("key_missing", f"The {what} file {path} does not exist.") from None
    except IsADirectoryError:
        raise MeshError("key_invalid", f"The {what} path {path} is a directory.") from None
    except PermissionError:
        raise MeshError(
            "key_file_mode", f"The {what} file {path} is not readable by this user."
        ) from None
    try:
        st = os.fstat(fd)  # stat the opened file itself, not the name (no race)
        if not stat.S_ISREG(st.st_mode):
            raise MeshError("key_invalid", f"The {what} path {path} is not a regular file.")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(), st
    finally:
        os.close(fd)


# --------------------------------------------------------------------- loading


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an unencrypted PKCS#8 PEM Ed25519 private key from ``path``.

    Refuses a file any group/other permission bit is set on (``key_file_mode``).
    """
    path = Path(path)
    data, st = _read_file(path, "private key")
    if st.st_mode & 0o077:
        raise MeshError(
            "key_file_mode",
            f"The private key file {path} has mode {stat.S_IMODE(st.st_mode):04o}, "
            f"which lets other users read it; run: chmod 600 {path}",
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise MeshError(
            "key_invalid", f"The private key file {path} is encrypted; it must not be."
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise MeshError(
            "key_invalid", f"The private key file {path} is not a PEM private key ({exc})."
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise MeshError(
            "key_invalid",
            f"The private key file {path} holds a {type(key).__name__}, not Ed25519.",
        )
    return key


def public_key_from_pem(data: bytes, *, source: str = "the data") -> Ed25519PublicKey:
    """Parse a SubjectPublicKeyInfo PEM holding an Ed25519 public key."""
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise MeshError(
            "key_invalid",
            f"{source} is not a SubjectPublicKeyInfo PEM public key ({exc}).",
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise MeshError(
            "key_invalid", f"{source} holds a {type(key).__name__}, not Ed25519."
        )
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Load an Ed25519 SubjectPublicKeyInfo PEM public key from ``path``."""
    path = Path(path)
    data, _ = _read_file(path, "public key")
    return public_key_from_pem(data, source=f"The public key file {path}")


# -------------------------------------------------------------------- identity


@dataclass(frozen=True)
class Identity:
    """This node's own keypair and where it lives."""

    agent_id: str
    private_key: Ed25519PrivateKey
    public_key: Ed25519PublicKey
    priv_path: Path
    pub_path: Path
    fingerprint: str

    @classmethod
    def of(cls, agent_id: str, private_key: Ed25519PrivateKey, priv_path: Path, pub_path: Path) -> Identity:
        public_key = private_key.public_key()
        return cls(agent_id=agent_id, private_key=private_key, public_key=public_key, priv_path=priv_path,
                   pub_path=pub_path, fingerprint=fingerprint(public_key))


def _identity_paths(keys_dir: Path, agent_id: str) -> tuple[Path, Path]:
    validate_agent_id(agent_id)
    keys_dir = Path(keys_dir)
    return keys_dir / f"{agent_id}{PRIV_SUFFIX}", keys_dir / f"{agent_id}{PUB_SUFFIX}"


def generate_identity(keys_dir: Path, agent_id: str, *, force: bool = False) -> Identity:
    """Create a new Ed25519 keypair for ``agent_id`` in ``keys_dir``.

    Refuses to replace an existing .priv or .pub (``identity_exists``) unless
    ``force``. Files are written atomically with modes 0600 / 0644.
    """
    priv_path, pub_path = _identity_paths(keys_dir, agent_id)
    if not force:
        existing = [p for p in (priv_path, pub_path) if p.exists()]
        if existing:
            raise MeshError(
                "identity_exists",
                f"An identity for {agent_id} already exists ({existing[0]}); "
                "pass force to replace it (peers holding the old .pub will stop "
                "trusting this node).",
            )
    _ensure_dir(Path(keys_dir), KEYS_DIR_MODE)
    private_key = Ed25519PrivateKey.generate()
    public_key = private_key.public_key()
    try:
        write_file_atomic(priv_path, private_pem(private_key), PRIV_MODE, replace=force)
        write_file_atomic(pub_path, public_pem(public_key), PUB_MODE, replace=force)
    except MeshError as exc:
        if exc.code != "file_exists":
            raise
        # Lost a race with another writer: say so in identity terms.
        raise MeshError(
            "identity_exists",
            f"An identity for {agent_id} appeared while generating: {exc.message}",
        ) from None
    return Identity.of(agent_id, private_key, priv_path, pub_path)


def _agent_id_from_name(name: str, suffix: str) -> str:
    return name[: -len(suffix)] if name.endswith(suffix) else name


def load_identity(keys_dir: Path, agent_id: str | None = None) -> Identity:
    """Load this node's identity from ``keys_dir``.

    With ``agent_id=None`` the single ``*.priv`` in the directory is used
    (``no_identity`` if none, ``ambiguous_identity`` if several). A .pub that
    does not match the .priv is refused (``key_pair_mismatch``); a missing
    .pub is derived from the .priv.
    """
    keys_dir = Path(keys_dir)
    if agent_id is None:
        candidates = sorted(
            p for p in _list_files(keys_dir, PRIV_SUFFIX) if not p.name.startswith(".")
        )
        if not candidates:
            raise MeshError(
                "no_identity",
                f"No identity found in {keys_dir}; run `ai-memory identity generate`.",
            )
        if len(candidates) > 1:
            names = ", ".join(_agent_id_from_name(p.name, PRIV_SUFFIX) for p in candidates)
            raise MeshError(
                "ambiguous_identity",
                f"Several identities in {keys_dir} ({names}); name the agent_id to use.",
            )
        agent_id = _agent_id_from_name(candidates[0].name, PRIV_SUFFIX)
    priv_path, pub_path = _identity_paths(keys_dir, agent_id)
    if not priv_path.exists():
        raise MeshError(
            "no_identity",
            f"No private key for {agent_id} at {priv_path}; "
            "run `ai-memory identity generate`.",
        )
    private_key = load_private_key(priv_path)
    public_key = private_key.public_key()
    if pub_path.exists():
        on_disk = load_public_key(pub_path)
        if raw_public_bytes(on_disk) != raw_public_bytes(public_key):
            raise MeshError(
                "key_pair_mismatch",
                f"{pub_path} does not match {priv_path}; re-export the public key "
                "or restore the right pair.",
            )
    return Identity.of(agent_id, private_key, priv_path, pub_path)


def _list_files(directory: Path, suffix: str) -> list[Path]:
    try:
        entries = list(Path(directory).iterdir())
    except FileNotFoundError:
        return []
    return [p for p in entries if p.name.endswith(suffix) and p.is_file()]


# ----------------------------------------------------------------------- peers


@dataclass(frozen=True)
class PeerKey:
    """A trusted peer's public key as stored in ``peers/``."""

    agent_id: str
    public_key: Ed25519PublicKey
    path: Path
    fingerprint: str


@dataclass(frozen=True)
class KeyInfo:
    """One row of ``ai-memory identity list``."""

    agent_id: str
    fingerprint: str
    trust: Literal["self", "peer"]
    path: Path


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
    """Trust the Ed25519 public key in ``pub_file`` as ``agent_id``.

    ``agent_id`` defaults to the file name without ``.pub``
    (``ai:node-2@lab.pub`` → ``ai:node-2@lab``). Importing the same key again
    is a no-op; a different key for a known peer is refused
    (``peer_key_conflict``) unless ``force``. Stored as
    ``peers_dir/<agent_id>.pub``, mode 0644, in canonical SPKI PEM.
    """
    pub_file = Path(pub_file)
    if agent_id is None:
        agent_id = _agent_id_from_name(pub_file.name, PUB_SUFFIX)
    validate_agent_id(agent_id)
    public_key = load_public_key(pub_file)
    peers_dir = Path(peers_dir)
    dest = peers_dir / f"{agent_id}{PUB_SUFFIX}"
    fp = fingerprint(public_key)
    if dest.exists():
        try:
            current = load_public_key(dest)
        except MeshError:
            current = None  # an unreadable trusted key is replaced only with force
        if current is not None and raw_public_bytes(current) == raw_public_bytes(public_key):
            return PeerKey(agent_id, public_key, dest, fp)
        if not force:
            old_fp = fingerprint(current) if current is not None else "unreadable"
            raise MeshError(
                "peer_key_conflict",
                f"Peer {agent_id} is already trusted with key {old_fp}, not {fp}; "
                "pass force to replace it if the peer really rotated its key.",
            )
    _ensure_dir(peers_dir, PEERS_DIR_MODE)
    write_file_atomic(dest, public_pem(public_key), PUB_MODE, replace=True)
    return PeerKey(agent_id, public_key, dest, fp)


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
    for path in sorted(_list_files(peers_dir, PUB_SUFFIX)):
        if path.name.startswith("."):
            continue  # temp files from atomic writes, editor droppings
        try:
            if dir_writable or path.stat().st_mode & 0o022:
                where = peers_dir if dir_writable else path
                raise MeshError("key_file_mode", f"{where} is writable by group or others, so anyone could replace "
                                                 f"a trusted key; run: chmod go-w {where}")
            agent_id = validate_agent_id(_agent_id_from_name(path.name, PUB_SUFFIX))
            keys[agent_id] = load_public_key(path)
        except MeshError as exc:
            log.warning("skipping peer key file %s: %s", path, exc.message)
            bad.append(BadKeyFile(path, exc))
    return PeerKeys(keys, bad)


def list_keys(keys_dir: Path, peers_dir: Path) -> list[KeyInfo]:
    """Own identities (trust ``self``) then trusted peers (``peer``), by agent_id.

    Unreadable files are logged and left out.
    """
    out: list[KeyInfo] = []
    for priv_path in sorted(_list_files(Path(keys_dir), PRIV_SUFFIX)):
        if priv_path.name.startswith("."):
            continue
        agent_id = _agent_id_from_name(priv_path.name, PRIV_SUFFIX)
        pub_path = priv_path.with_name(f"{agent_id}{PUB_SUFFIX}")
        try:
            validate_agent_id(agent_id)
            if pub_path.exists():
                key = load_public_key(pub_path)
            else:
                key = load_private_key(priv_path).public_key()
        except MeshError as exc:
            log.warning("skipping identity %s: %s", priv_path, exc.message)
            continue
        out.append(KeyInfo(agent_id, fingerprint(key), "self", priv_path))
    peers = load_peer_keys(peers_dir)
    for agent_id, key in sorted(peers.keys.items()):
        out.append(
            KeyInfo(agent_id, fingerprint(key), "peer", Path(peers_dir) / f"{agent_id}{PUB_SUFFIX}")
        )
    return out


def export_pub(keys_dir: Path, agent_id: str, out_dir: Path) -> Path:
    """Write this node's public key to ``out_dir/<agent_id>.pub`` (mode 0644).

    Reads ``keys_dir/<agent_id>.pub`` (or derives it from the .priv when the
    .pub is missing); an existing file in ``out_dir`` is replaced.
    """
    priv_path, pub_path = _identity_paths(keys_dir, agent_id)
    if pub_path.exists():
        key = load_public_key(pub_path)
    elif priv_path.exists():
        key = load_private_key(priv_path).public_key()
    else:
        raise MeshError(
            "no_identity", f"No identity for {agent_id} in {keys_dir}."
        )
    out_dir = Path(out_dir)
    _ensure_dir(out_dir, PEERS_DIR_MODE)
    dest = out_dir / f"{agent_id}{PUB_SUFFIX}"
    write_file_atomic(dest, public_pem(key), PUB_MODE, replace=True)
    return dest
