"""What runs a tool call: the ``ToolBackend`` protocol every MCP door serves, and ``ServiceBackend``, which
runs calls on a ``Service`` in this process (the node's own doors, or an embedded ``ai-memory mcp``).
``node.mcp.socket.SocketClientBackend`` is the other backend: it forwards calls to a running node."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from node.config import LimitsConfig
from node.errors import describe
from node.latency import LatencyTally
from node.mcp.capabilities import V3, capabilities
from node.mcp.peers import peers
from node.mcp.registry import JSON, Args, tool_specs
from node.mcp.validate import ArgValidator

if TYPE_CHECKING:
    from node.mcp.runtime import Runtime
    from node.service import Service


class ToolBackend(Protocol):
    # The bounds tools/list shows; whoever runs the call checks the arguments against its own.
    limits: LimitsConfig

    async def call(self, name: str, args: Args) -> JSON:
        """Run tool ``name``; raises an error with ``.code``/``.message`` (ServiceError) on failure."""
        ...


class ServiceBackend:
    """Runs tool calls on ``service`` in this process: validates the arguments against the registry, then
    calls the tool's handler with this backend as its context (``node.mcp.registry.NodeSide``).

    ``runtime`` is the node running in this process (its live peers, readiness and counters), or None."""

    def __init__(self, service: Service, runtime: Runtime | None = None) -> None:
        self.service = service
        self.runtime = runtime
        self.limits: LimitsConfig = service.cfg.limits
        specs = tool_specs(self.limits, service.cfg.kg)
        self.tools = {s.name: s for s in specs}
        self.validator = ArgValidator(specs)
        # (tool, "ok" or the error code) -> calls; an unknown tool name counts as "unknown" (bounded labels).
        self.calls: Counter[tuple[str, str]] = Counter()
        # Seconds each call took, by tool (aimem_mcp_call_seconds), whatever its outcome.
        self.latency = LatencyTally()

    async def call(self, name: str, args: Args) -> JSON:
        tool = name if name in self.tools else "unknown"
        started = time.perf_counter()
        try:
            checked = self.validator.check(name, args)  # unknown_tool for a name the table lacks
            result = await self.tools[name].handler(self, checked)
        except Exception as exc:
            self.calls[tool, describe(exc).code] += 1
            raise
        finally:
            self.latency.observe(tool, time.perf_counter() - started)
        self.calls[tool, "ok"] += 1
        return result

    async def peers(self) -> list[dict[str, Any]]:
        return await peers(self.service, self.runtime)

    async def capabilities(self, version: int = V3) -> dict[str, Any]:
        return await capabilities(self.service, self.runtime, version)
