"""subscriptions and subscription_deliveries: webhook targets and the events queued for each."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

_DELIVERY = ("d.id, d.subscription_id, s.url, s.secret, d.event, d.body, d.attempts, d.next_attempt_at, d.status, "
             "d.last_error, d.created_at, d.delivered_at")


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    id: int
    subscription_id: int
    url: str
    secret: str
    event: str
    body: bytes
    attempts: int
    next_attempt_at: int   # unix ms
    status: str
    last_error: str | None
    created_at: int
    delivered_at: int | None


def _delivery(r: tuple[Any, ...]) -> Delivery:
    return Delivery(id=r[0], subscription_id=r[1], url=r[2], secret=r[3], event=r[4], body=bytes(r[5]),
                    attempts=r[6], next_attempt_at=r[7], status=r[8], last_error=r[9], created_at=r[10],
                    delivered_at=r[11])


def add(conn: sqlite3.Connection, url: str, events: list[str], secret: str, now_ms: int) -> int:
    cur = conn.execute("INSERT INTO subscriptions (url, events, secret, created_at) VALUES (?,?,?,?)",
                       (url, json.dumps(sorted(events)), secret, now_ms))
    return int(cur.lastrowid or 0)


def list_(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    return [{"id": r[0], "url": r[1], "events": json.loads(r[2]), "created_at": r[3]}
            for r in conn.execute("SELECT id, url, events, created_at FROM subscriptions ORDER BY id")]


def enqueue(conn: sqlite3.Connection, event: str, body: bytes, now_ms: int) -> int:
    """One delivery per subscription to ``event`` (or to ``*``); returns how many."""
    n = 0
    for sid, events in conn.execute("SELECT id, events FROM subscriptions").fetchall():
        wanted = json.loads(events)
        if event in wanted or "*" in wanted:
            conn.execute("INSERT INTO subscription_deliveries (subscription_id, event, body, next_attempt_at, "
                         "status, created_at) VALUES (?,?,?,?,'pending',?)", (sid, event, body, now_ms, now_ms))
            n += 1
    return n


def due(conn: sqlite3.Connection, now_ms: int, limit: int) -> list[Delivery]:
    rows = conn.execute(f"SELECT {_DELIVERY} FROM subscription_deliveries d JOIN subscriptions s "
                        "ON s.id = d.subscription_id WHERE d.status = 'pending' AND d.next_attempt_at <= ? "
                        "ORDER BY d.next_attempt_at, d.id LIMIT ?", (now_ms, limit))
    return [_delivery(r) for r in rows]


def deliveries(conn: sqlite3.Connection, status: str | None, limit: int) -> list[Delivery]:
    where = "" if status is None else "WHERE d.status = ?"
    rows = conn.execute(f"SELECT {_DELIVERY} FROM subscription_deliveries d JOIN subscriptions s "
                        f"ON s.id = d.subscription_id {where} ORDER BY d.id LIMIT ?",
                        (*(() if status is None else (status,)), limit))
    return [_delivery(r) for r in rows]


def delivered(conn: sqlite3.Connection, delivery_id: int, attempts: int, now_ms: int) -> None:
    conn.execute("UPDATE subscription_deliveries SET status = 'delivered', attempts = ?, delivered_at = ?, "
                 "last_error = NULL WHERE id = ?", (attempts, now_ms, delivery_id))


def failed(conn: sqlite3.Connection, delivery_id: int, attempts: int, next_attempt_at: int | None,
           error: str) -> None:
    """Record a failed attempt: retry at ``next_attempt_at``, or dead-letter when it is None."""
    if next_attempt_at is None:
        conn.execute("UPDATE subscription_deliveries SET status = 'dead', attempts = ?, last_error = ? WHERE id = ?",
                     (attempts, error, delivery_id))
    else:
        conn.execute("UPDATE subscription_deliveries SET attempts = ?, next_attempt_at = ?, last_error = ? "
                     "WHERE id = ?", (attempts, next_attempt_at, error, delivery_id))


def replay(conn: sqlite3.Connection, delivery_id: int, now_ms: int) -> bool:
    """A dead delivery back to pending, due now with attempts reset; False when it is not dead."""
    cur = conn.execute("UPDATE subscription_deliveries SET status = 'pending', attempts = 0, next_attempt_at = ? "
                       "WHERE id = ? AND status = 'dead'", (now_ms, delivery_id))
    return cur.rowcount > 0
