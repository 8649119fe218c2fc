"""pending_actions: operations parked by an ``ask`` until a person approves, denies, or they expire.

A row goes from ``pending`` to exactly one of ``applied`` (approved and written, in the write's own
transaction), ``denied``, ``expired`` or ``failed`` (approved, but the write itself was refused). Every
transition is a conditional UPDATE on ``status = 'pending'``, so nothing is decided or applied twice.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

# Ids per IN list in get_many (SQLite's default bound on parameters is far above it).
GET_MANY_CHUNK = 500
_COLUMNS = ("id, agent, operation, namespace, call, prompt, options, default_choice, asked_by, status, "
            "created_at, expires_at, decided_at, decided_by, result")


@dataclass(frozen=True, kw_only=True, slots=True)
class ActionRow:
    id: str
    agent: str
    operation: str
    namespace: str
    call: dict[str, Any]   # {"method": service method, "args": {...}}
    prompt: str
    options: tuple[str, ...]
    default_choice: str
    asked_by: str
    status: str
    created_at: int        # unix ms
    expires_at: int
    decided_at: int | None
    decided_by: str | None
    result: Any


def _row(r: tuple[Any, ...]) -> ActionRow:
    return ActionRow(id=r[0], agent=r[1], operation=r[2], namespace=r[3], call=json.loads(r[4]), prompt=r[5],
                     options=tuple(json.loads(r[6])), default_choice=r[7], asked_by=r[8], status=r[9],
                     created_at=r[10], expires_at=r[11], decided_at=r[12], decided_by=r[13],
                     result=None if r[14] is None else json.loads(r[14]))


def insert(conn: sqlite3.Connection, row: ActionRow) -> None:
    conn.execute(f"INSERT INTO pending_actions ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                 (row.id, row.agent, row.operation, row.namespace, json.dumps(row.call), row.prompt,
                  json.dumps(list(row.options)), row.default_choice, row.asked_by, row.status, row.created_at,
                  row.expires_at, row.decided_at, row.decided_by,
                  None if row.result is None else json.dumps(row.result)))


def get(conn: sqlite3.Connection, action_id: str) -> ActionRow | None:
    r = conn.execute(f"SELECT {_COLUMNS} FROM pending_actions WHERE id = ?", (action_id,)).fetchone()
    return _row(r) if r else None


def list_(conn: sqlite3.Connection, status: str | None, limit: int) -> list[ActionRow]:
    if status is None:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM pending_actions ORDER BY created_at DESC LIMIT ?", (limit,))
    else:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM pending_actions WHERE status = ? ORDER BY created_at LIMIT ?",
                            (status, limit))
    return [_row(r) for r in rows]


def settle(conn: sqlite3.Connection, action_id: str, status: str, now_ms: int, decided_by: str,
           result: Any = None) -> bool:
    """Move a still-pending, unexpired action to ``status``; False when it was not (anymore) pending."""
    cur = conn.execute("UPDATE pending_actions SET status = ?, decided_at = ?, decided_by = ?, result = ? "
                       "WHERE id = ? AND status = 'pending' AND expires_at > ?",
                       (status, now_ms, decided_by, None if result is None else json.dumps(result), action_id,
                        now_ms))
    return cur.rowcount > 0


def set_result(conn: sqlite3.Connection, action_id: str, result: Any) -> None:
    conn.execute("UPDATE pending_actions SET result = ? WHERE id = ?", (json.dumps(result), action_id))


def mark_failed(conn: sqlite3.Connection, action_id: str, now_ms: int, decided_by: str, error: Any) -> bool:
    return settle(conn, action_id, "failed", now_ms, decided_by, error)


def expire_due(conn: sqlite3.Connection, now_ms: int) -> list[ActionRow]:
    """Expire every pending action whose time is up; returns them (as they were)."""
    due = [_row(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM pending_actions WHERE status = 'pending' "
                                         "AND expires_at <= ?", (now_ms,))]
    conn.execute("UPDATE pending_actions SET status = 'expired', decided_at = ?, decided_by = 'sweeper' "
                 "WHERE status = 'pending' AND expires_at <= ?", (now_ms, now_ms))
    return due


@dataclass(frozen=True, slots=True)
class Mark:
    """What the approval feed needs to know of an action to tell whether it has news (node/permissions/feed.py)."""

    id: str
    status: str
    expires_at: int
    decided_at: int | None
    has_result: bool


def recent(conn: sqlite3.Connection, since_ms: int, limit: int) -> list[Mark]:
    """The actions whose expiry is at or after ``since_ms``, latest expiry first: every pending one not yet swept,
    and every one decided since then (a decision comes before the expiry; the sweeper's within its interval
    after it). A range on the (status, expires_at) index: its cost follows recent activity, not the table."""
    rows = conn.execute("SELECT id, status, expires_at, decided_at, CASE WHEN result IS NULL THEN 0 ELSE 1 END "
                        "FROM pending_actions WHERE status IN ('pending','applied','denied','expired','failed') "
                        "AND expires_at >= ? ORDER BY expires_at DESC LIMIT ?", (since_ms, limit))
    return [Mark(id=r[0], status=r[1], expires_at=r[2], decided_at=r[3], has_result=bool(r[4])) for r in rows]


def get_many(conn: sqlite3.Connection, ids: list[str]) -> list[ActionRow]:
    """The actions named (those that exist), read in chunks of GET_MANY_CHUNK ids."""
    out: list[ActionRow] = []
    for i in range(0, len(ids), GET_MANY_CHUNK):
        chunk = ids[i:i + GET_MANY_CHUNK]
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT {_COLUMNS} FROM pending_actions WHERE id IN ({marks})"
        out.extend(_row(r) for r in conn.execute(sql, chunk))
    return out
