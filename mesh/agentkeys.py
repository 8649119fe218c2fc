"""Agent key files: one Ed25519 keypair per agent of this node, and the bearer token that names an agent over the
streamable HTTP door.

Layout, under the node's ``<home>/keys`` (0700):

- ``agents/<agent_id>.priv`` (PKCS#8 PEM, 0600) and ``agents/<agent_id>.pub`` (0644): the agent's keypair, made on
  its first use (``ensure_agent_key``); a directory of its own so the node's single ``keys/*.priv`` stays one.
- ``agents/<agent_id>.token`` (0600): 32 random bytes in hex, made by ``ai-memory agents token``; an HTTP request
  carrying ``Authorization: Bearer <token>`` acts as that agent.

Every file follows the key-file rule of ``mesh.keys``: a private file readable by group or others is refused
(``key_file_mode``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from mesh import keys
from mesh.errors import MeshCode, MeshError

AGENTS_DIR = "agents"
TOKEN_SUFFIX = ".token"
TOKEN_BYTES = 32


def agents_dir(keys_dir: Path) -> Path:
    """Where this node's agents' key files live."""
    return Path(keys_dir) / AGENTS_DIR


def ensure_agent_key(keys_dir: Path, agent_id: str) -> keys.Identity:
    """The agent's keypair, made now (0600 / 0644) when it has none yet; a second maker racing this one loads the
    pair the first wrote."""
    directory = agents_dir(keys_dir)
    try:
        return keys.load_identity(directory, agent_id)
    except MeshError as e:
        if e.code != MeshCode.NO_IDENTITY:
            raise
    try:
        return keys.generate_identity(directory, agent_id)
    except MeshError as e:
        if e.code != MeshCode.IDENTITY_EXISTS:
            raise
        return keys.load_identity(directory, agent_id)


def destroy_agent_key(keys_dir: Path, agent_id: str) -> bool:
    """Remove the agent's keypair and token (a revoked key signs nothing more); True when there was one."""
    directory = agents_dir(keys_dir)
    keys.validate_agent_id(agent_id)
    found = False
    for suffix in (keys.PRIV_SUFFIX, keys.PUB_SUFFIX, TOKEN_SUFFIX):
        path = directory / f"{agent_id}{suffix}"
        if path.exists():
            path.unlink()
            found = True
    return found


@dataclass(frozen=True)
class AgentKey:
    """One row of the agents in ``ai-memory identity list``."""

    agent_id: str
    fingerprint: str
    path: Path
    has_token: bool


def list_agent_keys(keys_dir: Path) -> list[AgentKey]:
    """This node's agents that have a keypair, by agent id (unreadable ones left out)."""
    directory = agents_dir(keys_dir)
    if not directory.is_dir():
        return []
    out = []
    for priv in sorted(directory.glob(f"*{keys.PRIV_SUFFIX}")):
        agent_id = priv.name[: -len(keys.PRIV_SUFFIX)]
        try:
            ident = keys.load_identity(directory, agent_id)
        except MeshError:
            continue
        out.append(AgentKey(agent_id, ident.fingerprint, priv,
                            (directory / f"{agent_id}{TOKEN_SUFFIX}").exists()))
    return out


def agent_token(keys_dir: Path, agent_id: str, *, create: bool) -> str | None:
    """The agent's HTTP bearer token; with ``create`` a new one replaces any before it (0600). None when it has
    none and ``create`` is false."""
    keys.validate_agent_id(agent_id)
    path = agents_dir(keys_dir) / f"{agent_id}{TOKEN_SUFFIX}"
    if create:
        Path(keys_dir).mkdir(mode=keys.KEYS_DIR_MODE, exist_ok=True)
        agents_dir(keys_dir).mkdir(mode=keys.KEYS_DIR_MODE, exist_ok=True)
        token = secrets.token_hex(TOKEN_BYTES)
        keys.write_file_atomic(path, token.encode() + b"\n", keys.PRIV_MODE, replace=True)
        return token
    if not path.exists():
        return None
    return _read_token(path)


def _read_token(path: Path) -> str:
    st = os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise MeshError(MeshCode.KEY_FILE_MODE, f"{path} is readable or writable by group or others "
                                                f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
    return path.read_text(encoding="ascii").strip()


def token_digest(token: str) -> bytes:
    """What tokens are compared by (SHA-256), so a lookup never compares the secret itself byte by byte."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class AgentTokens:
    """The bearer tokens of this node's agents, read again whenever ``agents/`` changes (a new token counts on a
    running node at once; a removed one stops counting)."""

    def __init__(self, keys_dir: Path) -> None:
        self.directory = agents_dir(keys_dir)
        self._stamp: tuple[int, int] | None = None
        self._by_digest: dict[bytes, str] = {}

    def agent_of(self, token: str) -> str | None:
        """The agent ``token`` names, or None when it names none."""
        self._reload()
        wanted = token_digest(token)
        for digest, agent in self._by_digest.items():
            if hmac.compare_digest(digest, wanted):
                return agent
        return None

    def _reload(self) -> None:
        try:
            st = os.stat(self.directory)
        except FileNotFoundError:
            self._stamp, self._by_digest = None, {}
            return
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        found: dict[bytes, str] = {}
        for path in sorted(self.directory.glob(f"*{TOKEN_SUFFIX}")):
            try:
                found[token_digest(_read_token(path))] = path.name[: -len(TOKEN_SUFFIX)]
            except (OSError, UnicodeDecodeError, MeshError):
                continue  # an unreadable or exposed token names nobody
        self._by_digest = found
