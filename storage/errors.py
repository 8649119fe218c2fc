"""The storage room's one exception family, and the translation of sqlite3 errors into it."""

from __future__ import annotations

import sqlite3
from enum import StrEnum

from base.errors import ProjectError


class StorageCode(StrEnum):
    """The codes a StorageError carries."""

    NOT_A_DATABASE = "not_a_database"
    FOREIGN_DATABASE = "foreign_database"
    SCHEMA_TOO_NEW = "schema_too_new"
    NOT_FOUND = "not_found"
    DUPLICATE_LINK = "duplicate_link"
    DUPLICATE_MEMORY = "duplicate_memory"
    DUPLICATE_INVALIDATION = "duplicate_invalidation"
    ALREADY_QUEUED = "already_queued"
    APPEND_ONLY = "append_only"
    CONSTRAINT = "constraint"
    BUSY = "busy"
    READ_ONLY = "read_only"
    IO_ERROR = "io_error"
    CLOSED = "closed"
    COMMIT_FAILED = "commit_failed"
    TRANSACTION_ABORTED = "transaction_aborted"
    SQL_ERROR = "sql_error"
    TRANSCRIPT_CORRUPT = "transcript_corrupt"
    UNKNOWN_TRANSCRIPT = "unknown_transcript"
    BAD_SETTING = "bad_setting"
    FILE_MODE = "file_mode"
    AGE_UNAVAILABLE = "age_unavailable"
    # Another process holds the file (``ai-memory repair`` needs it alone).
    IN_USE = "in_use"
    # ``ai-memory migrate`` (storage/port.py): the target holds rows; the source changed under a run under way;
    # the two ends are not at this build's schema.
    TARGET_NOT_EMPTY = "target_not_empty"
    SOURCE_CHANGED = "source_changed"
    SCHEMA_MISMATCH = "schema_mismatch"
    # The store as a whole (storage/health.py): away, damaged, full. Each answers a client retryably.
    STORAGE_UNAVAILABLE = "storage_unavailable"
    STORAGE_CORRUPT = "storage_corrupt"
    STORAGE_FULL = "storage_full"


class StorageError(ProjectError):
    """A storage failure with a stable snake_case ``code`` (a StorageCode) and a human ``message``."""


class EngineError(sqlite3.OperationalError):
    """A DB-API error whose StorageCode the engine's adapter already knows (storage/pg.py: the server went away,
    its disk is full). The table modules see a sqlite3 error as ever; ``translate`` keeps the code."""

    def __init__(self, code: StorageCode, message: str) -> None:
        super().__init__(message)
        self.code = code


# sqlite3 extended error names (Python 3.11 exposes them) mapped to our codes, by prefix.
_BY_ERRORNAME: tuple[tuple[str, StorageCode], ...] = (
    ("SQLITE_CONSTRAINT", StorageCode.CONSTRAINT),
    ("SQLITE_BUSY", StorageCode.BUSY),
    ("SQLITE_LOCKED", StorageCode.BUSY),
    ("SQLITE_READONLY", StorageCode.READ_ONLY),
    ("SQLITE_FULL", StorageCode.STORAGE_FULL),
    ("SQLITE_IOERR", StorageCode.IO_ERROR),
    ("SQLITE_CORRUPT", StorageCode.STORAGE_CORRUPT),
    # On a store already open, a page that is not SQLite's is damage (``migrations.guard`` refuses a file that
    # is not a database at all before it is opened: not_a_database).
    ("SQLITE_NOTADB", StorageCode.STORAGE_CORRUPT),
)


def translate(exc: sqlite3.Error, doing: str = "") -> StorageError:
    """Turn any sqlite3.Error into a StorageError with a stable code; ``doing`` prefixes the message."""
    text = str(exc)
    if isinstance(exc, EngineError):
        code = exc.code
    elif "append-only" in text:
        code = StorageCode.APPEND_ONLY
    else:
        name = getattr(exc, "sqlite_errorname", "") or ""
        fallback = StorageCode.CONSTRAINT if isinstance(exc, sqlite3.IntegrityError) else StorageCode.SQL_ERROR
        code = next((c for prefix, c in _BY_ERRORNAME if name.startswith(prefix)), fallback)
    prefix = f"{doing}: " if doing else ""
    return StorageError(code, f"{prefix}{text}")
