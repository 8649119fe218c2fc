"""Logs each stall of a node's event loop: every `serve` process that starts with this directory on
PYTHONPATH and LAGPROBE_DIR set runs a 1 ms loop timer and a watchdog thread; whenever the timer has not
run for LAG_MS (default 5) the watchdog samples the loop thread's Python stack every millisecond until it
runs again, then writes one line per stall (wall time, length, samples) and its most frequent stacks to
LAGPROBE_DIR/lag-<pid>.log. Used for the ping-tail figures in docs/perf-history.md:

    LAGPROBE_DIR=/tmp/lag PYTHONPATH=testbed/bench/probes/loop_lag:. \\
        .venv/bin/python -m testbed.bench.federation_bench ...

A stack of `runners.py:run` alone means the loop thread was in native code (uvloop, TLS) or waiting for a
CPU or the GIL when sampled. The watchdog itself needs the GIL, so a stall has fewer samples than ms.
"""

# ruff: noqa: SLF001 - a probe: it patches asyncio's private running-loop setter and reads other threads' frames.

import os
import sys

_dir = os.environ.get("LAGPROBE_DIR")
if _dir and "serve" in sys.argv:
    import asyncio
    import asyncio.events
    import collections
    import threading
    import time
    import traceback

    _main = threading.main_thread().ident
    _lag_s = float(os.environ.get("LAG_MS", "5")) / 1e3
    _last = [time.monotonic()]
    _started = [False]
    _log = open(os.path.join(_dir, f"lag-{os.getpid()}.log"), "a", buffering=1)  # noqa: SIM115
    _set_running_loop = asyncio.events._set_running_loop

    def _tick(loop: asyncio.AbstractEventLoop) -> None:
        _last[0] = time.monotonic()
        loop.call_later(0.001, _tick, loop)

    def _watch() -> None:
        stall_from = None
        stacks: collections.Counter[str] = collections.Counter()
        while True:  # a daemon thread: ends with the process
            time.sleep(0.001)
            if time.monotonic() - _last[0] > _lag_s:
                stall_from = _last[0] if stall_from is None else stall_from
                frame = sys._current_frames().get(_main)
                if frame is not None:
                    stack = traceback.extract_stack(frame)[-8:]
                    stacks[" <- ".join(f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}"
                                       for f in reversed(stack))] += 1
            elif stall_from is not None:
                _log.write(f"STALL {time.time():.3f} {(_last[0] - stall_from) * 1e3:.1f}ms "
                           f"samples={sum(stacks.values())}\n")
                for key, n in stacks.most_common(6):
                    _log.write(f"   {n:4d} {key}\n")
                stall_from = None
                stacks.clear()

    def _patched(loop: asyncio.AbstractEventLoop | None) -> None:
        # uvloop takes asyncio's _set_running_loop when it is imported, after this file runs.
        _set_running_loop(loop)
        if loop is not None and not _started[0] and threading.get_ident() == _main:
            _started[0] = True
            loop.call_soon(_tick, loop)
            threading.Thread(target=_watch, daemon=True, name="lagprobe").start()

    asyncio.events._set_running_loop = _patched
    asyncio._set_running_loop = _patched
