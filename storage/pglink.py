"""Postgres going away and coming back.

- Which errors mean the server is away (``is_lost``): a lost connection, a shutdown or crash, a server still
  starting, a standby that takes no writes. They reach the table modules as ``EngineError(storage_unavailable)``
  (and a full disk as ``storage_full``), so every caller gets a retryable code, never a traceback.
- The DSN as it may be shown (``redact``): libpq's own parsing, the password replaced by ``***``. Every message
  and log line that names the database uses it.
- The outage as the store's health holds it (``Outage``): begun once where it is found (a reader or the writer),
  ended once by the writer when it has a working connection again; each logged once (``storage_unavailable``,
  ``storage_available`` with how long it lasted), never once per retry.
- The writer's way back (``Reconnect``): while the server is away, at most one connection attempt per backoff
  delay (RECONNECT_MIN_S doubling to RECONNECT_MAX_S), so a write meanwhile fails at once; and each batch's
  marker (``am_commits``, ``batch_committed``), by which a COMMIT whose answer was lost with its connection is
  settled once the server answers again: its callers are told it was stored only if it was.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import conninfo

from base.errors import ProjectError
from storage.errors import EngineError, StorageCode
from storage.health import Health

log = logging.getLogger("storage.pg")

# The writer's reconnect backoff while the server is away: the first attempt at once, then doubling to the cap
# (the node is ready again at most RECONNECT_MAX_S after the server answers).
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 0.5
# An idle writer looks at its connection this often (one empty query): a server gone while it idles, or found
# away by a reader, is seen (and its return) without waiting for a write.
IDLE_CHECK_S = 1.0
# How long the callers of a batch whose COMMIT lost its answer wait for the server to say whether it was stored (a
# restart or a promotion takes seconds); past it they are told that it is not known. Other writes meanwhile are
# answered as ever (refused at once while the server is away).
IN_DOUBT_WAIT_S = 30.0
# SQLSTATEs that mean the server is away (beside class 08, connection exceptions): admin_shutdown,
# crash_shutdown, cannot_connect_now (starting up, shutting down).
_LOST_STATES = frozenset({"57P01", "57P02", "57P03"})
# read_only_sql_transaction met by a writer: the server is a standby (the connection is dropped so that the next
# one finds the primary). A reader's transactions are read-only on purpose.
_STANDBY_STATE = "25006"
_FULL_STATES = frozenset({"53100"})  # disk_full
# The batch marker table: one row per writer (process), its last committed batch number.
COMMITS_TABLE = "am_commits"
# Markers of writers gone this long are removed when a writer opens.
MARKER_KEEP = "1 day"
# A write transaction's first statement: this writer's batch number recorded, and the write lock (parameters:
# the writer, the batch, the lock key). A data-modifying WITH runs whatever the SELECT makes of its row.
LOCK_AND_MARK = (f"WITH mark AS (INSERT INTO {COMMITS_TABLE} (writer, batch, at) VALUES (%s, %s, now()) "
                 "ON CONFLICT (writer) DO UPDATE SET batch = EXCLUDED.batch, at = EXCLUDED.at RETURNING 1) "
                 "SELECT pg_advisory_xact_lock(%s) FROM mark")


def redact(dsn: str) -> str:
    """``dsn`` as it may be shown: every parameter but the password (``***``); a DSN libpq cannot parse is not
    shown at all (its parse error would quote it)."""
    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<a DSN libpq cannot parse>"
    if "password" in parts:
        parts["password"] = "***"
    return conninfo.make_conninfo("", **parts)


def scrub(text: str, dsn: str) -> str:
    """``text`` with the DSN's password (should a server or driver message ever echo it) replaced by ``***``."""
    try:
        password = conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        return "<a message about a DSN libpq cannot parse>"
    return text.replace(str(password), "***") if password else text


def is_lost(e: BaseException, raw: psycopg.Connection[Any] | None = None, *, writing: bool = False) -> bool:
    """Whether ``e`` (met on ``raw``, by the writer when ``writing``) means the server is away rather than that the
    statement was wrong."""
    if not isinstance(e, psycopg.Error):
        return False
    state = e.sqlstate or ""
    if (raw is not None and raw.closed) or state.startswith("08") or state in _LOST_STATES:
        return True
    if state:
        return writing and state == _STANDBY_STATE
    # No SQLSTATE: the driver's own connection trouble (closed, bad, no answer) or the pool's timeout.
    return isinstance(e, psycopg.OperationalError) and not state


def engine_error(e: psycopg.Error, raw: psycopg.Connection[Any] | None, dsn: str, *,
                 writing: bool = False) -> EngineError | None:
    """The EngineError for a server away (the connection is closed, so the next use opens a fresh one) or a full
    disk; None for anything else."""
    if is_lost(e, raw, writing=writing):
        if raw is not None and not raw.closed:
            raw.close()
        return EngineError(StorageCode.STORAGE_UNAVAILABLE, f"postgres at {redact(dsn)} went away: "
                                                            f"{scrub(one_line(e), dsn)}; retry")
    if (e.sqlstate or "") in _FULL_STATES:
        return EngineError(StorageCode.STORAGE_FULL, f"postgres at {redact(dsn)} has no space left: "
                                                     f"{scrub(one_line(e), dsn)}; retry once space is freed")
    return None


def one_line(e: BaseException | str) -> str:
    """``e``'s message on one line (libpq adds its hint on a second: "Is the server running ...?")."""
    text = e if isinstance(e, str) else e.message if isinstance(e, ProjectError) else str(e)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or type(e).__name__


class Outage:
    """The server being away, held in the store's ``health`` as ``storage_unavailable``: begun where it is found,
    ended by the writer once it has a working connection; the change logged once each way."""

    def __init__(self, health: Health, dsn: str) -> None:
        self.health = health
        self.dsn = dsn
        self.shown = redact(dsn)
        # time.monotonic() when the last outage ended: a read that began before it says nothing of now.
        self._ended_at = 0.0

    @property
    def away(self) -> bool:
        return StorageCode.STORAGE_UNAVAILABLE in self.health

    def begin(self, cause: BaseException | str, seen_since: float = 0.0) -> None:
        """The server is away (``cause``: the error that showed it, met by work begun at ``seen_since``,
        time.monotonic(); work begun before the last outage ended tells nothing new); logged when it is new."""
        if seen_since and seen_since < self._ended_at:
            return
        text = scrub(one_line(cause), self.dsn)
        message = (f"postgres at {self.shown} is not answering ({text}); writes and reads fail with "
                   f"storage_unavailable until it answers again, and the node reconnects on its own")
        if self.health.set(StorageCode.STORAGE_UNAVAILABLE, message):
            log.warning("storage_unavailable", extra={"ev": {"dsn": self.shown, "error": text}, "state_change": True})

    def end(self) -> None:
        """The writer has a working connection again; logged when an outage was in force."""
        ended = self.health.clear(StorageCode.STORAGE_UNAVAILABLE)
        if ended is not None:
            self._ended_at = time.monotonic()
            log.info("storage_available", extra={"ev": {"dsn": self.shown,
                                                        "down_s": round(time.monotonic() - ended.since, 3)}})

    def unavailable(self, what: str) -> EngineError:
        """The error a write or read gets while the outage is in force (``what``: whose)."""
        return EngineError(StorageCode.STORAGE_UNAVAILABLE, f"{what}: postgres at {self.shown} is not answering; "
                                                            "retry once it is back")


class Reconnect:
    """The writer's connection attempts across an outage: ``open_raw`` (connect, check, prepare the session) at
    most once per backoff delay while the server is away; the outage begun on a failed attempt, ended on a good
    one. Also the writer's batch markers, by which a COMMIT whose answer was lost is settled."""

    def __init__(self, open_raw: Callable[[], psycopg.Connection[Any]], outage: Outage) -> None:
        self._open_raw = open_raw
        self.outage = outage
        self._failures = 0
        self._next_at = 0.0
        # This writer's name in am_commits, and its last batch number.
        self.writer = uuid.uuid4().hex
        self._batch = 0

    def due(self) -> bool:
        return time.monotonic() >= self._next_at

    def wait_s(self) -> float:
        """Seconds until the next attempt may be made (0 when it may be made now)."""
        return max(0.0, self._next_at - time.monotonic())

    def open(self) -> psycopg.Connection[Any]:
        """One attempt now: the new connection (the outage, if any, ended), or EngineError storage_unavailable
        (the outage begun or going on, the next attempt after the backoff)."""
        try:
            raw = self._open_raw()
        except Exception as e:  # no connection, a schema guard refusal, any psycopg error: the server is not usable
            self._failures += 1
            self._next_at = time.monotonic() + min(RECONNECT_MAX_S, RECONNECT_MIN_S * 2.0 ** (self._failures - 1))
            self.outage.begin(e)
            raise self.outage.unavailable("this write (not stored)") from None
        self._failures = 0
        self._next_at = 0.0
        self.outage.end()
        return raw

    def next_batch(self) -> int:
        """The number of the writer's next batch (its marker: ``LOCK_AND_MARK``)."""
        self._batch += 1
        return self._batch


def batch_committed(raw: psycopg.Connection[Any], writer: str, batch: int) -> bool:
    """Whether ``writer``'s batch ``batch`` was committed (its marker, or a later one: a writer commits in order)."""
    row = raw.execute(f"SELECT batch FROM {COMMITS_TABLE} WHERE writer = %s", (writer,)).fetchone()
    return row is not None and int(row[0]) >= batch
