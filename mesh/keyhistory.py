"""Key history: an agent's current and retired public keys, each with when it was current, handed to other nodes
as one bundle signed by the current key (``ai-memory identity export-pub --with-retired``, ``identity import``).

A node that joins after a peer rotated trusts only the peer's current key: what the peer signed before with a
retired key does not verify there until the bundle brings that key. The bundle is signed by the key it names
current, so a node that already trusts that key (or checks its fingerprint out of band, as for a ``.pub``) can
take the retired keys on its word; and it is the whole history, so once it is imported a signature no key in it
verifies is a forgery, not an unknown key (``PeerHistory.complete_for``).

Files (all public data, mode 0644, under the trust-file rule of mesh/keys.py):

- ``<agent_id>.keyhistory.json``: the bundle, ``{format, agent_id, issued_at, keys: [{fingerprint, public_key
  (base64 of the raw 32 bytes), valid_from, valid_until}], signature}``: the current key first (``valid_until``
  null), then retired keys, newest first; times are unix ms, ``valid_from`` null where not known. The signature
  is Ed25519 by the current key over the canonical CBOR of ``{type: "key.history", agent_id, issued_at, keys:
  [[raw key, valid_from, valid_until], ...]}`` (the ``type`` entry keeps it from reading as any other signed
  payload).
- ``keys/retired/<agent_id>.history.json``: this node's own retired keys' validity,
  ``{fingerprint: {valid_from, valid_until}}``, written by :func:`rotate`. A retired key it does not name (rotated
  before this record existed) ends when its keyring file was written and starts when the key before it ended.
- ``peers/retired/<agent_id>.history.json``: the last bundle imported for a peer, ``{current, issued_at,
  imported_at, keys: {fingerprint: {valid_from, valid_until}}}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cbor2
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl.bindings import crypto_core_ed25519_is_valid_point, crypto_sign_open
from nacl.exceptions import BadSignatureError

from mesh import keys, peerkeys
from mesh.errors import MeshCode, MeshError

log = logging.getLogger(__name__)

BUNDLE_FORMAT = "ai-memory-key-history/1"
BUNDLE_SUFFIX = ".keyhistory.json"
HISTORY_SUFFIX = ".history.json"
SIGNED_TYPE = "key.history"
# A bundle is a few hundred bytes a key; these bound what an import reads and holds.
MAX_BUNDLE_BYTES = 64 * 1024
MAX_BUNDLE_KEYS = 64
RAW_KEY_BYTES = 32


@dataclass(frozen=True)
class KeyPeriod:
    """One key of an agent and when it was current: from ``valid_from`` (unix ms; None: not known) until
    ``valid_until`` (unix ms; None: it is the current key)."""

    public_key: Ed25519PublicKey
    valid_from: int | None
    valid_until: int | None

    @property
    def fingerprint(self) -> str:
        return keys.fingerprint(self.public_key)

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "valid_from": self.valid_from, "valid_until": self.valid_until}


@dataclass(frozen=True)
class KeyBundle:
    """A verified bundle: ``periods`` holds the current key first, then the retired ones, newest first."""

    agent_id: str
    issued_at: int
    periods: tuple[KeyPeriod, ...]

    @property
    def current(self) -> KeyPeriod:
        return self.periods[0]


@dataclass(frozen=True)
class PeerHistory:
    """What this node keeps of the last bundle imported for a peer."""

    current: str  # the fingerprint the bundle named current
    periods: dict[str, tuple[int | None, int | None]]  # fingerprint -> (valid_from, valid_until)

    def complete_for(self, current_fingerprint: str) -> bool:
        """The bundle is the whole history of the key trusted now (the peer has not rotated since)."""
        return self.current == current_fingerprint


@dataclass(frozen=True)
class BundleImport:
    """What ``import_bundle`` did: the current key trusted (naming the key it retired, if any), the retired keys
    it added to the keyring, and the retired keys this node holds for the agent that the bundle does not list
    (removed by their owner: delete them if they were compromised)."""

    agent_id: str
    current: peerkeys.PeerKey
    kept: tuple[str, ...]
    unlisted: tuple[str, ...]


# --------------------------------------------------------------------------- this node's own history


def own_periods(keys_dir: Path, agent_id: str) -> tuple[KeyPeriod, ...]:
    """This node's keys, the current first, then the retired ones newest first, each with its validity."""
    keys_dir = Path(keys_dir)
    ident = keys.load_identity(keys_dir, agent_id)
    ledger = _read_json(ledger_path(keys_dir, agent_id)) or {}
    ended: list[tuple[int | None, int | None, Ed25519PublicKey]] = []
    for key in keys.retired_public_keys(keys_dir, agent_id):
        fp = keys.fingerprint(key)
        found = ledger.get(fp)
        rec: dict[str, Any] = found if isinstance(found, dict) else {}
        until = _ms(rec.get("valid_until")) or _mtime_ms(keys_dir / keys.RETIRED_DIR / keys.retired_file_name(
            agent_id, fp))
        ended.append((until, _ms(rec.get("valid_from")), key))
    ended.sort(key=lambda e: e[0] or 0)
    retired: list[KeyPeriod] = []
    previous_end: int | None = None
    for until, since, key in ended:
        since = since if since is not None else previous_end
        # Times read from files can disagree (a copied home, a clock set back): an impossible start is not known.
        retired.append(KeyPeriod(key, since if since is None or until is None or since <= until else None, until))
        previous_end = until
    current_from = _mtime_ms(ident.pub_path) if ident.pub_path.exists() else previous_end
    return (KeyPeriod(ident.public_key, current_from, None), *reversed(retired))


def rotate(keys_dir: Path, agent_id: str, now_ms: int) -> tuple[keys.Identity, str]:
    """``keys.rotate_identity``, recording the retired key's validity (from when it became current until now)
    in ``keys/retired/<agent_id>.history.json``. Returns (the new identity, the retired fingerprint)."""
    began = own_periods(keys_dir, agent_id)[0].valid_from
    began = began if began is not None and began <= now_ms else None
    ident, retired = keys.rotate_identity(keys_dir, agent_id)
    # The new key's .pub time says when it became current (own_periods reads it): the same instant.
    os.utime(ident.pub_path, ns=(now_ms * 1_000_000, now_ms * 1_000_000))
    path = ledger_path(keys_dir, agent_id)
    ledger = _read_json(path) or {}
    ledger[retired] = {"valid_from": began, "valid_until": now_ms}
    try:
        _write_json(path, ledger, keys.KEYS_DIR_MODE)
    except (OSError, MeshError) as exc:  # the rotation is done; the key file's time stands in for the record
        log.warning("could not record the retired key's validity in %s: %s", path, exc)
    return ident, retired


def export_bundle(keys_dir: Path, identity: keys.Identity, out_dir: Path, now_ms: int) -> Path:
    """Write ``out_dir/<agent_id>.keyhistory.json``: this node's keys with their validity, signed by its current
    key (mode 0644; an existing file is replaced)."""
    periods = own_periods(keys_dir, identity.agent_id)
    signature = identity.private_key.sign(_signed_bytes(identity.agent_id, now_ms, periods))
    doc = {"format": BUNDLE_FORMAT, "agent_id": identity.agent_id, "issued_at": now_ms,
           "keys": [{**p.to_json(), "public_key": _b64(keys.raw_public_bytes(p.public_key))} for p in periods],
           "signature": _b64(signature)}
    out_dir = Path(out_dir)
    out_dir.mkdir(mode=keys.PEERS_DIR_MODE, parents=True, exist_ok=True)
    dest = out_dir / f"{identity.agent_id}{BUNDLE_SUFFIX}"
    keys.write_file_atomic(dest, json.dumps(doc, indent=1).encode() + b"\n", keys.PUB_MODE, replace=True)
    return dest


# --------------------------------------------------------------------------- reading and importing a bundle


def is_bundle(path: Path) -> bool:
    """``path`` holds a JSON document (a bundle) rather than a PEM key."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip()
    except OSError:
        return False
    return head.startswith(b"{")


def read_bundle(path: Path) -> KeyBundle:
    """Parse and verify a bundle file: its shape, each key (a point a generated key has, the fingerprint it
    names), one current key first, and its signature by that key. Anything else is ``key_bundle_invalid``."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise MeshError(MeshCode.KEY_MISSING, f"cannot read the key history {path}: {exc.strerror}") from None
    if len(data) > MAX_BUNDLE_BYTES:
        raise _invalid(path, f"it is over {MAX_BUNDLE_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise _invalid(path, f"it is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT:
        raise _invalid(path, f"its format is not {BUNDLE_FORMAT!r}")
    try:
        agent_id = keys.validate_agent_id(doc.get("agent_id"))
    except MeshError as exc:
        raise _invalid(path, exc.message) from None
    issued_at = _ms(doc.get("issued_at"))
    entries = doc.get("keys")
    if issued_at is None or not isinstance(entries, list) or not 1 <= len(entries) <= MAX_BUNDLE_KEYS:
        raise _invalid(path, f"it needs issued_at (unix ms) and 1..{MAX_BUNDLE_KEYS} keys")
    periods = tuple(_period(path, i, e) for i, e in enumerate(entries))
    if periods[0].valid_until is not None or any(p.valid_until is None for p in periods[1:]):
        raise _invalid(path, "its first key must be the current one (valid_until null) and only the first")
    if len({p.fingerprint for p in periods}) != len(periods):
        raise _invalid(path, "it lists a key twice")
    signature = _unb64(path, "signature", doc.get("signature"))
    try:
        crypto_sign_open(signature + _signed_bytes(agent_id, issued_at, periods),
                         keys.raw_public_bytes(periods[0].public_key))
    except (BadSignatureError, ValueError):
        raise _invalid(path, f"its signature does not verify under its current key {periods[0].fingerprint}") from None
    return KeyBundle(agent_id, issued_at, periods)


def import_bundle(peers_dir: Path, bundle: KeyBundle, now_ms: int, *, agent_id: str | None = None,
                  force: bool = False) -> BundleImport:
    """Trust ``bundle``'s keys for its agent: the retired ones into the keyring (verifying only), then the current
    one (``peerkeys.trust_peer_key``: a different key trusted so far is retired), then the record that this is the
    agent's whole history. A bundle that does not list the key trusted now for the agent is refused
    (``key_history_conflict``) unless ``force``: its owner removed that key, or it is not the owner's bundle."""
    peers_dir = Path(peers_dir)
    owner = bundle.agent_id
    if agent_id is not None and agent_id != owner:
        raise MeshError(MeshCode.KEY_BUNDLE_INVALID, f"the key history is {owner}'s, not {agent_id}'s")
    listed = {p.fingerprint for p in bundle.periods}
    ring = peerkeys.load_peer_keyrings(peers_dir).get(owner, ())
    if ring and keys.fingerprint(ring[0]) not in listed and not force:
        raise MeshError(MeshCode.KEY_HISTORY_CONFLICT,
                        f"{owner} is trusted here with key {keys.fingerprint(ring[0])}, which its key history "
                        f"(current key {bundle.current.fingerprint}) does not list: its owner removed it, or the "
                        "history is not theirs. Read the fingerprint to its operator; pass --force to trust the "
                        "history anyway (the key trusted now is then kept as retired)")
    held = {keys.fingerprint(k) for k in ring}
    kept = []
    for p in bundle.periods[1:]:
        if p.fingerprint not in held:
            peerkeys.keep_retired(peers_dir, owner, p.public_key)
            kept.append(p.fingerprint)
    current = peerkeys.trust_peer_key(peers_dir, owner, bundle.current.public_key, force=force)
    _write_json(history_path(peers_dir, owner), {
        "current": bundle.current.fingerprint, "issued_at": bundle.issued_at, "imported_at": now_ms,
        "keys": {p.fingerprint: {"valid_from": p.valid_from, "valid_until": p.valid_until} for p in bundle.periods}},
        keys.PEERS_DIR_MODE)
    unlisted = tuple(sorted(held - listed))
    return BundleImport(owner, current, tuple(kept), unlisted)


def peer_histories(peers_dir: Path) -> dict[str, PeerHistory]:
    """Every peer's imported history record (``peers/retired/<agent_id>.history.json``). A record writable by
    group or others, or unreadable, is skipped and logged: it could make a forgery look like an unknown key."""
    retired_dir = Path(peers_dir) / keys.RETIRED_DIR
    try:
        names = sorted(n for n in os.listdir(retired_dir) if n.endswith(HISTORY_SUFFIX) and not n.startswith("."))
    except FileNotFoundError:
        return {}
    loose = _loose(retired_dir) or _loose(retired_dir.parent)
    out: dict[str, PeerHistory] = {}
    for name in names:
        path = retired_dir / name
        if loose or _loose(path):
            log.warning("skipping key history record %s: it or its directory is writable by group or others; "
                        "run: chmod go-w %s", path, path)
            continue
        doc = _read_json(path)
        periods = doc.get("keys") if doc else None
        if not doc or not isinstance(doc.get("current"), str) or not isinstance(periods, dict):
            log.warning("skipping key history record %s: not a record `identity import` wrote", path)
            continue
        out[name[: -len(HISTORY_SUFFIX)]] = PeerHistory(doc["current"], {
            fp: (_ms(v.get("valid_from")), _ms(v.get("valid_until")))
            for fp, v in periods.items() if isinstance(v, dict)})
    return out


def trusted_since_ms(peers_dir: Path, agent_id: str) -> int | None:
    """When this node began trusting ``agent_id``'s current key: its ``.pub`` file's time (``identity import``
    writes it when the key changes). None when there is no such file."""
    return _mtime_ms(Path(peers_dir) / f"{agent_id}{keys.PUB_SUFFIX}")


def ledger_path(keys_dir: Path, agent_id: str) -> Path:
    return Path(keys_dir) / keys.RETIRED_DIR / f"{keys.validate_agent_id(agent_id)}{HISTORY_SUFFIX}"


def history_path(peers_dir: Path, agent_id: str) -> Path:
    return Path(peers_dir) / keys.RETIRED_DIR / f"{keys.validate_agent_id(agent_id)}{HISTORY_SUFFIX}"


# --------------------------------------------------------------------------- helpers


def _signed_bytes(agent_id: str, issued_at: int, periods: tuple[KeyPeriod, ...]) -> bytes:
    body = {"type": SIGNED_TYPE, "agent_id": agent_id, "issued_at": issued_at,
            "keys": [[keys.raw_public_bytes(p.public_key), p.valid_from, p.valid_until] for p in periods]}
    return cbor2.dumps(body, canonical=True)


def _period(path: Path, i: int, entry: Any) -> KeyPeriod:
    if not isinstance(entry, dict):
        raise _invalid(path, f"keys[{i}] is not an object")
    raw = _unb64(path, f"keys[{i}].public_key", entry.get("public_key"))
    if len(raw) != RAW_KEY_BYTES or not crypto_core_ed25519_is_valid_point(raw):
        raise _invalid(path, f"keys[{i}] is not an Ed25519 key a key pair has")
    key = Ed25519PublicKey.from_public_bytes(raw)
    since, until = entry.get("valid_from"), entry.get("valid_until")
    period = KeyPeriod(key, _ms(since), _ms(until))
    if (since is not None and period.valid_from is None) or (until is not None and period.valid_until is None) \
            or (period.valid_from is not None and period.valid_until is not None
                and period.valid_from > period.valid_until):
        raise _invalid(path, f"keys[{i}] has a validity that is not null or 0 <= valid_from <= valid_until (ms)")
    if entry.get("fingerprint") != period.fingerprint:
        raise _invalid(path, f"keys[{i}] is key {period.fingerprint}, not the {entry.get('fingerprint')!r} it names")
    return period


def _invalid(path: Path, why: str) -> MeshError:
    return MeshError(MeshCode.KEY_BUNDLE_INVALID,
                     f"{path} is not a key history `identity export-pub --with-retired` wrote: {why}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(path: Path, what: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise _invalid(path, f"{what} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(path, f"{what} is not base64") from None


def _ms(value: Any) -> int | None:
    """A unix-ms time as stored (a non-negative int), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else None


def _mtime_ms(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns // 1_000_000
    except OSError:
        return None


def _loose(path: Path) -> bool:
    try:
        return bool(os.stat(path).st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    except OSError:
        return False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(Path(path).read_bytes()[:MAX_BUNDLE_BYTES])
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _write_json(path: Path, doc: dict[str, Any], dir_mode: int) -> None:
    path.parent.mkdir(mode=dir_mode, parents=True, exist_ok=True)
    keys.write_file_atomic(path, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n", keys.PUB_MODE,
                           replace=True)
