"""What runs a tool call: the ``ToolBackend`` protocol every MCP door serves, and ``ServiceBackend``, which
runs calls on a ``Service`` in this process (the node's own doors, or an embedded ``ai-memory mcp``).
``node.mcp.socket.SocketClientBackend`` is the other backend: it forwards calls to a running node."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from node.agents.acting import acting_as
from node.agents.local import REFUSED_AGENT
from node.config import LimitsConfig
from node.errors import describe
from node.latency import LatencyTally
from node.mcp.capabilities import V3, capabilities
from node.mcp.peers import peers
from node.mcp.registry import JSON, Args, tool_specs
from node.mcp.validate import ArgValidator
from node.ratelimit import RateLimiter

if TYPE_CHECKING:
    from node.mcp.runtime import Runtime
    from node.service import Service


class ToolBackend(Protocol):
    # The bounds tools/list shows; whoever runs the call checks the arguments against its own.
    limits: LimitsConfig

    async def call(self, name: str, args: Args, agent: str | None = None) -> JSON:
        """Run tool ``name`` as ``agent`` (None: the door's own, by default this node); raises an error with
        ``.code``/``.message`` (ServiceError) on failure."""
        ...

    async def hello(self, agent: str) -> dict[str, Any]:
        """The agent ``agent`` as the node acts as it (made on first use): its id, key fingerprint, delegation."""
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
        # (agent, "ok" or the error code) -> calls, kept by the service's agents (capabilities and /metrics read
        # them): this node's own agents (at most mcp.max_agents) and the node itself; an id refused before it was
        # one counts as REFUSED_AGENT.
        self.agent_calls = service.agents.calls
        # Each agent's requests per second ([[mcp.agents]] requests_per_second, else limits.requests_per_second),
        # counted over every door and session the agent uses.
        self._agent_rates: dict[str, RateLimiter] = {}

    async def call(self, name: str, args: Args, agent: str | None = None) -> JSON:
        tool = name if name in self.tools else "unknown"
        started = time.perf_counter()
        who = self.service.agent_id if agent is None else agent
        try:
            principal = await self.service.agents.principal(agent)
        except Exception as exc:
            self.agent_calls[REFUSED_AGENT, describe(exc).code] += 1
            raise
        try:
            if principal is not None:
                self._rate_of(principal.agent_id).check(principal.agent_id)
            with acting_as(principal):
                checked = self.validator.check(name, args)  # unknown_tool for a name the table lacks
                result = await self.tools[name].handler(self, checked)
        except Exception as exc:
            code = describe(exc).code
            self.calls[tool, code] += 1
            self.agent_calls[who, code] += 1
            raise
        finally:
            self.latency.observe(tool, time.perf_counter() - started)
        self.calls[tool, "ok"] += 1
        self.agent_calls[who, "ok"] += 1
        return result

    async def hello(self, agent: str) -> dict[str, Any]:
        principal = await self.service.agents.principal(agent)
        if principal is None:
            return {"agent": self.service.agent_id, "node": True}
        return {"agent": principal.agent_id, "node": False, "fingerprint": principal.identity.fingerprint,
                "delegation_id": principal.delegation_id, "valid_until": principal.valid_until}

    def _rate_of(self, agent_id: str) -> RateLimiter:
        limiter = self._agent_rates.get(agent_id)
        if limiter is None:
            declared = next((a for a in self.service.cfg.mcp.agents if a.id == agent_id), None)
            rate = declared.requests_per_second if declared is not None and declared.requests_per_second else \
                self.limits.requests_per_second
            limiter = self._agent_rates[agent_id] = RateLimiter(rate)
        return limiter

    async def peers(self) -> list[dict[str, Any]]:
        return await peers(self.service, self.runtime)

    async def capabilities(self, version: int = V3) -> dict[str, Any]:
        return await capabilities(self.service, self.runtime, version)
