"""What B's event loop thread was doing while a slow ping waited for it (the "to B" leg of split.py), from the
scheduler's own record:

    perf record -a -k CLOCK_MONOTONIC -e sched:sched_switch -e sched:sched_wakeup -o DIR/sched.data -- sleep 45 &
    PINGPATH_DIR=DIR PYTHONPATH=testbed/bench/probes/ping_path:. .venv/bin/python -m testbed.bench.federation_bench \\
        ... --keep-pings DIR/pings.json
    kill -INT %1; perf script -i DIR/sched.data -F pid,tid,cpu,time,event,trace > DIR/sched.txt
    python3 -m testbed.bench.probes.ping_path.cpu_states DIR [--cpu 1] [--slow-ms 2] [--pings FILE]

(perf: Debian's linux-perf, run as root; -k CLOCK_MONOTONIC puts its times on the clock the pinger and B read.)
For the batched flood's pings whose "to B" leg took at least --slow-ms, prints how that time splits between B's
main thread running, runnable but waiting for a CPU, and asleep (blocked on something: a futex, which is where a
thread waiting for the GIL is, or anything else; the frame was already on its socket), and which threads held B's
CPU (--cpu: where the bench pins B, 1) meanwhile: B's own by name (threads-<pid>.json), or other processes.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
from collections import Counter
from pathlib import Path
from typing import TypeVar

from testbed.bench.probes.ping_path.split import legs, load  # the same ping to frame matching

V = TypeVar("V")
_LINE = re.compile(r"^\s*(\d+)/(\d+)\s+\[(\d+)\]\s+(\d+\.\d+): sched:(sched_switch|sched_wakeup): (.*)$")
_SWITCH = re.compile(r"prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)")
_WAKEUP = re.compile(r" pid=(\d+) ")


def timeline(lines: list[str], main: int, cpu: int) -> tuple[list[tuple[float, str]], list[tuple[float, int]],
                                                              dict[int, int]]:
    """(main thread's states by time: run / wait / sleep, from every CPU's events), (which tid took ``cpu``, by
    time), tid -> pid of every task that switched out."""
    states: list[tuple[float, str]] = []
    on_cpu: list[tuple[float, int]] = []
    owner: dict[int, int] = {}
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        pid, tid, where, t, event, rest = int(m[1]), int(m[2]), int(m[3]), float(m[4]), m[5], m[6]
        if event == "sched_wakeup":
            w = _WAKEUP.search(rest)
            if w is not None and int(w[1]) == main:
                states.append((t, "wait"))
            continue
        owner[tid] = pid
        s = _SWITCH.search(rest)
        if s is None:
            continue
        prev, prev_state, nxt = int(s[1]), s[2], int(s[3])
        if prev == main:
            states.append((t, "wait" if prev_state.startswith("R") else "sleep"))
        if nxt == main:
            states.append((t, "run"))
        if where == cpu:
            on_cpu.append((t, nxt))
    return states, on_cpu, owner


def spans(events: list[tuple[float, V]], lo: float, hi: float) -> dict[V, float]:
    """Seconds each value held over [lo, hi) of a time-ordered list of (time, value) changes."""
    out: dict[V, float] = {}
    times = [t for t, _ in events]
    k = bisect.bisect_right(times, lo) - 1
    if k < 0:
        return out
    t, value = lo, events[k][1]
    for tt, vv in events[k + 1:]:
        if tt >= hi:
            break
        out[value] = out.get(value, 0.0) + tt - t
        t, value = tt, vv
    out[value] = out.get(value, 0.0) + hi - t
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--pings", type=Path, default=None)
    p.add_argument("--cpu", type=int, default=1, help="B's CPU (default 1, as the bench pins it)")
    p.add_argument("--slow-ms", type=float, default=2.0)
    args = p.parse_args()
    kept, b_pid, frames = load(args.dir, args.pings)
    states, on_cpu, owner = timeline((args.dir / "sched.txt").read_text().splitlines(), b_pid, args.cpu)
    if not on_cpu:
        raise SystemExit(f"no sched_switch events on CPU {args.cpu} in {args.dir / 'sched.txt'}")
    first, last = on_cpu[0][0], on_cpu[-1][0]
    names_path = args.dir / f"threads-{b_pid}.json"
    names = {int(k): v for k, v in json.loads(names_path.read_text()).items()} if names_path.exists() else {}
    lo, hi = kept["windows"]["batched"]
    state_s: Counter[str] = Counter()
    ran: Counter[int] = Counter()
    covered = slow = 0
    for sent, leg in legs(kept["samples"], frames)[0]:
        written = (sent + (leg[1]) * 1e6) / 1e9
        taken = written + leg[2] / 1e3
        if not (lo <= sent < hi and first <= written and taken <= last):
            continue
        covered += 1
        if leg[2] < args.slow_ms:
            continue
        slow += 1
        state_s.update(spans(states, written, taken))
        ran.update({tid: s for tid, s in spans(on_cpu, written, taken).items() if tid != b_pid})
    total = sum(state_s.values()) or 1.0
    print(f"batched pings inside the perf record: {covered}; 'to B' >= {args.slow_ms:g} ms: {slow}")
    print("B's main thread over those legs: " + ", ".join(f"{k} {v / total:.0%}" for k, v in state_s.most_common()))
    for tid, seconds in ran.most_common(8):
        who = ("idle" if tid == 0 else f"B's {names.get(tid, 'thread')}" if owner.get(tid) == b_pid
               else f"pid {owner.get(tid, '?')}")
        print(f"  on CPU {args.cpu} instead: tid {tid} ({who}) {seconds * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
