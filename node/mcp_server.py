"""The node's MCP surface on the official ``mcp`` SDK (low-level ``Server``), and its three doors:

- stdio (``run_stdio``): joins the running node over its local socket, else runs a Service embedded;
- streamable HTTP (``start_http``): loopback only, endpoint ``/mcp``, embedded in the node's event loop;
- local socket (``start_local_socket``): length-prefixed JSON RPC the node serves for ``run_stdio``.

Every tool failure becomes an MCP tool error (``isError: true``, text ``[code] message``), never a
protocol error: the client's model sees the reason and the session keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
import orjson
import uvicorn
from cachetools import LRUCache
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server

from node.config import LimitsConfig, NodeConfig
from node.errors import ServiceError, describe
from node.profiles import ABOUT, Family, listed, match_intent, parse_family
from node.ratelimit import MAX_CALLERS, RateLimiter
from node.tools import (
    CONNECT_TIMEOUT_S,
    JSON,
    LOADERS,
    MAX_FRAME_BYTES,
    ArgValidator,
    ServiceBackend,
    SocketClientBackend,
    ToolBackend,
    encode_frame,
    error_reply,
    instructions,
    loader_specs,
    read_frame,
    tool_specs,
)

log = logging.getLogger("node.mcp")

SERVER_NAME = "ai-memory"
HTTP_PATH = "/mcp"
# Bounds on the embedded HTTP server's start and stop; a loopback bind is instant.
HTTP_START_TIMEOUT_S = 5.0
HTTP_GRACEFUL_S = 2.0
HTTP_STOP_TIMEOUT_S = 5.0
# How long stop() waits for in-flight local-socket calls before cancelling them.
SOCKET_DRAIN_S = 2.0


# ---- the MCP server over a backend ----------------------------------------------------------

class _Server(Server):
    """The SDK server, announcing ``tools.listChanged``: the loaders change a session's tool list."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> Any:
        return super().create_initialization_options(notification_options or NotificationOptions(tools_changed=True),
                                                     *args, **kwargs)


def _agent(ctx: Any) -> str:
    # One MCP session is one agent. Over HTTP each request gets a fresh ServerSession, so the session is named
    # by the Mcp-Session-Id header; a stdio process serves exactly one agent.
    headers = getattr(ctx.request, "headers", None)
    return (headers.get("mcp-session-id") if headers is not None else None) or "stdio"


def build_server(backend: ToolBackend, *, limits: LimitsConfig, session: dict[str, Any],
                 profile: str = Family.CORE) -> Server:
    """An SDK ``Server`` exposing the tool table; ``session`` describes this door (transport, mode).

    Each agent starts with ``profile``'s tools listed and adds families with the loaders (docs/mcp.md)."""
    specs = tool_specs(limits) + loader_specs()
    tools = {s.name: types.Tool(name=s.name, description=s.description, input_schema=s.listed_schema)
             for s in specs}
    surfaces = Surfaces(parse_family(profile))
    loader_args = ArgValidator(loader_specs())

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tools[n] for n in listed(tools, surfaces.loaded(_agent(ctx)))])

    limiter = RateLimiter(limits.requests_per_second)

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        agent = _agent(ctx)
        if params.name in LOADERS:
            before = listed(tools, surfaces.loaded(agent))
            loader = _Loader(surfaces, agent, loader_args)
            result = await call_tool(loader, params.name, params.arguments, session,
                                     admit=lambda: limiter.check(agent))
            if listed(tools, surfaces.loaded(agent)) != before:
                await ctx.session.send_tool_list_changed()
            return result
        door = session
        if params.name == "memory_capabilities" and (params.arguments or {}).get("version") != 2:
            door = {**session, "profile": str(surfaces.profile), "loaded": sorted(map(str, surfaces.loaded(agent)))}
        return await call_tool(backend, params.name, params.arguments, door, admit=lambda: limiter.check(agent))

    return _Server(SERVER_NAME, version=_version(), instructions=instructions(limits), on_list_tools=on_list_tools,
                   on_call_tool=on_call_tool)


class Surfaces:
    """The families each agent has loaded (its profile's to begin with); the least recent agents are forgotten
    past MAX_CALLERS, as the rate limiter forgets them."""

    def __init__(self, profile: Family) -> None:
        self.profile = profile
        self._loaded: LRUCache[str, frozenset[Family]] = LRUCache(MAX_CALLERS)

    def loaded(self, agent: str) -> frozenset[Family]:
        return self._loaded.get(agent) or frozenset({self.profile})

    def add(self, agent: str, families: list[Family]) -> frozenset[Family]:
        self._loaded[agent] = self.loaded(agent) | set(families)
        return self._loaded[agent]


class _Loader:
    """The loader tools as a backend: they change what one agent's session lists, nothing in the node."""

    def __init__(self, surfaces: Surfaces, agent: str, validator: ArgValidator) -> None:
        self.surfaces, self.agent, self.validator = surfaces, agent, validator

    async def call(self, name: str, args: dict[str, Any]) -> JSON:
        args = self.validator.check(name, args)
        if name == "memory_load_family":
            try:
                families = [parse_family(args["family"])]
            except ValueError as e:
                raise ServiceError("bad_input", str(e)) from None
        else:
            families = match_intent(args["intent"])
        loaded = self.surfaces.add(self.agent, families)
        out: dict[str, Any] = {"added": [str(f) for f in families], "loaded": sorted(map(str, loaded))}
        if not families:
            out["hint"] = "no family matched; families: " + "; ".join(f"{f}: {a}" for f, a in ABOUT.items())
        return out


async def call_tool(backend: ToolBackend, name: str, arguments: dict[str, Any] | None,
                    session: dict[str, Any], admit: Callable[[], None] | None = None) -> types.CallToolResult:
    """One tool call as an MCP result; any exception (``rate_limited`` from ``admit`` too) becomes ``isError``."""
    try:
        if admit is not None:
            admit()
        result = await backend.call(name, dict(arguments or {}))
    except Exception as exc:  # the MCP edge: every failure is reported to the caller, none crashes the session
        d = describe(exc)
        if d.code == "internal":
            log.exception("tool %s failed unexpectedly", name)
        return types.CallToolResult(content=[types.TextContent(text=f"[{d.code}] {d.message}")],
                                    structured_content={"error": {"code": d.code, "message": d.message}},
                                    is_error=True)
    if name == "memory_capabilities" and isinstance(result, dict):
        result = {**result, "mcp": session}
    # Structured content must be an object through protocol 2025-11-25, so lists travel as {"results": [...]}.
    structured = result if isinstance(result, dict) else {"results": result}
    return types.CallToolResult(content=[types.TextContent(text=render(name, result))],
                                structured_content=structured)


def render(name: str, result: JSON) -> str:
    """A one-line summary, then the result as JSON (for clients that read only text)."""
    if isinstance(result, list):
        head = f"{len(result)} result(s)"
    elif name == "memory_store" or name == "memory_get":
        head = f"memory {result.get('id')}"
    elif name == "memory_link":
        head = f"link {result.get('link_id')} ({result.get('attest_level')})"
    elif name == "memory_link_many":
        head = f"{result.get('made')} link(s) made, {result.get('failed')} failed"
    elif name == "memory_verify":
        what = f"link {result['link_id']}" if "link_id" in result else f"memory {result.get('memory_id')}"
        head = f"{what}: " + ("verified" if result.get("signature_verified")
                              else f"NOT verified ({result.get('reason')})")
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

async def open_backend(cfg: NodeConfig) -> tuple[ToolBackend, dict[str, Any], Any]:
    """Join the running node over ``cfg.socket_path`` if it answers, else open a Service here.

    Returns (backend, session description, async close function).
    """
    try:
        client = await SocketClientBackend.connect(cfg.socket_path, limits=cfg.limits)
    except (OSError, TimeoutError) as e:
        log.info("no node on %s (%s); running the service embedded", cfg.socket_path, type(e).__name__)
    else:
        return client, {"transport": "stdio", "mode": "joined", "socket": str(cfg.socket_path)}, client.close

    _check_embedded_home(cfg)
    from node.assemble import open_service

    service = await open_service(cfg)
    return ServiceBackend(service), {"transport": "stdio", "mode": "embedded"}, service.close


def _check_embedded_home(cfg: NodeConfig) -> None:
    """Refuse to serve a store nobody set up: a home that does not exist, or the default home with neither a
    database nor an identity (the client config most likely lacks --config)."""
    from node.config import DEFAULT_HOME
    from node.errors import ServiceError
    if not cfg.home.is_dir():
        raise ServiceError("home_not_found", f"no node home at {cfg.home} and no node answers on "
                                             f"{cfg.socket_path}; pass --config /path/node.toml (or --home DIR)")
    empty = not cfg.db_path.exists() and not any(cfg.keys_dir.glob("*.priv"))
    if empty and cfg.home == Path(DEFAULT_HOME).expanduser().absolute():
        raise ServiceError("home_empty", f"the default home {cfg.home} holds no store and no identity, and no node "
                                         f"answers on {cfg.socket_path}: the MCP client config most likely lacks "
                                         "--config /path/node.toml (or --home DIR)")


async def run_stdio(cfg: NodeConfig) -> None:
    """Serve MCP on this process's stdin/stdout until the client closes it."""
    backend, session, close = await open_backend(cfg)
    try:
        server = build_server(backend, limits=cfg.limits, session=session, profile=cfg.mcp.profile)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await close()


# ---- streamable HTTP ------------------------------------------------------------------------

class _EmbeddedUvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The node owns SIGINT/SIGTERM; the embedded server is stopped through its handle.
        yield


@dataclass
class HttpHandle:
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
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        from node.errors import ServiceError
        raise ServiceError("bad_input",
                           f"MCP over HTTP binds to loopback only (127.0.0.1 or ::1), refusing host {host!r}")


async def start_http(backend: ToolBackend, host: str, port: int, profile: str = Family.CORE) -> HttpHandle:
    """Serve streamable HTTP MCP at http://host:port/mcp; port 0 picks a free port (see handle.port)."""
    check_loopback(host)
    limits = getattr(backend, "limits", LimitsConfig())
    server = build_server(backend, limits=limits, session={"transport": "streamable_http"}, profile=profile)
    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        from node.errors import ServiceError
        code = "port_in_use" if e.errno == errno.EADDRINUSE else "cannot_listen"
        raise ServiceError(code, f"cannot serve MCP over HTTP on {host}:{port} (mcp.http_port): "
                                 f"{e.strerror or e}") from None
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False,
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


# ---- local socket ---------------------------------------------------------------------------

@dataclass
class SocketHandle:
    path: Path
    _server: asyncio.base_events.Server
    _conns: set[asyncio.Task[Any]] = field(default_factory=set)

    async def stop(self) -> None:
        """Stop accepting, let in-flight calls finish (bounded), close connections, remove the file."""
        self._server.close()
        conns = list(self._conns)
        if conns:
            _, pending = await asyncio.wait(conns, timeout=SOCKET_DRAIN_S)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=SOCKET_DRAIN_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), SOCKET_DRAIN_S)
        await asyncio.to_thread(self.path.unlink, missing_ok=True)


async def _remove_stale_socket(path: Path) -> None:
    try:
        st = await asyncio.to_thread(path.lstat)
    except FileNotFoundError:
        return
    from node.errors import ServiceError
    if not stat.S_ISSOCK(st.st_mode):
        raise ServiceError("socket_path_taken", f"{path} exists and is not a socket; refusing to replace it")
    try:
        _, w = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        await asyncio.to_thread(path.unlink, missing_ok=True)  # nobody listens: a leftover from a node that died
        return
    w.close()
    raise ServiceError("socket_in_use", f"another process is serving {path}; is a node already running?")


async def start_local_socket(backend: ToolBackend, path: Path) -> SocketHandle:
    """Serve tool calls on a Unix socket at ``path`` (mode 0600): frames ``{tool, args}`` ->
    ``{ok: result}`` | ``{error: {code, message}}``, each a 4-byte big-endian length then JSON."""
    path = Path(path)
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)  # a private directory closes the bind-to-chmod window
    await _remove_stale_socket(path)
    conns: set[asyncio.Task[Any]] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        conns.add(task)
        try:
            await _serve_connection(backend, reader, writer)
        finally:
            conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), SOCKET_DRAIN_S)

    server = await asyncio.start_unix_server(on_connect, str(path), limit=MAX_FRAME_BYTES)
    os.chmod(path, 0o600)
    return SocketHandle(path, server, conns)


async def _serve_connection(backend: ToolBackend, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            request = await read_frame(reader)
        except Exception as exc:  # a garbled frame: say why, then drop the connection (framing is lost)
            writer.write(encode_frame(error_reply(exc)))
            await writer.drain()
            return
        if request is None:
            return
        if (not isinstance(request, dict) or not isinstance(request.get("tool"), str)
                or not isinstance(request.get("args", {}), dict)):
            reply = {"error": {"code": "bad_request",
                               "message": "request must be an object {tool: string, args: object}"}}
        else:
            try:
                reply = {"ok": await backend.call(request["tool"], request.get("args") or {})}
            except Exception as exc:  # reported to the caller; the connection keeps serving
                reply = error_reply(exc)
                if reply["error"]["code"] == "internal":
                    log.exception("local-socket call %s failed unexpectedly", request["tool"])
        try:
            writer.write(encode_frame(reply))
            await writer.drain()
        except OSError:
            return
