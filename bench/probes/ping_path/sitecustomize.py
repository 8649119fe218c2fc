"""Times each small frame a node's inbound WebSocket takes: every `serve` process that starts with this directory
on PYTHONPATH, PINGPATH_DIR set and PINGPATH_NODE (default ``node-2/``, B in bench/federation_bench.py) in its
command line records, per frame of at most PINGPATH_MAX_BYTES (default 700: a ping, not a links.put), the
monotonic ns when ``_Socket.on_frame`` took it and when it returned (ACK made), and writes them at exit to
PINGPATH_DIR/frames-<pid>.bin (int64 pairs). With the pinger's own times (`federation_bench.py --keep-pings`),
bench/probes/ping_path/split.py splits each ping's round trip into its legs:

    PINGPATH_DIR=/tmp/pp PYTHONPATH=bench/probes/ping_path:. .venv/bin/python bench/federation_bench.py \\
        ... --keep-pings /tmp/pp/pings.json
    .venv/bin/python bench/probes/ping_path/split.py /tmp/pp

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
    import time

    import mesh.server

    _max = int(os.environ.get("PINGPATH_MAX_BYTES", "700"))
    _times = array.array("q")
    _on_frame = mesh.server._Socket.on_frame

    def _timed(self: "mesh.server._Socket", data: bytes) -> None:
        if len(data) > _max:
            _on_frame(self, data)
            return
        _times.append(time.monotonic_ns())
        try:
            _on_frame(self, data)
        finally:
            _times.append(time.monotonic_ns())

    def _dump() -> None:
        with open(os.path.join(_dir, f"frames-{os.getpid()}.bin"), "wb") as f:
            _times.tofile(f)

    mesh.server._Socket.on_frame = _timed
    atexit.register(_dump)
