"""A background loop (outbox sender, webhooks, sync pulls, approval sweep, transcripts lifecycle) meeting storage
trouble: the database away, damaged or full. The loop does not end (the node process never exits because its
database went away); it logs the trouble once when it begins (``loop_paused``) and once when it is over
(``loop_resumed``), never once per retry, and waits a bounded, growing delay between tries."""

from __future__ import annotations

import logging
import time

from a2a import Backoff
from node.log import STATE_CHANGE
from storage.errors import StorageError

# Between a loop's tries while its storage trouble lasts: from PAUSE_MIN_S doubling to PAUSE_MAX_S (jittered).
PAUSE_MIN_S = 0.2
PAUSE_MAX_S = 5.0


class StoragePause:
    """One loop's storage trouble: ``failed`` (log once, the seconds to wait), ``ok`` (log once it is over); logged
    on the loop's own ``logger``."""

    def __init__(self, loop: str, logger: logging.Logger, backoff: Backoff | None = None) -> None:
        self.loop = loop
        self.log = logger
        self.backoff = backoff if backoff is not None else Backoff(PAUSE_MIN_S, PAUSE_MAX_S)
        self.failures = 0
        self._since = 0.0
        self._code = ""

    @property
    def paused(self) -> bool:
        return self.failures > 0

    def failed(self, e: StorageError, what: str = "") -> float:
        """The loop's storage work (``what`` it was doing) failed with ``e``: logged when the trouble (or its code)
        is new; returns the seconds to wait before the next try."""
        if not self.failures:
            self._since = time.monotonic()
        if not self.failures or e.code != self._code:
            self.log.warning("loop_paused", extra={STATE_CHANGE: True, "ev": {
                "loop": self.loop, "what": what, "code": str(e.code), "error": e.message}})
            self._code = str(e.code)
        self.failures += 1
        return self.backoff.next_delay(self.failures - 1)

    def ok(self) -> None:
        """The loop's storage work went through: logged when it had been paused."""
        if self.failures:
            self.log.info("loop_resumed", extra={"ev": {"loop": self.loop, "failures": self.failures,
                                                   "paused_s": round(time.monotonic() - self._since, 3)}})
        self.failures = 0
        self._code = ""
