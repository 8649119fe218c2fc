"""Testbed layouts for the tests, on loopback ports that no other test worker and no outgoing connection takes.

``testbed.mesh.build.build_layout`` without ``base_port`` takes ports the kernel handed out a moment before
(bind to 0, then close): under parallel workers another worker's bind or a connection's source port can
take one of them before the node binds it (``port_in_use`` at start). ``new_layout`` gives each worker its
own block of ports below the kernel's ephemeral range (32768 and up here), where neither lands, and walks
it (from a random place, so two suites on one machine rarely meet) taking only ports free right now.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import Any

from testbed.mesh import MeshLayout, build_layout

FIRST_PORT = 10_000
BLOCK_PORTS = 2_000  # per worker: gw0 10000-11999, gw1 12000-13999, ... (11 workers fit under 32768)
PORTS_PER_NODE = 3   # mesh, health, MCP HTTP (testbed.mesh.build's order)


def _worker_index() -> int:
    """0 for gw0 (and for a run without workers), 1 for gw1, ..."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw")) if name.removeprefix("gw").isdigit() else 0


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class _Block:
    def __init__(self, index: int) -> None:
        self.first = FIRST_PORT + index * BLOCK_PORTS
        self.next = self.first + random.randrange(BLOCK_PORTS)

    def take(self, count: int) -> int:
        """The first of ``count`` consecutive ports of this block that are free now; never the same twice
        until the block has been walked round."""
        for _ in range(BLOCK_PORTS):
            if self.next + count > self.first + BLOCK_PORTS:
                self.next = self.first
            base, self.next = self.next, self.next + count
            if all(_free(p) for p in range(base, base + count)):
                return base
        raise RuntimeError(f"no {count} consecutive free ports in {self.first}..{self.first + BLOCK_PORTS - 1}")


# A worker is one process (xdist names it in PYTEST_XDIST_WORKER before it imports the tests).
_BLOCK = _Block(_worker_index())


def new_layout(root: Path, nodes: int, **kwargs: Any) -> MeshLayout:
    """``build_layout(root, nodes, **kwargs)`` on ports from this worker's block."""
    return build_layout(root, nodes, base_port=_BLOCK.take(PORTS_PER_NODE * nodes), **kwargs)
