"""Times each small frame a node's inbound WebSocket takes: every `serve` process that starts with this directory
on PYTHONPATH, PINGPATH_DIR set and PINGPATH_NODE (default ``node-2/``, B in testbed/bench/federation_bench.py) in its
command line records, per frame of at most PINGPATH_MAX_BYTES (default 700: a ping, not a links.put), the
monotonic ns when ``_Socket.on_frame`` took it and when it returned (ACK made) and the frame's crc32, and writes
them at exit to PINGPATH_DIR/frames-<pid>.bin (int64 triples), and its threads' names by native id to
threads-<pid>.json. With the pinger's own times (`federation_bench.py --keep-pings`), split.py here splits each
ping's round trip into its legs (and cpu_states.py says what B's loop thread did meanwhile):

    PINGPATH_DIR=/tmp/pp PYTHONPATH=testbed/bench/probes/ping_path:. \\
        .venv/bin/python -m testbed.bench.federation_bench ... --keep-pings /tmp/pp/pings.json
    .venv/bin/python -m testbed.bench.probes.ping_path.split /tmp/pp

Both processes read CLOCK_MONOTONIC on one host, so the times compare directly.
"""

# ruff: noqa: SLF001 - a probe: it wraps a private method of the mesh server.

import os
import sys

_dir = os.environ.get("PINGPATH_DIR")
_node = os.environ.get("PINGPATH_NODE", "node-2/")
if _dir and "serve" in sys.argv and any(_node in arg for arg in sys.argv):
    import array
    import atexit
    import json
    import threading
    import time
    import zlib

    import mesh.server

    _max = int(os.environ.get("PINGPATH_MAX_BYTES", "700"))
    _times = array.array("q")
    _names: dict[int | None, str] = {}
    _on_frame = mesh.server._Socket.on_frame

    def _note_names() -> None:
        _names.update((t.native_id, t.name) for t in threading.enumerate())

    def _timed(self: "mesh.server._Socket", data: bytes):  # what on_frame returns: room to wait for, or None
        if len(data) > _max:
            return _on_frame(self, data)
        if not len(_times) % 768:  # every 256 frames: the names of threads that may be gone by the exit
            _note_names()
        taken = time.monotonic_ns()
        try:
            return _on_frame(self, data)
        finally:
            _times.extend((taken, time.monotonic_ns(), zlib.crc32(data)))

    def _dump() -> None:
        with open(os.path.join(_dir, f"frames-{os.getpid()}.bin"), "wb") as f:
            _times.tofile(f)
        with open(os.path.join(_dir, f"threads-{os.getpid()}.json"), "w") as f:
            _note_names()
            json.dump({str(tid): name for tid, name in _names.items()}, f)

    mesh.server._Socket.on_frame = _timed
    atexit.register(_dump)
