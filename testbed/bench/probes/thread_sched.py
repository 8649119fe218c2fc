"""Scheduler knobs on one running process's threads, set from outside while a bench runs (a probe: no knob here
is used by the node).

    python3 -m testbed.bench.probes.thread_sched batch "node-2/config.toml serve" [--seconds 120]
    python3 -m testbed.bench.probes.thread_sched slice "node-2/config.toml serve" [--slice-us 100] [--seconds 120]
    python3 -m testbed.bench.probes.thread_sched nice "node-2/config.toml serve" [--nice 19] [--seconds 120]

Waits (up to --seconds) for a process whose command line contains the pattern, then:
- ``batch``: puts every thread but the main one (the node's event loop) in SCHED_BATCH, every 0.2 s so that
  threads started later are caught too (the verify thread, the storage writer and readers);
- ``nice``: sets every thread but the main one to nice ``--nice`` (19), caught every 0.2 s as ``batch`` does
  (Linux's setpriority on a thread id: that thread only);
- ``slice``: asks the EEVDF scheduler (Linux 6.12 and later) for a short time slice for the main thread
  (``sched_attr.sched_runtime``), so that it is picked sooner when it wakes; its share of the CPU is unchanged.
Run it as root (or the process's owner), started before the bench. Linux only; x86_64 and aarch64.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from testbed.bench.probes.schedstat_monitor import wait_for  # the same wait for the process, by its command line

POLL_S = 0.2
# sched_setattr / sched_getattr syscall numbers
SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}


class _SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32), ("flags", ctypes.c_uint64),
                ("nice", ctypes.c_int32), ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64)]


def set_slice(tid: int, slice_ns: int) -> int:
    """The slice the thread had (ns); raises OSError when the kernel refuses the new one."""
    set_nr, get_nr = SYSCALLS[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    attr = _SchedAttr()
    if libc.syscall(get_nr, tid, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        raise OSError(ctypes.get_errno(), "sched_getattr")
    before = attr.runtime
    attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr), policy=os.SCHED_OTHER, runtime=slice_ns)
    if libc.syscall(set_nr, tid, ctypes.byref(attr), 0) != 0:
        raise OSError(ctypes.get_errno(), "sched_setattr")
    return int(before)


def other_threads(pid: int, deadline: float, change: Callable[[int], None]) -> int:
    """``change`` each thread of ``pid`` but its main one, once, until it exits or the deadline; how many."""
    done: set[int] = set()
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        for task in Path(f"/proc/{pid}/task").iterdir():
            tid = int(task.name)
            if tid == pid or tid in done:
                continue
            try:
                change(tid)
                done.add(tid)
            except OSError:
                continue  # the thread ended
        time.sleep(POLL_S)
    return len(done)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("batch", "slice", "nice"))
    p.add_argument("pattern")
    p.add_argument("--slice-us", type=int, default=100, help="the main thread's slice (default 100 µs)")
    p.add_argument("--nice", type=int, default=19, help="the other threads' nice value (default 19)")
    p.add_argument("--seconds", type=float, default=120.0)
    args = p.parse_args()
    found = wait_for(args.pattern, args.seconds)
    if found is None:
        return 1
    pid, deadline = found
    if args.mode == "slice":
        before = set_slice(pid, args.slice_us * 1000)
        print(f"pid {pid}: main thread's slice {before / 1000:.0f} -> {args.slice_us} µs")
    elif args.mode == "batch":
        n = other_threads(pid, deadline, lambda tid: os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0)))
        print(f"pid {pid}: {n} threads in SCHED_BATCH")
    else:
        n = other_threads(pid, deadline, lambda tid: os.setpriority(os.PRIO_PROCESS, tid, args.nice))
        print(f"pid {pid}: {n} threads at nice {args.nice}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
