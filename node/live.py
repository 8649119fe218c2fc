"""Ask the running node, over its local socket, what only it knows (live link state, counters).

The CLI's ``status``, ``peers`` and ``doctor`` use this first and read the store only when no node
answers, saying so.
"""

from __future__ import annotations

from node.config import NodeConfig
from node.tools import JSON, SocketClientBackend

# A running node answers at once; a node that does not is reported, not waited on. Seconds.
CALL_TIMEOUT_S = 10.0


async def ask_node(cfg: NodeConfig, tool: str, args: dict | None = None) -> JSON | None:
    """The running node's answer to ``tool``, or None when no node listens on ``cfg.socket_path``.

    A node that answers with an error raises it (ServiceError with the node's code)."""
    try:
        client = await SocketClientBackend.connect(cfg.socket_path, limits=cfg.limits,
                                                   call_timeout_s=CALL_TIMEOUT_S, reconnect_window_s=0.0)
    except (OSError, TimeoutError):
        return None
    try:
        return await client.call(tool, dict(args or {}))
    finally:
        await client.close()
