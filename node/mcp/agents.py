"""Which agent an MCP request acts as, at the doors (docs/security.md, "Agents: the local trust boundary").

- stdio: the agent ``ai-memory mcp --agent-id`` names (the process's own; over the node's socket it is named once
  per connection, in a ``hello``).
- streamable HTTP: the agent whose bearer token the request carries (``Authorization: Bearer <token>``, the token
  kept in ``<home>/keys/agents/<agent_id>.token``, 0600); a request without one acts as the node, as before.
  ``BearerAgents`` answers a request whose token names no agent 401 before the SDK sees it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from mesh.agentkeys import AgentTokens

log = logging.getLogger("node.mcp")

BEARER = "bearer "
# The JSON-RPC error code the 401 body carries (the server-defined range of JSON-RPC 2.0).
UNAUTHORIZED_CODE = -32001


def bearer_of(headers: Mapping[str, str] | Any) -> str | None:
    """The token of an ``Authorization: Bearer`` header, "" for another scheme, None when there is none."""
    value = headers.get("authorization") if headers is not None else None
    if not isinstance(value, str):
        return None
    return value[len(BEARER):].strip() if value[: len(BEARER)].lower() == BEARER else ""


def agent_of(headers: Mapping[str, str] | Any, tokens: AgentTokens) -> str | None:
    """The agent an HTTP request acts as: its bearer token's agent; None without a token (the node)."""
    token = bearer_of(headers)
    return None if not token else tokens.agent_of(token)


class BearerAgents:
    """ASGI app in front of the MCP HTTP app: a request whose ``Authorization`` names no agent of this node (an
    unknown or removed token, another scheme) is answered 401 with a JSON-RPC error; any other goes on unchanged."""

    def __init__(self, app: ASGIApp, tokens: AgentTokens) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            token = bearer_of(headers)
            if token is not None and (not token or self.tokens.agent_of(token) is None):
                log.warning("mcp_unknown_token", extra={"ev": {"path": scope.get("path"),
                                                               "scheme_bearer": token != ""}})
                await _unauthorized(send)
                return
        await self.app(scope, receive, send)


async def _unauthorized(send: Send) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": UNAUTHORIZED_CODE, "message": "Unauthorized: the bearer token names no agent of this node "
                                              "(`ai-memory agents token ID` makes one; send none to act as the node)"}
                       }).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b'Bearer realm="ai-memory"')]})
    await send({"type": "http.response.body", "body": body})
