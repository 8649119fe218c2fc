"""Helper subprocesses of the bench (floor receivers, NATS responders): wait for the first line each
prints on stdout, and stop a group of them with a bound on every wait."""

from __future__ import annotations

import selectors
import subprocess
from collections.abc import Iterable


def first_line(proc: subprocess.Popen, timeout_s: float, what: str) -> bytes:
    """The first line ``proc`` prints on stdout (b"" when it exits first); RuntimeError naming ``what``
    (e.g. "floor receiver") when nothing arrives within ``timeout_s``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise RuntimeError(f"{what} pid {proc.pid} printed nothing in {timeout_s:g} s")
    return proc.stdout.readline()


def stop_all(procs: Iterable[subprocess.Popen], timeout_s: float) -> None:
    """Close each one's stdin (they exit on EOF) and SIGTERM it, then wait for all of them, SIGKILL
    any still running after ``timeout_s``, and close their stdout."""
    procs = list(procs)
    for proc in procs:
        if proc.stdin:
            proc.stdin.close()
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
        if proc.stdout:
            proc.stdout.close()
