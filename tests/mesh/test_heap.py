"""mesh.heap: after keep_tls_reads_on_the_heap, a TLS read's 256 KiB buffer comes from the heap (no mapping of
its own), in a fresh process as a node starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = r"""
import sys
from mesh.heap import keep_tls_reads_on_the_heap

def anonymous_bytes():
    out = 0
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if len(line.split()) == 5:  # no name: anonymous mappings ([heap] is named)
            out += hi - lo
    return out

SIZE = 256 * 1024 + 4096
if sys.argv[1] == "on":
    assert keep_tls_reads_on_the_heap()
before = anonymous_bytes()
kept = [bytearray(SIZE) for _ in range(4)]  # what SSLObject.read(256 KiB) allocates
print((anonymous_bytes() - before) // SIZE)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_tls_read_sized_buffer_gets_no_mapping_of_its_own_once_set() -> None:
    def new_mappings(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60,
                              check=True)
        return int(done.stdout)

    assert new_mappings("off") >= 4  # glibc's default: a mapping each (what every TLS read paid)
    assert new_mappings("on") == 0
