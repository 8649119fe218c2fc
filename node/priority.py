"""Lower the CPU priority of a node's background threads, so that its event loop gets the CPU first.

A node's storage writer and signature verifier share its process, its CPU time and its interpreter lock with
the event loop. While a peer's flood keeps them busy, what the loop answers (pings, ACKs, MCP calls) waits
behind them for a CPU (docs/perf-history.md, "Issue 16, ninth round"). ``federation.background_nice`` steps of nice
below the loop let the scheduler run the loop first. Linux only: there ``setpriority`` on a thread id changes
that thread alone (elsewhere it would change the whole process, so the setting is refused there).
"""

from __future__ import annotations

import os
import sys
import threading

MAX_NICE = 19
SUPPORTED = sys.platform == "linux"


def lower(tid: int, steps: int) -> None:
    """Thread ``tid`` of this process ``steps`` nice steps below where it is (at most nice 19); 0 leaves it."""
    if steps <= 0:
        return
    if not SUPPORTED:
        raise OSError(f"per-thread priorities need Linux, not {sys.platform}")
    os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, tid) + steps))


def lower_this_thread(steps: int) -> None:
    """``lower`` for the calling thread (a ThreadPoolExecutor initializer)."""
    lower(threading.get_native_id(), steps)
