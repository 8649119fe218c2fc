"""The storage room's one exception family, and the translation of sqlite3 errors into it."""

from __future__ import annotations

import sqlite3


class StorageError(Exception):
    """A storage failure with a stable snake_case ``code`` and a human ``message``.

    Codes in use: not_a_database, foreign_database, schema_too_new, not_found, duplicate_link,
    duplicate_memory, already_queued, append_only, constraint, busy, read_only, disk_full,
    io_error, corrupt, closed, commit_failed, transaction_aborted, sql_error, transcript_corrupt,
    unknown_transcript.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"StorageError({self.code!r}, {self.message!r})"


# sqlite3 extended error names (Python 3.11 exposes them) mapped to our codes, by prefix.
_BY_ERRORNAME: tuple[tuple[str, str], ...] = (
    ("SQLITE_CONSTRAINT", "constraint"),
    ("SQLITE_BUSY", "busy"),
    ("SQLITE_LOCKED", "busy"),
    ("SQLITE_READONLY", "read_only"),
    ("SQLITE_FULL", "disk_full"),
    ("SQLITE_IOERR", "io_error"),
    ("SQLITE_CORRUPT", "corrupt"),
    ("SQLITE_NOTADB", "not_a_database"),
)


def translate(exc: sqlite3.Error, doing: str = "") -> StorageError:
    """Turn any sqlite3.Error into a StorageError with a stable code; ``doing`` prefixes the message."""
    text = str(exc)
    if "append-only" in text:
        code = "append_only"
    else:
        name = getattr(exc, "sqlite_errorname", "") or ""
        fallback = "constraint" if isinstance(exc, sqlite3.IntegrityError) else "sql_error"
        code = next((c for prefix, c in _BY_ERRORNAME if name.startswith(prefix)), fallback)
    prefix = f"{doing}: " if doing else ""
    return StorageError(code, f"{prefix}{text}")
