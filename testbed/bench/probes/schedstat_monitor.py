"""Per-thread CPU time and run-queue wait of one process, every 0.5 s, from /proc/<pid>/task/*/schedstat.

    python3 -m testbed.bench.probes.schedstat_monitor OUT.tsv "node-2/config.toml serve" [--seconds 120]

Waits (up to --seconds) for a process whose command line contains the pattern, then writes one line per
thread per sample: monotonic time, tid, thread name, CPU ns, ns runnable but waiting for a CPU, slices.
Start it, then the bench.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

SAMPLE_S = 0.5


def find(pattern: bytes, deadline: float) -> str | None:
    me = str(os.getpid())  # this monitor's own command line holds the pattern too
    while time.monotonic() < deadline:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            if cmdline.parent.name == me:
                continue
            try:
                if pattern in cmdline.read_bytes().replace(b"\0", b" "):
                    return cmdline.parent.name
            except OSError:
                continue
        time.sleep(0.2)
    return None


def wait_for(pattern: str, seconds: float) -> tuple[int, float] | None:
    """The pid of the process whose command line holds ``pattern`` and the monotonic deadline ``seconds`` from
    now, or None (said) when none appears by then."""
    deadline = time.monotonic() + seconds
    pid = find(pattern.encode(), deadline)
    if pid is None:
        print(f"no process matching {pattern!r}")
        return None
    return int(pid), deadline


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("pattern")
    p.add_argument("--seconds", type=float, default=120.0)
    args = p.parse_args()
    found = wait_for(args.pattern, args.seconds)
    if found is None:
        return 1
    pid, deadline = found
    with args.out.open("w") as out:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            now = time.monotonic()
            for task in Path(f"/proc/{pid}/task").iterdir():
                try:
                    cpu, wait, slices = (task / "schedstat").read_text().split()[:3]
                    name = (task / "comm").read_text().strip()
                except OSError:
                    continue  # the thread ended
                out.write(f"{now:.2f}\t{task.name}\t{name}\t{cpu}\t{wait}\t{slices}\n")
            out.flush()
            time.sleep(SAMPLE_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
