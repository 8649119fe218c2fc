"""A small filesystem that fills up: a tmpfs mounted for a block, and a file written until it has no byte left
(tests/faults.py and testbed/bench/storage_faults.py put a node's home on one)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from testbed.errors import TestbedCode, TestbedError

MOUNT_TIMEOUT_S = 30


@contextlib.contextmanager
def tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``where`` (created, mode 0700) for the block, unmounted after, always.
    Raises TestbedError ``tmpfs_refused`` saying why where there is no ``mount`` or mounting is refused (not root,
    no CAP_SYS_ADMIN in a container)."""
    where.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None:
        raise TestbedError(TestbedCode.TMPFS_REFUSED, "no `mount` command: a full filesystem needs a tmpfs "
                                                      "(apt-get install mount; run as root)")
    done = subprocess.run([mount, "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    if done.returncode != 0:
        raise TestbedError(TestbedCode.TMPFS_REFUSED,
                           f"mounting a tmpfs at {where} was refused ({done.stderr.strip() or done.returncode}): "
                           "a full disk needs root (CAP_SYS_ADMIN), as in CI")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=MOUNT_TIMEOUT_S, check=False)


def fill(path: Path, chunk: int = 64 * 1024) -> int:
    """Write ``path`` until its filesystem has no byte left (ENOSPC); returns the bytes written."""
    written = 0
    block = b"\0" * chunk
    with open(path, "wb", buffering=0) as f:
        while chunk:
            try:
                written += f.write(block[:chunk])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk //= 2  # the last blocks, smaller and smaller, until not one byte fits
        os.fsync(f.fileno())
    return written
