"""permission_rules: permission rules added at run time (the rules file's are not stored here)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

_COLUMNS = "id, agent, namespace, operations, action, inherit, created_by, created_at"


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleRow:
    id: int
    agent: str
    namespace: str
    operations: tuple[str, ...]
    action: str
    inherit: bool
    created_by: str
    created_at: int   # unix ms


def _row(r: tuple[Any, ...]) -> RuleRow:
    return RuleRow(id=r[0], agent=r[1], namespace=r[2], operations=tuple(json.loads(r[3])), action=r[4],
                   inherit=bool(r[5]), created_by=r[6], created_at=r[7])


def insert(conn: sqlite3.Connection, agent: str, namespace: str, operations: list[str], action: str,
           inherit: bool, created_by: str, created_at: int) -> int:
    cur = conn.execute(f"INSERT INTO permission_rules ({_COLUMNS}) VALUES (NULL,?,?,?,?,?,?,?)",
                       (agent, namespace, json.dumps(sorted(operations)), action, int(inherit), created_by,
                        created_at))
    return int(cur.lastrowid or 0)


def all_rules(conn: sqlite3.Connection) -> list[RuleRow]:
    return [_row(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM permission_rules ORDER BY id")]


def stamp(conn: sqlite3.Connection) -> tuple[int, int]:
    """(count, highest id): changes whenever a rule is added or removed."""
    count, top = conn.execute("SELECT count(*), coalesce(max(id), 0) FROM permission_rules").fetchone()
    return int(count), int(top)


def bytes_by_writer(conn: sqlite3.Connection, agent: str) -> int:
    """Content + title bytes (UTF-8) of the memories whose current version ``agent`` wrote."""
    if getattr(conn, "dialect", "sqlite") != "postgres":
        # Kept by migration 20's triggers: one row, however many memories.
        row = conn.execute("SELECT bytes FROM writer_bytes WHERE writer = ?", (agent,)).fetchone()
        return int(row[0]) if row else 0
    # Postgres has no BLOB type (and a text-to-bytea cast reads backslash escapes): octet_length counts bytes.
    return int(conn.execute("SELECT coalesce(sum(octet_length(content) + octet_length(title)), 0) FROM memories "
                            "WHERE writer = ?",
                            (agent,)).fetchone()[0])
