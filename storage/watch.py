"""A running node's watch over its store: SQLite's integrity check every ``storage.integrity_check_interval_s``,
a look each tick that the file opened is still the one at its path (``Database.check_file``) and, while the disk
is full, a probe for space each tick, so that readiness returns without waiting for a
client's write. The node's TaskGroup owns ``run``; it ends when cancelled."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from storage.db import Database
from storage.errors import StorageCode, StorageError
from storage.integrity import Findings

log = logging.getLogger("storage")

# Seconds between two looks at a full disk (and the finest step of the integrity schedule).
TICK_S = 1.0


class StoreWatch:
    """Checks ``db`` every ``integrity_every_s`` seconds (0: never; the first check is the node's own at start)
    and probes a full disk every ``tick_s``. ``clock`` is time.monotonic unless a test drives it."""

    def __init__(self, db: Database, *, integrity_every_s: float, tick_s: float = TICK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.integrity_every_s = integrity_every_s
        self.tick_s = tick_s
        self.clock = clock
        self.checks = 0
        # The last check's findings (for /metrics), None before the first or where the backend has no check.
        self.last: Findings | None = None
        # The reason checks cannot run now (logged once when it begins), None while they run.
        self._failing: str | None = None

    async def run(self) -> None:
        due = self.clock() + self.integrity_every_s
        while True:
            await asyncio.sleep(self.tick_s)
            self.db.check_file()
            if StorageCode.STORAGE_FULL in self.db.health:
                await self.db.recheck_full()
            if self.integrity_every_s > 0 and self.clock() >= due:
                await self.check()
                due = self.clock() + self.integrity_every_s

    async def check(self) -> None:
        """One integrity check now; a check that cannot run is logged once until one runs again."""
        try:
            findings = await self.db.check_integrity()
        except StorageError as e:
            if self._failing != e.message:
                log.warning("integrity_check_failed", extra={"ev": {"code": str(e.code), "error": e.message}})
            self._failing = e.message
            return
        self._failing = None
        self.checks += 1
        self.last = findings
