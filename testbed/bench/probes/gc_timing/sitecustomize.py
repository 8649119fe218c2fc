"""Times every cyclic garbage collection of each Python process that starts with this directory on
PYTHONPATH and GCPROBE_DIR set: one line per collection (monotonic time, generation, wall ms, thread CPU ms,
objects collected) in GCPROBE_DIR/gc-<pid>.log. Used for the GC figures in docs/perf-history.md:

    GCPROBE_DIR=/tmp/gclog PYTHONPATH=testbed/bench/probes/gc_timing:. \\
        .venv/bin/python -m testbed.bench.federation_bench ...
"""

import gc
import os
import sys
import time

_dir = os.environ.get("GCPROBE_DIR")
if _dir:
    _started = [0.0, 0.0]
    _log = open(os.path.join(_dir, f"gc-{os.getpid()}.log"), "a", buffering=1)  # noqa: SIM115
    _log.write(" ".join(sys.argv[:4]) + "\n")

    def _timed(phase: str, info: dict) -> None:
        if phase == "start":
            _started[:] = [time.perf_counter(), time.thread_time()]
            return
        wall = (time.perf_counter() - _started[0]) * 1e3
        cpu = (time.thread_time() - _started[1]) * 1e3
        _log.write(f"{time.monotonic():.3f} gen{info['generation']} {wall:.2f}ms cpu={cpu:.2f}ms "
                   f"collected={info['collected']}\n")

    gc.callbacks.append(_timed)
