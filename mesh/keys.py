"""Identity key files: the node's Ed25519 keypair, its keyring, and the file rules every key file follows
(the trusted peers' files are :mod:`mesh.peerkeys`'s).

Layout (docs/operations.md, "Files, owners and modes"), all directories passed in by the caller:

- ``<home>/keys/<agent_id>.priv``: PKCS#8 PEM, unencrypted, mode 0600
- ``<home>/keys/<agent_id>.pub``: SubjectPublicKeyInfo PEM, mode 0644
- ``<home>/peers/<agent_id>.pub``: one trusted peer per file; the file name is
  the peer's agent_id.
- ``<home>/keys/retired/<agent_id>.<fingerprint16>.pub``: this node's public
  keys from before each ``rotate_identity`` (the keyring), mode 0644.
- ``<home>/peers/retired/<agent_id>.<fingerprint16>.pub``: a peer's keys from
  before it rotated, moved there by ``import_peer``.

File names keep the agent_id as is (it may hold ``:``; ``scp`` needs a path
with a ``/`` before it, e.g. ``./ai:node-1@lab.pub``); the fingerprint is hex.
Retired keys only verify old signatures: transport pinning uses current keys.
Keyring files follow the trust-file rule: writable by group or others (the
file, ``retired/`` or its parent) means not trusted, logged.

Every failure is a :class:`~mesh.errors.MeshError` with a stable code:
``bad_agent_id``, ``identity_exists``, ``key_missing``, ``key_file_mode``,
``key_invalid``, ``key_pair_mismatch``, ``no_identity``,
``ambiguous_identity``, ``bad_key_file_name`` (and ``peer_key_conflict`` in :mod:`mesh.peerkeys`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import secrets
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from nacl.bindings import crypto_core_ed25519_is_valid_point

from a2a.envelope import MAX_AGENT_ID_CHARS
from mesh.errors import MeshCode, MeshError

log = logging.getLogger(__name__)

PRIV_SUFFIX = ".priv"
PUB_SUFFIX = ".pub"
PRIV_MODE = 0o600
PUB_MODE = 0o644
# Keys directory holds secrets, so it is private; peers/ only public keys.
KEYS_DIR_MODE = 0o700
PEERS_DIR_MODE = 0o755
RETIRED_DIR = "retired"
FINGERPRINT_LEN = 16
_HEX = frozenset("0123456789abcdef")


# --------------------------------------------------------------------------- ids


def validate_agent_id(agent_id: object) -> str:
    """Return ``agent_id`` if it is safe to use as a file name and identity.

    Allowed: 1..MAX_AGENT_ID_CHARS (128) characters, no ``/`` or ``\\``, no control or whitespace
    characters, not ``.``/``..`` and no leading ``.``. ``ai:node-1@lab`` is fine.
    """
    if not isinstance(agent_id, str) or not agent_id:
        raise MeshError(MeshCode.BAD_AGENT_ID, "The agent_id must be a non-empty string.")
    shown = ascii(agent_id)
    if len(agent_id) > MAX_AGENT_ID_CHARS:
        raise MeshError(
            MeshCode.BAD_AGENT_ID,
            f"The agent_id {shown} is {len(agent_id)} characters long; "
            f"the limit is {MAX_AGENT_ID_CHARS}.",
        )
    if "/" in agent_id or "\\" in agent_id:
        raise MeshError(
            MeshCode.BAD_AGENT_ID, f"The agent_id {shown} contains a path separator."
        )
    for ch in agent_id:
        # Cc = control, Zs/Zl/Zp = separators; isspace catches the rest.
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Zs", "Zl", "Zp"):
            raise MeshError(
                MeshCode.BAD_AGENT_ID,
                f"The agent_id {shown} contains a control or whitespace character.",
            )
    if agent_id.startswith("."):
        raise MeshError(
            MeshCode.BAD_AGENT_ID,
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
                    MeshCode.FILE_EXISTS, f"{path} already exists; not overwriting it."
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


def ensure_dir(directory: Path, mode: int) -> None:
    Path(directory).mkdir(mode=mode, parents=True, exist_ok=True)


def _read_file(path: Path, what: str) -> tuple[bytes, os.stat_result]:
    """Read a key file, returning its bytes and the stat of the opened file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise MeshError(MeshCode.KEY_MISSING, f"The {what} file {path} does not exist.") from None
    except IsADirectoryError:
        raise MeshError(MeshCode.KEY_INVALID, f"The {what} path {path} is a directory.") from None
    except PermissionError:
        raise MeshError(MeshCode.KEY_FILE_MODE, _unreadable(path, what)) from None
    try:
        st = os.fstat(fd)  # stat the opened file itself, not the name (no race)
        if not stat.S_ISREG(st.st_mode):
            raise MeshError(MeshCode.KEY_INVALID, f"The {what} path {path} is not a regular file.")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(), st
    finally:
        os.close(fd)


def _unreadable(path: Path, what: str) -> str:
    """A key file this user may not open: who owns it, its mode, and the chown that hands it to this user."""
    me = _user_name(os.geteuid())
    try:
        st = os.stat(path)
    except OSError:
        return (f"The {what} file {path} cannot be reached by user {me} (a directory above it cannot be entered); "
                f"run: chown -R {me}: {path.parent}")
    return (f"The {what} file {path} cannot be read by user {me} (owned by {_user_name(st.st_uid)}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}); run: chown {me}: {path}")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# --------------------------------------------------------------------- loading


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an unencrypted PKCS#8 PEM Ed25519 private key from ``path``.

    Refuses a file any group/other permission bit is set on (``key_file_mode``).
    """
    path = Path(path)
    data, st = _read_file(path, "private key")
    if st.st_mode & 0o077:
        raise MeshError(
            MeshCode.KEY_FILE_MODE,
            f"The private key file {path} has mode {stat.S_IMODE(st.st_mode):04o}, "
            f"which lets other users read it; run: chmod 600 {path}",
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise MeshError(
            MeshCode.KEY_INVALID, f"The private key file {path} is encrypted; it must not be."
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise MeshError(
            MeshCode.KEY_INVALID, f"The private key file {path} is not a PEM private key ({exc})."
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise MeshError(
            MeshCode.KEY_INVALID,
            f"The private key file {path} holds a {type(key).__name__}, not Ed25519.",
        )
    return key


def public_key_from_pem(data: bytes, *, source: str = "the data") -> Ed25519PublicKey:
    """Parse a SubjectPublicKeyInfo PEM holding an Ed25519 public key."""
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise MeshError(
            MeshCode.KEY_INVALID,
            f"{source} is not a SubjectPublicKeyInfo PEM public key ({exc}).",
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise MeshError(
            MeshCode.KEY_INVALID, f"{source} holds a {type(key).__name__}, not Ed25519."
        )
    if not crypto_core_ed25519_is_valid_point(key.public_bytes_raw()):
        # Small order, a small-order component, or not canonical: no key pair makes one, and under a
        # small-order key OpenSSL would take a single (R, S) as a signature of every message
        # (node/attest.py verify refuses all of them).
        raise MeshError(
            MeshCode.KEY_INVALID,
            f"{source} holds an Ed25519 point that no generated key has (small order, a small-order "
            "component, or not canonical); ask its operator for the .pub file again.",
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


def identity_paths(keys_dir: Path, agent_id: str) -> tuple[Path, Path]:
    validate_agent_id(agent_id)
    keys_dir = Path(keys_dir)
    return keys_dir / f"{agent_id}{PRIV_SUFFIX}", keys_dir / f"{agent_id}{PUB_SUFFIX}"


def generate_identity(keys_dir: Path, agent_id: str, *, force: bool = False) -> Identity:
    """Create a new Ed25519 keypair for ``agent_id`` in ``keys_dir``.

    Refuses to replace an existing .priv or .pub (``identity_exists``) unless
    ``force``. Files are written atomically with modes 0600 / 0644.
    """
    priv_path, pub_path = identity_paths(keys_dir, agent_id)
    if not force:
        existing = [p for p in (priv_path, pub_path) if p.exists()]
        if existing:
            raise MeshError(
                MeshCode.IDENTITY_EXISTS,
                f"An identity for {agent_id} already exists ({existing[0]}); "
                "pass force to replace it (peers holding the old .pub will stop "
                "trusting this node).",
            )
    ensure_dir(Path(keys_dir), KEYS_DIR_MODE)
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
            MeshCode.IDENTITY_EXISTS,
            f"An identity for {agent_id} appeared while generating: {exc.message}",
        ) from None
    return Identity.of(agent_id, private_key, priv_path, pub_path)


def agent_id_from_name(name: str, suffix: str) -> str:
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
            p for p in list_files(keys_dir, PRIV_SUFFIX) if not p.name.startswith(".")
        )
        if not candidates:
            raise MeshError(
                MeshCode.NO_IDENTITY,
                f"No identity found in {keys_dir}; run `ai-memory identity generate`.",
            )
        if len(candidates) > 1:
            names = ", ".join(agent_id_from_name(p.name, PRIV_SUFFIX) for p in candidates)
            raise MeshError(
                MeshCode.AMBIGUOUS_IDENTITY,
                f"Several identities in {keys_dir} ({names}); name the agent_id to use.",
            )
        agent_id = agent_id_from_name(candidates[0].name, PRIV_SUFFIX)
    priv_path, pub_path = identity_paths(keys_dir, agent_id)
    if not priv_path.exists():
        raise MeshError(
            MeshCode.NO_IDENTITY,
            f"No private key for {agent_id} at {priv_path}; "
            "run `ai-memory identity generate`.",
        )
    private_key = load_private_key(priv_path)
    public_key = private_key.public_key()
    if pub_path.exists():
        on_disk = load_public_key(pub_path)
        if raw_public_bytes(on_disk) != raw_public_bytes(public_key):
            raise MeshError(
                MeshCode.KEY_PAIR_MISMATCH,
                f"{pub_path} does not match {priv_path}; re-export the public key "
                "or restore the right pair.",
            )
    return Identity.of(agent_id, private_key, priv_path, pub_path)


def rotate_identity(keys_dir: Path, agent_id: str) -> tuple[Identity, str]:
    """Replace this node's keypair with a new one; returns (the new Identity, the retired fingerprint).

    The old public key is kept in the keyring, ``keys_dir/retired/<agent_id>.<old fp>.pub`` (0644),
    so what it signed keeps verifying here (:func:`retired_public_keys`). The old private key is
    destroyed: a retired key only verifies, and keeping its private half would only keep a way to
    forge "old" signatures that every peer still accepts.

    Steps, each written atomically and fsynced, so that :func:`load_identity` finds a whole pair
    (old or new) at every moment: the old .pub into the keyring; a backup of the old .priv at
    ``retired/<agent_id>.<old fp>.priv`` (0600); the old .pub removed (a lone .priv loads, its .pub
    derived); the new .priv renamed over the old; the new .pub; the backup removed. If a step fails
    the old pair is put back and the error raised; if the process dies, the backup may be left
    behind (``identity list`` warns) and the next rotation removes it.
    """
    old = load_identity(keys_dir, agent_id)
    retired_dir = Path(keys_dir) / RETIRED_DIR
    _remove_priv_backups(retired_dir, agent_id)
    new_private = Ed25519PrivateKey.generate()
    retired_pub = retired_dir / retired_file_name(agent_id, old.fingerprint)
    backup = retired_dir / f"{agent_id}.{old.fingerprint}{PRIV_SUFFIX}"
    try:
        write_retired(retired_dir, agent_id, old.public_key, KEYS_DIR_MODE)
        write_file_atomic(backup, private_pem(old.private_key), PRIV_MODE, replace=True)
        old.pub_path.unlink(missing_ok=True)
        _fsync_dir(old.pub_path.parent)
        write_file_atomic(old.priv_path, private_pem(new_private), PRIV_MODE, replace=True)
        write_file_atomic(old.pub_path, public_pem(new_private.public_key()), PUB_MODE, replace=True)
    except BaseException:
        _put_back(old, retired_pub, backup)
        raise
    backup.unlink()
    _fsync_dir(retired_dir)
    return Identity.of(agent_id, new_private, old.priv_path, old.pub_path), old.fingerprint


def _put_back(old: Identity, retired_pub: Path, backup: Path) -> None:
    # Best effort: if this fails too, the backup stays and says which key was the node's.
    try:
        write_file_atomic(old.priv_path, private_pem(old.private_key), PRIV_MODE, replace=True)
        write_file_atomic(old.pub_path, public_pem(old.public_key), PUB_MODE, replace=True)
    except (OSError, MeshError) as exc:
        log.error("could not put back the identity %s after a failed rotation (%s); its private key is "
                  "kept at %s", old.agent_id, exc, backup)
        return
    retired_pub.unlink(missing_ok=True)
    backup.unlink(missing_ok=True)


def priv_backups(retired_dir: Path, agent_id: str) -> list[Path]:
    prefix = f"{agent_id}."
    out = []
    for path in list_files(retired_dir, PRIV_SUFFIX):
        middle = path.name[len(prefix): -len(PRIV_SUFFIX)]
        if path.name.startswith(prefix) and len(middle) == FINGERPRINT_LEN and set(middle) <= _HEX:
            out.append(path)
    return sorted(out)


def _remove_priv_backups(retired_dir: Path, agent_id: str) -> None:
    # Left by a rotation that died after its backup: that key is either still the current one
    # (so the backup is a copy) or already replaced (so it is due to be destroyed).
    for path in priv_backups(retired_dir, agent_id):
        log.warning("removing %s, left by an interrupted key rotation", path)
        path.unlink(missing_ok=True)


def list_files(directory: Path, suffix: str) -> list[Path]:
    try:
        entries = list(Path(directory).iterdir())
    except FileNotFoundError:
        return []
    return [p for p in entries if p.name.endswith(suffix) and p.is_file()]


def retired_file_name(agent_id: str, fp: str) -> str:
    """``<agent_id>.<fingerprint16>.pub``: the keyring file name of one retired key."""
    return f"{validate_agent_id(agent_id)}.{fp}{PUB_SUFFIX}"


def _parse_retired_name(name: str) -> tuple[str, str]:
    """(agent_id, fingerprint) from a keyring file name, or ``bad_key_file_name``."""
    stem = name[: -len(PUB_SUFFIX)]
    agent_id, dot, fp = stem.rpartition(".")
    if not dot or len(fp) != FINGERPRINT_LEN or not set(fp) <= _HEX:
        raise MeshError(
            MeshCode.BAD_KEY_FILE_NAME,
            f"{name!r} is not <agent_id>.<16 hex fingerprint>.pub, so it names no retired key.",
        )
    return validate_agent_id(agent_id), fp


def write_retired(retired_dir: Path, agent_id: str, key: Ed25519PublicKey, dir_mode: int) -> Path:
    ensure_dir(retired_dir, dir_mode)
    path = retired_dir / retired_file_name(agent_id, fingerprint(key))
    write_file_atomic(path, public_pem(key), PUB_MODE, replace=True)
    return path


def _untrusted_dir(directory: Path) -> Path | None:
    """``directory`` or its parent when either is writable by group or others, else None."""
    for d in (directory, directory.parent):
        try:
            if d.stat().st_mode & 0o022:
                return d
        except FileNotFoundError:
            continue
    return None


def load_retired(retired_dir: Path, agent_id: str | None = None) -> dict[str, list[Ed25519PublicKey]]:
    """Every trusted keyring file in ``retired_dir`` (only ``agent_id``'s when given), by agent_id.

    A file that is writable by group or others (or in such a directory), badly named, unparsable,
    or whose key does not have the fingerprint its name says is skipped and logged as a warning.
    """
    out: dict[str, list[Ed25519PublicKey]] = {}
    files = sorted(p for p in list_files(retired_dir, PUB_SUFFIX) if not p.name.startswith("."))
    if not files:
        return out
    loose_dir = _untrusted_dir(retired_dir)
    for path in files:
        try:
            owner, fp = _parse_retired_name(path.name)
            if agent_id is not None and owner != agent_id:
                continue
            where = loose_dir or (path if path.stat().st_mode & 0o022 else None)
            if where is not None:
                raise MeshError(MeshCode.KEY_FILE_MODE,
                                f"{where} is writable by group or others, so anyone could add "
                                f"a key that old signatures verify against; run: chmod go-w {where}")
            key = load_public_key(path)
            if fingerprint(key) != fp:
                raise MeshError(MeshCode.KEY_INVALID,
                                f"{path} holds key {fingerprint(key)}, not the {fp} its name says.")
        except MeshError as exc:
            log.warning("skipping retired key file %s: %s", path, exc.message)
            continue
        out.setdefault(owner, []).append(key)
    return out


def retired_public_keys(keys_dir: Path, agent_id: str) -> tuple[Ed25519PublicKey, ...]:
    """This node's own retired public keys (``keys_dir/retired/<agent_id>.<fp>.pub``), in file-name order.

    Never includes the current key (even after an interrupted :func:`rotate_identity`); empty when
    the node never rotated. Bad files are skipped and logged. It changes only by rotation, after
    which the node restarts, so read it once when the node opens its identity.
    """
    keys_dir = Path(keys_dir)
    found = load_retired(keys_dir / RETIRED_DIR, validate_agent_id(agent_id)).get(agent_id, [])
    now = _current_public_key(keys_dir, agent_id)
    return tuple(k for k in found if now is None or raw_public_bytes(k) != raw_public_bytes(now))


def _current_public_key(keys_dir: Path, agent_id: str) -> Ed25519PublicKey | None:
    priv_path, pub_path = identity_paths(keys_dir, agent_id)
    try:
        if pub_path.exists():
            return load_public_key(pub_path)
        if priv_path.exists():
            return load_private_key(priv_path).public_key()
    except MeshError:
        return None
    return None


def export_pub(keys_dir: Path, agent_id: str, out_dir: Path) -> Path:
    """Write this node's public key to ``out_dir/<agent_id>.pub`` (mode 0644).

    Reads ``keys_dir/<agent_id>.pub`` (or derives it from the .priv when the
    .pub is missing); an existing file in ``out_dir`` is replaced.
    """
    priv_path, pub_path = identity_paths(keys_dir, agent_id)
    if pub_path.exists():
        key = load_public_key(pub_path)
    elif priv_path.exists():
        key = load_private_key(priv_path).public_key()
    else:
        raise MeshError(
            MeshCode.NO_IDENTITY, f"No identity for {agent_id} in {keys_dir}."
        )
    out_dir = Path(out_dir)
    ensure_dir(out_dir, PEERS_DIR_MODE)
    dest = out_dir / f"{agent_id}{PUB_SUFFIX}"
    write_file_atomic(dest, public_pem(key), PUB_MODE, replace=True)
    return dest
