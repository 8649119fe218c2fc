"""The ``[mcp]`` settings for agents (docs/mcp.md, "Agents"): one ``[[mcp.agents]]`` table per MCP client that
needs its own quota, and how agent ids are admitted. Kept apart from ``node.config`` (which imports it) so the
config module stays one page; a bad value raises ``AgentConfigError`` and ``node.config`` turns it into its
``ConfigError`` naming the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from base.errors import ProjectError

# Most agents of one node (``mcp.max_agents``): each is a label on /metrics and a row in status, so the count is
# bounded, and a client naming a new agent past it is refused (too_many_agents).
MAX_AGENTS = 64
# How long a delegation a node signs for an agent lasts (days); it is renewed on use once less than a tenth of it
# is left.
DELEGATION_DAYS = 365.0
# "open": any agent id a local client names gets its keypair and delegation on first use; "declared": only the
# ids [[mcp.agents]] names (others are refused agent_not_declared).
AGENT_ADMISSIONS = ("open", "declared")


class AgentConfigError(ProjectError):
    """A bad ``[[mcp.agents]]`` entry or agent setting: ``key`` names it, the message says why (``node.config``
    raises it again as its ConfigError, code ``config_invalid``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__("config_invalid", message)
        self.key = key


@dataclass(frozen=True)
class AgentConfig:
    """One agent's own quotas; None takes the node-wide one (``limits.requests_per_second``,
    ``permissions.max_bytes_per_agent``)."""

    id: str
    requests_per_second: int | None = None
    max_bytes: int | None = None


_KEYS = {"id", "requests_per_second", "max_bytes"}


def parse_agents(value: Any) -> tuple[AgentConfig, ...]:
    """``[[mcp.agents]]`` as AgentConfig entries: each a table with ``id`` and optional positive
    ``requests_per_second`` and non-negative ``max_bytes`` (0 = no quota); ids distinct."""
    if not isinstance(value, list):
        raise AgentConfigError("mcp.agents", f"mcp.agents must be an array of tables ([[mcp.agents]]), got {value!r}")
    out: list[AgentConfig] = []
    for i, item in enumerate(value):
        key = f"mcp.agents[{i}]"
        if not isinstance(item, dict) or "id" not in item or set(item) - _KEYS:
            raise AgentConfigError(key, f"{key} must be a table with id and optionally requests_per_second, "
                                        f"max_bytes, got {item!r}")
        agent_id = item["id"]
        if not isinstance(agent_id, str) or not agent_id:
            raise AgentConfigError(f"{key}.id", f"{key}.id must be a non-empty string, got {agent_id!r}")
        rps, top = item.get("requests_per_second"), item.get("max_bytes")
        if rps is not None and (not _is_int(rps) or rps < 1):
            raise AgentConfigError(f"{key}.requests_per_second",
                                   f"{key}.requests_per_second must be an integer >= 1, got {rps!r}")
        if top is not None and (not _is_int(top) or top < 0):
            raise AgentConfigError(f"{key}.max_bytes", f"{key}.max_bytes must be an integer >= 0 (0 = no quota), "
                                                       f"got {top!r}")
        if any(a.id == agent_id for a in out):
            raise AgentConfigError(f"{key}.id", f"{key}.id {agent_id!r} is declared twice")
        out.append(AgentConfig(agent_id, rps, top))
    return tuple(out)


class AgentSettings(Protocol):
    """The agent settings of ``[mcp]`` (``node.config.McpConfig``)."""

    agents: tuple[AgentConfig, ...]
    agent_ids: str
    max_agents: int
    agent_delegation_days: float


def check_agent_settings(mcp: AgentSettings) -> None:
    """The agent settings of ``[mcp]`` hold together (AgentConfigError naming the key otherwise)."""
    admission, max_agents, delegation_days, agents = mcp.agent_ids, mcp.max_agents, mcp.agent_delegation_days, \
        mcp.agents
    if admission not in AGENT_ADMISSIONS:
        raise AgentConfigError("mcp.agent_ids", f"mcp.agent_ids must be one of {', '.join(AGENT_ADMISSIONS)}, "
                                                f"got {admission!r}")
    if max_agents < 1:
        raise AgentConfigError("mcp.max_agents", f"mcp.max_agents must be >= 1, got {max_agents!r}")
    if len(agents) > max_agents:
        raise AgentConfigError("mcp.agents", f"mcp.agents declares {len(agents)} agents, more than mcp.max_agents "
                                             f"({max_agents})")
    if not delegation_days > 0:
        raise AgentConfigError("mcp.agent_delegation_days",
                               f"mcp.agent_delegation_days must be > 0, got {delegation_days!r}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
