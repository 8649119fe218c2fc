"""The node's MCP surface on the official ``mcp`` SDK (low-level ``Server``), and its two SDK doors:

- stdio (``run_stdio``): joins the running node over its local socket (``node.mcp.socket``), else runs a
  Service embedded;
- streamable HTTP (``start_http``): loopback only, endpoint ``/mcp``, embedded in the node's event loop.

The tools are the registry's (``node.mcp.registry``). Every tool failure becomes an MCP tool error
(``isError: true``, text ``[code] message``), never a protocol error: the client's model sees the reason and
the session keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import mcp_types as types
import orjson
import uvicorn
from anyio.streams.memory import MemoryObjectReceiveStream
from cachetools import LRUCache
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.message import SessionMessage

from node import files
from node.config import DEFAULT_HOME, LimitsConfig, MeshConfig, NodeConfig
from node.errors import ServiceCode, ServiceError, describe
from node.mcp.edge import AnsweredBodies, CheckedLines, private_stdin
from node.mcp.profiles import Family, parse_family
from node.mcp.registry import JSON, Args, Door, ToolSpec, instructions, listed, loader_specs, tool_specs
from node.mcp.socket import SocketClientBackend
from node.mcp.validate import ArgValidator
from node.ratelimit import MAX_CALLERS, RateLimiter

if TYPE_CHECKING:  # a joined stdio server forwards calls: the service's backend and the HTTP door's agents are not its
    from mesh.agentkeys import AgentTokens
    from node.mcp.backend import ToolBackend

log = logging.getLogger("node.mcp")

SERVER_NAME = "ai-memory"
HTTP_PATH = "/mcp"
# Bounds on the embedded HTTP server's start and stop; a loopback bind is instant.
HTTP_START_TIMEOUT_S = 5.0
HTTP_GRACEFUL_S = 2
HTTP_STOP_TIMEOUT_S = 5.0
# Refused stdio lines whose answers may wait for stdout at once; past it the reader waits (backpressure).
ANSWERS_MAX = 64

Run = Callable[[str, Args], Awaitable[JSON]]


# ---- the MCP server over a backend ----------------------------------------------------------

class _Server(Server[Any]):
    """The SDK server, announcing ``tools.listChanged``: the loaders change a session's tool list."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> Any:
        return super().create_initialization_options(notification_options or NotificationOptions(tools_changed=True),
                                                     *args, **kwargs)


def _agent(ctx: ServerRequestContext[Any]) -> str:
    # One MCP session is one agent. Over HTTP each request gets a fresh ServerSession, so the session is named
    # by the Mcp-Session-Id header; a stdio process serves exactly one agent.
    headers = getattr(ctx.request, "headers", None)
    agent = headers.get("mcp-session-id") if headers is not None else None
    return agent if isinstance(agent, str) and agent else "stdio"


class Surfaces:
    """The families each agent has loaded (its profile's to begin with); the least recent agents are forgotten
    past MAX_CALLERS, as the rate limiter forgets them."""

    def __init__(self, profile: Family) -> None:
        self.profile = profile
        self._loaded: LRUCache[str, frozenset[Family]] = LRUCache(MAX_CALLERS)

    def loaded(self, agent: str) -> frozenset[Family]:
        return self._loaded.get(agent) or frozenset({self.profile})

    def add(self, agent: str, families: Sequence[Family]) -> frozenset[Family]:
        self._loaded[agent] = self.loaded(agent) | set(families)
        return self._loaded[agent]


@dataclass(frozen=True)
class _AgentTools:
    """One agent's tool list, as the loaders grow it (``node.mcp.registry.AgentTools``)."""

    surfaces: Surfaces
    agent: str

    def load(self, families: Sequence[Family]) -> frozenset[Family]:
        return self.surfaces.add(self.agent, families)


# Which agent a request acts as (None: the node): stdio's is fixed, HTTP's is read from the request's token.
AgentOf = Callable[[ServerRequestContext[Any]], str | None]


def build_server(backend: ToolBackend, *, limits: LimitsConfig, session: dict[str, Any],
                 profile: str = Family.CORE, agent_of: AgentOf | None = None) -> Server[Any]:
    """An SDK ``Server`` exposing the tool table; ``session`` describes this door (transport, mode); ``agent_of``
    says which agent each call acts as (default: the node).

    Each agent starts with ``profile``'s tools listed and adds families with the loaders (docs/mcp.md)."""
    loaders = {s.name: s for s in loader_specs()}
    specs: dict[str, ToolSpec[Any]] = {**{s.name: s for s in tool_specs(limits)}, **loaders}
    tools = {name: types.Tool(name=name, description=s.summary, input_schema=s.listed_schema)
             for name, s in specs.items()}
    surfaces = Surfaces(parse_family(profile))
    loader_args = ArgValidator(loaders.values())
    limiter = RateLimiter(limits.requests_per_second)

    async def on_list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tools[n] for n in listed(tools, surfaces.loaded(_agent(ctx)))])

    async def on_call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        agent = _agent(ctx)
        door = Door(session, surfaces.profile, surfaces.loaded(agent))
        spec = specs.get(params.name)

        def admit() -> None:
            limiter.check(agent)

        if params.name not in loaders:
            principal = agent_of(ctx) if agent_of is not None else None

            async def run(name: str, args: Args) -> JSON:
                return await backend.call(name, args, principal)

            return await call_tool(run, spec, params.name, params.arguments, door, admit=admit)

        async def run_loader(name: str, args: Args) -> JSON:
            return await loaders[name].handler(_AgentTools(surfaces, agent), loader_args.check(name, args))

        before = listed(tools, door.loaded)
        result = await call_tool(run_loader, spec, params.name, params.arguments, door, admit=admit)
        if listed(tools, surfaces.loaded(agent)) != before:
            await ctx.session.send_tool_list_changed()
        return result

    return _Server(SERVER_NAME, version=_version(), instructions=instructions(limits), on_list_tools=on_list_tools,
                   on_call_tool=on_call_tool)


async def call_tool(run: Run, spec: ToolSpec[Any] | None, name: str, arguments: dict[str, Any] | None, door: Door,
                    admit: Callable[[], None] | None = None) -> types.CallToolResult:
    """One tool call as an MCP result; any exception (``rate_limited`` from ``admit`` too) becomes ``isError``.
    ``spec`` is the tool's entry (None for a name the table lacks: ``run`` refuses it, or a newer node knows it)."""
    try:
        if admit is not None:
            admit()
        result = await run(name, dict(arguments or {}))
    except Exception as exc:  # the MCP edge: every failure is reported to the caller, none crashes the session
        d = describe(exc)
        if d.code == "internal":
            log.exception("tool %s failed unexpectedly", name)
        return types.CallToolResult(content=[types.TextContent(text=f"[{d.code}] {d.message}")],
                                    structured_content={"error": {"code": d.code, "message": d.message}},
                                    is_error=True)
    if spec is not None and spec.door_view is not None and isinstance(result, dict):
        result = {**result, "mcp": spec.door_view(arguments or {}, door)}
    # Structured content must be an object through protocol 2025-11-25, so lists travel as {"results": [...]}.
    structured = result if isinstance(result, dict) else {"results": result}
    return types.CallToolResult(content=[types.TextContent(text=render(spec, name, result))],
                                structured_content=structured)


def render(spec: ToolSpec[Any] | None, name: str, result: JSON) -> str:
    """A one-line summary, then the result as JSON (for clients that read only text)."""
    if isinstance(result, list):
        head = f"{len(result)} result(s)"
    elif spec is not None and spec.headline is not None:
        head = spec.headline(result)
    else:
        head = name
    return head + "\n" + orjson.dumps(result).decode()


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("attested-mesh")
    except Exception:  # not installed as a distribution (running from a checkout)
        return ""


# ---- stdio ----------------------------------------------------------------------------------

async def open_backend(cfg: NodeConfig, *, embedded: bool = False,
                       agent: str | None = None) -> tuple[ToolBackend, dict[str, Any], Callable[[], Awaitable[None]]]:
    """Join the running node over ``cfg.socket_path``; when none answers, wait for it (``mcp.join_wait_s``) if a
    node is configured to serve this home (``served_by_node``), else open a Service here. ``embedded``: open the
    Service here without asking the socket. ``agent``: the agent every call acts as (made on first use; refused
    here, at the start, when it may not be).

    Returns (backend, session description, async close function).
    """
    if not embedded:
        client = await _join(cfg, agent)
        if client is not None:
            return client, {"transport": "stdio", "mode": "joined", "socket": str(cfg.socket_path),
                            **_as_agent(client.whoami)}, client.close
    _check_embedded_home(cfg)
    from node.assemble import open_service
    from node.mcp.backend import ServiceBackend

    service = await open_service(cfg)
    backend = ServiceBackend(service)
    try:
        whoami = await backend.hello(agent) if agent is not None else None
    except BaseException:
        await service.close()
        raise
    return backend, {"transport": "stdio", "mode": "embedded", **_as_agent(whoami)}, service.close


def _as_agent(whoami: dict[str, Any] | None) -> dict[str, Any]:
    """The session description's ``agent``: who the door acts as, when it names an agent."""
    return {} if whoami is None else {"agent": whoami.get("agent")}


async def _join(cfg: NodeConfig, agent: str | None = None) -> SocketClientBackend | None:
    """The node's socket client; None when no node answers and none is configured to serve this home."""
    try:
        return await SocketClientBackend.connect(cfg.socket_path, limits=cfg.limits, agent=agent)
    except PermissionError:
        raise files.socket_refused(cfg.socket_path) from None
    except (OSError, TimeoutError) as e:
        served = served_by_node(cfg)
        if served is None:
            log.info("no node on %s (%s); running the service embedded", cfg.socket_path, type(e).__name__)
            return None
    # One line on stderr while waiting: the MCP client shows it when its server is slow to start.
    print(f"ai-memory mcp: waiting up to {cfg.mcp.join_wait_s:g} s for the node serving {cfg.home} to answer on "
          f"{cfg.socket_path} ({served})", file=sys.stderr, flush=True)
    try:
        return await SocketClientBackend.wait(cfg.socket_path, limits=cfg.limits, within_s=cfg.mcp.join_wait_s,
                                              agent=agent)
    except ServiceError:
        raise ServiceError(ServiceCode.NODE_UNAVAILABLE,
                           f"no node answered on {cfg.socket_path} within {cfg.mcp.join_wait_s:g} s, and a node is "
                           f"configured to serve {cfg.home} ({served}), so its store is not opened beside it: start "
                           "the node (`ai-memory serve`, `systemctl start ai-memory`), or pass --embedded to open "
                           "the store in this process") from None


def served_by_node(cfg: NodeConfig) -> str | None:
    """Why a node is taken to serve this home (a sentence), or None: ``run/node.json`` (a node served it and did
    not stop cleanly, or serves it now), a node certificate, or a ``[mesh]`` table in the config."""
    if os.path.exists(cfg.status_path):
        return f"{cfg.status_path} is there"
    if os.path.exists(cfg.cert_path):
        return f"it holds a node certificate, {cfg.cert_path}"
    if cfg.mesh != MeshConfig():
        return "its config has a [mesh] table"
    return None


def _check_embedded_home(cfg: NodeConfig) -> None:
    """Refuse to serve a store nobody set up: a home that does not exist, or the default home with neither a
    database nor an identity (the client config most likely lacks --config); and a home whose files this user
    may not use (one line naming the file and the fix)."""
    files.check(cfg.home, [files.HomeFile(cfg.home, "the node home", files.Need.ENTER)])
    if not cfg.home.is_dir():
        raise ServiceError("home_not_found", f"no node home at {cfg.home} and no node answers on "
                                             f"{cfg.socket_path}; pass --config /path/node.toml (or --home DIR)")
    empty = not cfg.db_path.exists() and not any(cfg.keys_dir.glob("*.priv"))
    if empty and cfg.home == Path(DEFAULT_HOME).expanduser().absolute():
        raise ServiceError("home_empty", f"the default home {cfg.home} holds no store and no identity, and no node "
                                         f"answers on {cfg.socket_path}: the MCP client config most likely lacks "
                                         "--config /path/node.toml (or --home DIR)")
    files.check(cfg.home, cfg.home_files(serving=False))


async def run_stdio(cfg: NodeConfig, *, embedded: bool = False, agent: str | None = None) -> None:
    """Serve MCP on this process's stdin/stdout until the client closes it (``embedded``: see ``open_backend``),
    every call as ``agent`` (None: the node)."""
    backend, session, close = await open_backend(cfg, embedded=embedded, agent=agent)
    try:
        await serve_stdio(build_server(backend, limits=cfg.limits, session=session, profile=cfg.mcp.profile,
                                       agent_of=lambda ctx: agent))
    finally:
        await close()


async def serve_stdio(server: Server[Any]) -> None:
    """Run ``server`` on the SDK's stdio transport, reading stdin through ``CheckedLines``: a line the SDK
    cannot take is answered with its JSON-RPC error (docs/mcp.md, "Errors") rather than dropped."""
    answers, to_answer = anyio.create_memory_object_stream[types.JSONRPCError](ANSWERS_MAX)
    with private_stdin() as stdin:
        lines = CheckedLines(stdin, answers)
        # The transport only iterates its stdin (``async for line in stdin``), which CheckedLines does.
        async with stdio_server(stdin=cast("anyio.AsyncFile[str]", lines)) as (read_stream, write_stream):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_send_answers, to_answer, write_stream)
                await server.run(read_stream, write_stream, server.create_initialization_options())
                tg.cancel_scope.cancel()


async def _send_answers(to_answer: MemoryObjectReceiveStream[types.JSONRPCError], write_stream: Any) -> None:
    """The errors CheckedLines refused lines with, written as the server's own messages are."""
    async with to_answer:
        async for error in to_answer:
            try:
                await write_stream.send(SessionMessage(error))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return  # the session is over: nobody is left to answer


# ---- streamable HTTP ------------------------------------------------------------------------

class _EmbeddedUvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The node owns SIGINT/SIGTERM; the embedded server is stopped through its handle.
        yield


@dataclass
class HttpHandle:
    """A serving streamable-HTTP door; ``stop()`` ends it."""

    host: str
    port: int
    _server: _EmbeddedUvicorn
    _task: asyncio.Task[None]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{HTTP_PATH}"

    async def stop(self) -> None:
        """Stop accepting, close sessions, and end the server task; bounded by HTTP_STOP_TIMEOUT_S."""
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), HTTP_STOP_TIMEOUT_S)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:  # the server task's own failure was logged by uvicorn; stop still completes
            pass


def check_loopback(host: str) -> None:
    """bad_input unless ``host`` is a loopback address (or ``localhost``)."""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ServiceError("bad_input",
                           f"MCP over HTTP binds to loopback only (127.0.0.1 or ::1), refusing host {host!r}")


def _listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening TCP socket on host:port; port_in_use or cannot_listen when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        code = "port_in_use" if e.errno == errno.EADDRINUSE else "cannot_listen"
        raise ServiceError(code, f"cannot serve MCP over HTTP on {host}:{port} (mcp.http_port): "
                                 f"{e.strerror or e}") from None
    return sock


def _rebinding_guard(host: str) -> TransportSecurityMiddleware:
    """The SDK's DNS-rebinding guard as the SDK builds it for ``host`` (on for the loopback names it knows), given
    to the SDK app and to AnsweredBodies, which answers only what the guard lets through."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        return TransportSecurityMiddleware(TransportSecuritySettings(enable_dns_rebinding_protection=False))
    return TransportSecurityMiddleware(TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]))


async def start_http(backend: ToolBackend, host: str, port: int, profile: str = Family.CORE,
                     tokens: AgentTokens | None = None) -> HttpHandle:
    """Serve streamable HTTP MCP at http://host:port/mcp; port 0 picks a free port (see handle.port). ``tokens``:
    the agents' bearer tokens (a request carrying one acts as its agent; one naming no agent is answered 401)."""
    from node.mcp.agents import BearerAgents
    from node.mcp.agents import agent_of as bearer_agent

    check_loopback(host)

    def agent_of(ctx: ServerRequestContext[Any]) -> str | None:
        return None if tokens is None else bearer_agent(getattr(ctx.request, "headers", None), tokens)

    server = build_server(backend, limits=backend.limits, session={"transport": "streamable_http"}, profile=profile,
                          agent_of=agent_of)
    guard = _rebinding_guard(host)
    app: Any = AnsweredBodies(server.streamable_http_app(streamable_http_path=HTTP_PATH, host=host,
                                                         transport_security=guard.settings), HTTP_PATH, guard)
    if tokens is not None:
        app = BearerAgents(app, tokens)
    sock = _listen(host, port)
    # log_config None: uvicorn's lines go through the node's handler and formatter, not uvicorn's own.
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False, log_config=None,
                            timeout_graceful_shutdown=HTTP_GRACEFUL_S)
    userver = _EmbeddedUvicorn(config)
    task = asyncio.create_task(userver.serve(sockets=[sock]), name="mcp-http")
    bound_host, bound_port = sock.getsockname()[:2]
    handle = HttpHandle(bound_host, bound_port, userver, task)
    try:
        async with asyncio.timeout(HTTP_START_TIMEOUT_S):
            while not userver.started:
                if task.done():
                    break
                await asyncio.sleep(0.01)
    except TimeoutError:
        await handle.stop()
        sock.close()
        raise
    if not userver.started:
        await handle.stop()
        sock.close()
        exc = task.exception() if not task.cancelled() else None
        raise RuntimeError(f"MCP HTTP server failed to start on {host}:{port}: {exc!r}")
    return handle
