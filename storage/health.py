"""What is wrong with the store now, as the node's readiness reports it: the database is away (a Postgres that
stopped answering), its file is damaged, its disk is full. Each condition is set where it is found and cleared
where it is seen to be over; ``/readyz`` answers 503 with every condition in force (``docs/operations.md``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from storage.errors import StorageCode


@dataclass(frozen=True, slots=True)
class Condition:
    """One thing wrong with the store: its code, a sentence naming the cause and the recovery, and since when
    (time.monotonic())."""

    code: StorageCode
    message: str
    since: float


class Health:
    """The store's conditions in force, set and cleared from any thread (the writer, the readers, the loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now: dict[StorageCode, Condition] = {}
        # How many times each condition began, for /metrics and the log.
        self.began: dict[StorageCode, int] = {}

    def set(self, code: StorageCode, message: str) -> bool:
        """``code`` is in force (its message updated); True when it was not before."""
        with self._lock:
            held = self._now.get(code)
            self._now[code] = Condition(code, message, held.since if held is not None else time.monotonic())
            if held is None:
                self.began[code] = self.began.get(code, 0) + 1
            return held is None

    def clear(self, code: StorageCode) -> Condition | None:
        """``code`` is over; returns the condition that ended (None when it was not in force)."""
        with self._lock:
            return self._now.pop(code, None)

    def conditions(self) -> list[Condition]:
        """Every condition in force, oldest first."""
        with self._lock:
            return sorted(self._now.values(), key=lambda c: c.since)

    def __contains__(self, code: StorageCode) -> bool:
        with self._lock:
            return code in self._now
