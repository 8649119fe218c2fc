"""agent_delegations and agent_revocations (migration 11): the signed records by which a node vouches for its
agents, and ends that, each kept as received. Sync functions taking ``conn`` first."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from storage.rows import Row

_DELEGATION_COLUMNS = ("delegation_id, agent_id, agent_key, issuer, valid_from, valid_until, signature, "
                       "attest_level, received_from, created_at")
_REVOCATION_COLUMNS = ("revocation_id, delegation_id, agent_id, issuer, revoked_at, signature, attest_level, "
                       "received_from, created_at")


@dataclass(frozen=True, kw_only=True, slots=True)
class DelegationRow:
    delegation_id: str          # hex sha256 of the canonical record
    agent_id: str
    agent_key: bytes            # the agent's raw 32-byte Ed25519 public key
    issuer: str                 # the node that signed it
    valid_from: int             # unix ms
    valid_until: int            # unix ms (exclusive)
    signature: bytes            # Ed25519 by the issuer
    attest_level: str           # self_signed (this node issued it) | peer_attested
    received_from: str | None   # the peer it came from (None: issued here)
    created_at: int             # unix ms, when stored here


@dataclass(frozen=True, kw_only=True, slots=True)
class RevocationRow:
    revocation_id: str
    delegation_id: str
    agent_id: str
    issuer: str
    revoked_at: int             # unix ms: what the agent signed at or after it is refused
    signature: bytes
    attest_level: str
    received_from: str | None
    created_at: int


def _delegation(r: Row) -> DelegationRow:
    return DelegationRow(delegation_id=r[0], agent_id=r[1], agent_key=bytes(r[2]), issuer=r[3], valid_from=r[4],
                         valid_until=r[5], signature=bytes(r[6]), attest_level=r[7], received_from=r[8],
                         created_at=r[9])


def _revocation(r: Row) -> RevocationRow:
    return RevocationRow(revocation_id=r[0], delegation_id=r[1], agent_id=r[2], issuer=r[3], revoked_at=r[4],
                         signature=bytes(r[5]), attest_level=r[6], received_from=r[7], created_at=r[8])


def insert_delegation(conn: sqlite3.Connection, row: DelegationRow) -> bool:
    """Store a delegation; False (nothing written) when its id is stored already."""
    cur = conn.execute(f"INSERT INTO agent_delegations ({_DELEGATION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?) "
                       "ON CONFLICT (delegation_id) DO NOTHING",
                       (row.delegation_id, row.agent_id, row.agent_key, row.issuer, row.valid_from, row.valid_until,
                        row.signature, row.attest_level, row.received_from, row.created_at))
    return cur.rowcount == 1


def insert_revocation(conn: sqlite3.Connection, row: RevocationRow) -> bool:
    """Store a revocation; False (nothing written) when its id is stored already."""
    cur = conn.execute(f"INSERT INTO agent_revocations ({_REVOCATION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?) "
                       "ON CONFLICT (revocation_id) DO NOTHING",
                       (row.revocation_id, row.delegation_id, row.agent_id, row.issuer, row.revoked_at,
                        row.signature, row.attest_level, row.received_from, row.created_at))
    return cur.rowcount == 1


def get_delegation(conn: sqlite3.Connection, delegation_id: str) -> DelegationRow | None:
    r = conn.execute(f"SELECT {_DELEGATION_COLUMNS} FROM agent_delegations WHERE delegation_id = ?",
                     (delegation_id,)).fetchone()
    return _delegation(r) if r else None


def get_revocation(conn: sqlite3.Connection, revocation_id: str) -> RevocationRow | None:
    r = conn.execute(f"SELECT {_REVOCATION_COLUMNS} FROM agent_revocations WHERE revocation_id = ?",
                     (revocation_id,)).fetchone()
    return _revocation(r) if r else None


def delegations_of(conn: sqlite3.Connection, agent_id: str) -> list[DelegationRow]:
    """Every delegation stored for ``agent_id``, oldest first."""
    return [_delegation(r) for r in conn.execute(
        f"SELECT {_DELEGATION_COLUMNS} FROM agent_delegations WHERE agent_id = ? ORDER BY valid_from, delegation_id",
        (agent_id,))]


def delegations_by(conn: sqlite3.Connection, issuer: str, limit: int) -> list[DelegationRow]:
    """The delegations ``issuer`` signed, newest first, at most ``limit``."""
    return [_delegation(r) for r in conn.execute(
        f"SELECT {_DELEGATION_COLUMNS} FROM agent_delegations WHERE issuer = ? "
        "ORDER BY valid_from DESC, delegation_id LIMIT ?", (issuer, limit))]


def revoked_at(conn: sqlite3.Connection, delegation_id: str) -> int | None:
    """The earliest ``revoked_at`` of the revocations of a delegation by its own issuer, None when none is stored."""
    return revoked_many(conn, [delegation_id]).get(delegation_id)


def revoked_many(conn: sqlite3.Connection, delegation_ids: Sequence[str]) -> dict[str, int]:
    """``revoked_at`` of each of ``delegation_ids`` that has a revocation stored by the delegation's own issuer (a
    revocation kept before its delegation arrived counts only once that delegation shows the same issuer)."""
    if not delegation_ids:
        return {}
    marks = ",".join("?" * len(delegation_ids))
    return {r[0]: int(r[1]) for r in conn.execute(
        "SELECT r.delegation_id, min(r.revoked_at) FROM agent_revocations r JOIN agent_delegations d "
        "ON d.delegation_id = r.delegation_id AND d.issuer = r.issuer AND d.agent_id = r.agent_id "
        f"WHERE r.delegation_id IN ({marks}) GROUP BY r.delegation_id", tuple(delegation_ids))}


def stamp(conn: sqlite3.Connection) -> tuple[int, int]:
    """(delegations, revocations) stored: changes whenever either table gains a row (from any process)."""
    d = conn.execute("SELECT count(*) FROM agent_delegations").fetchone()[0]
    v = conn.execute("SELECT count(*) FROM agent_revocations").fetchone()[0]
    return int(d), int(v)


def agents_issued_by(conn: sqlite3.Connection, issuer: str) -> list[str]:
    """The agent ids ``issuer`` signed a delegation for, sorted."""
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT agent_id FROM agent_delegations WHERE issuer = ? ORDER BY agent_id", (issuer,))]


def memories_by_writer(conn: sqlite3.Connection, writers: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(memories, content + title bytes) whose current version each of ``writers`` wrote (those with none left
    out)."""
    if not writers:
        return {}
    size = ("octet_length(content) + octet_length(title)" if getattr(conn, "dialect", "sqlite") == "postgres"
            else "length(CAST(content AS BLOB)) + length(CAST(title AS BLOB))")
    marks = ",".join("?" * len(writers))
    return {r[0]: (int(r[1]), int(r[2])) for r in conn.execute(
        f"SELECT writer, count(*), coalesce(sum({size}), 0) FROM memories WHERE writer IN ({marks}) GROUP BY writer",
        tuple(writers))}
