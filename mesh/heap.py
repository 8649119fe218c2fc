"""Every read on a TLS socket allocates a 256 KiB buffer: uvloop's SSL protocol (without a buffered app
protocol, as aiohttp's are) calls ``SSLObject.read(256 KiB)``, which allocates that much and shrinks it to
what was read. Under glibc's default mmap threshold (128 KiB; glibc raises it only once something that large
has been freed) that is an ``mmap``, an ``mremap`` and an ``munmap`` a read, and a page fault: strace of the
bench's sender showed one of each per ACK read (766 reads, 766 of each in 3 s), where the floor's reads,
made after the threshold had happened to rise, showed none. Whether a process's threshold has risen
depends on what it freed before, so the cost came and went between runs.

``keep_tls_reads_on_the_heap`` fixes the threshold above that buffer (and the heap's trim threshold above
it, so that handing the buffer back does not shrink the heap with ``brk`` on every read either).
"""

from __future__ import annotations

import ctypes
import sys

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Allocations up to this come from the heap: above the 256 KiB (+ header) of a TLS read.
MMAP_THRESHOLD_BYTES = 1 << 20
# Free heap kept before glibc gives memory back with brk: a few of those buffers.
TRIM_THRESHOLD_BYTES = 4 << 20


def keep_tls_reads_on_the_heap() -> bool:
    """Set glibc's mmap and trim thresholds (see the module doc) for this process; False where the C library
    has no ``mallopt`` (not Linux/glibc) or refuses them, and nothing changes then."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                               TRIM_THRESHOLD_BYTES))
