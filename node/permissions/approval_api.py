"""The approval API: HTTP on 127.0.0.1, every request HMAC-signed (there is no unsigned mode).

Routes (JSON; errors ``{"error": {"code", "message"}}``):

- ``GET  /v1/approvals?status=pending&limit=100``  list
- ``POST /v1/approvals/{id}/approve``  body ``{"decided_by": str, "remember": "once" | "forever"}``
- ``POST /v1/approvals/{id}/deny``     body ``{"decided_by": str}``
- ``GET  /v1/approvals/stream``  Server-Sent Events: ``approval.requested`` / ``approval.decided``, of every
  process that shares the store (``node.permissions.feed``: read from the store while a stream is open)

Signing: headers ``X-Approval-Timestamp`` (unix ms), ``X-Approval-Nonce`` (16..128 of [A-Za-z0-9_-]) and
``X-Approval-Signature``: hex HMAC-SHA256 under the key in ``<home>/keys/approval.hmac`` over
``METHOD \\n PATH?QUERY \\n TIMESTAMP \\n NONCE \\n hex(sha256(body))``. A timestamp outside
``approval.timestamp_window_s`` or a nonce already seen in that window is refused (401), so a captured
request cannot be replayed. After ``rotate_key`` the previous key verifies for ``approval.key_grace_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cachetools import TTLCache

from node.config import NodeConfig
from node.errors import ServiceError, describe
from node.permissions.feed import FEED_POLL_S, ApprovalFeed

log = logging.getLogger("node.approvals.api")

KEY_FILE = "approval.hmac"
PREV_KEY_FILE = "approval.hmac.prev"
KEY_BYTES = 32
NONCE_RE = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
MAX_BODY_BYTES = 64 * 1024
NONCES_MAX = 100_000
SSE_QUEUE_MAX = 256
SSE_HEARTBEAT_S = 15.0
STOP_TIMEOUT_S = 5.0


def key_path(cfg: NodeConfig) -> Path:
    return cfg.keys_dir / KEY_FILE


def _write_key(path: Path) -> bytes:
    key = secrets.token_bytes(KEY_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    os.replace(tmp, path)
    return key


def load_or_create_key(cfg: NodeConfig) -> bytes:
    """The approval API key (created 0600 on first use); refused when group or others may read it."""
    path = key_path(cfg)
    if not path.exists():
        return _write_key(path)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    if path.stat().st_mode & 0o077:
        raise ServiceError("key_file_mode", f"{path} is readable by group or others; chmod 600 it")
    try:
        return bytes.fromhex(path.read_text(encoding="ascii").strip())
    except ValueError:
        raise ServiceError("key_invalid", f"{path} does not hold a hex key") from None


def rotate_key(cfg: NodeConfig) -> bytes:
    """A new key; the current one becomes the previous key (valid for ``approval.key_grace_s``)."""
    path = key_path(cfg)
    if path.exists():
        prev = cfg.keys_dir / PREV_KEY_FILE
        os.replace(path, prev)
        os.utime(prev)  # its grace runs from now (the file kept the old key's creation time)
    return _write_key(path)


def sign_request(key: bytes, method: str, path_qs: str, body: bytes, timestamp_ms: int, nonce: str) -> str:
    """The hex signature a request carries in ``X-Approval-Signature``."""
    msg = "\n".join([method.upper(), path_qs, str(timestamp_ms), nonce, hashlib.sha256(body).hexdigest()])
    return hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()


def signed_headers(key: bytes, method: str, path_qs: str, body: bytes = b"") -> dict[str, str]:
    ts, nonce = time.time_ns() // 1_000_000, secrets.token_hex(16)
    return {"X-Approval-Timestamp": str(ts), "X-Approval-Nonce": nonce,
            "X-Approval-Signature": sign_request(key, method, path_qs, body, ts, nonce)}


class Unauthorized(ServiceError):
    def __init__(self, message: str) -> None:
        super().__init__("unauthorized", message)


class Verifier:
    """Checks signature, timestamp window and nonce of each request."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.window_ms = int(cfg.approval.timestamp_window_s * 1000)
        self._nonces: TTLCache[str, bool] = TTLCache(NONCES_MAX, 2 * cfg.approval.timestamp_window_s)

    def keys(self) -> list[bytes]:
        """The current key, and the previous one while its grace lasts (read per request: rotation is live)."""
        keys = [load_or_create_key(self.cfg)]
        prev = self.cfg.keys_dir / PREV_KEY_FILE
        with contextlib.suppress(FileNotFoundError):
            if time.time() - prev.stat().st_mtime <= self.cfg.approval.key_grace_s:
                keys.append(_read_key(prev))
        return keys

    def check(self, method: str, path_qs: str, headers: Any, body: bytes) -> None:
        ts_raw, nonce = headers.get("X-Approval-Timestamp"), headers.get("X-Approval-Nonce")
        sig = headers.get("X-Approval-Signature")
        if not ts_raw or not nonce or not sig:
            raise Unauthorized("unsigned request: X-Approval-Timestamp, X-Approval-Nonce and "
                               "X-Approval-Signature are required")
        if not ts_raw.isdigit() or not NONCE_RE.match(nonce):
            raise Unauthorized("X-Approval-Timestamp must be unix ms and X-Approval-Nonce 16..128 of "
                               "[A-Za-z0-9_-]")
        ts = int(ts_raw)
        now = time.time_ns() // 1_000_000
        if abs(now - ts) > self.window_ms:
            raise Unauthorized(f"timestamp {ts} is outside the {self.window_ms} ms window of this node's "
                               f"clock ({now})")
        if not any(hmac.compare_digest(sign_request(k, method, path_qs, body, ts, nonce), sig)
                   for k in self.keys()):
            raise Unauthorized("the signature does not verify under the approval key")
        if nonce in self._nonces:
            raise Unauthorized("replayed request: this nonce was already used")
        self._nonces[nonce] = True


def _error(exc: BaseException) -> web.Response:
    d = describe(exc)
    return web.json_response({"error": {"code": d.code, "message": d.message}}, status=d.http_status)


@dataclass
class ApprovalApi:
    runner: web.AppRunner
    port: int
    streams: set[Any]
    _follower: asyncio.Task[None]
    _unsubscribe: Callable[[], None]

    async def stop(self) -> None:
        self._unsubscribe()
        self._follower.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._follower, STOP_TIMEOUT_S)
        for q in list(self.streams):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)
        await asyncio.wait_for(self.runner.cleanup(), STOP_TIMEOUT_S)


BODY: web.RequestKey[bytes] = web.RequestKey("body", bytes)
Stream = asyncio.Queue[tuple[str, dict[str, Any]] | None]


class _Handlers:
    """The routes of one approval API over one service; its event streams hear ``feed``."""

    def __init__(self, service: Any, cfg: NodeConfig, feed: ApprovalFeed) -> None:
        self.service = service
        self.verifier = Verifier(cfg)
        self.feed = feed
        self.streams: set[Stream] = set()
        self._wake = asyncio.Event()
        # A poll and a first stream's rebase never interleave: what the rebase takes as old news was never sent.
        self._lock = asyncio.Lock()

    def publish(self, event: str, data: dict[str, Any]) -> None:
        for q in list(self.streams):
            with contextlib.suppress(asyncio.QueueFull):  # a reader that does not keep up loses events
                q.put_nowait((event, data))

    def wake(self, event: str, data: dict[str, Any]) -> None:
        """This process parked or decided an action: read the store now rather than at the next poll."""
        self._wake.set()

    async def follow(self) -> None:
        """While a stream is open, read the feed every FEED_POLL_S (or when woken) and publish what is new. A
        store that fails is logged once per outage; the loop goes on."""
        failing = False
        while True:
            self._wake.clear()
            if self.streams:
                try:
                    async with self._lock:
                        for event, data in await self.feed.poll():
                            self.publish(event, data)
                except Exception as e:  # the store is away or damaged: the stream waits for it
                    if not failing:
                        log.warning("approval_feed_failed", extra={"ev": {"error": describe(e).message}})
                    failing = True
                else:
                    if failing:
                        log.info("approval_feed_recovered")
                    failing = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FEED_POLL_S)

    async def _listen(self, q: Stream) -> None:
        async with self._lock:
            if not self.streams:
                await self.feed.rebase()  # the first stream: what is in the store now is old news
            self.streams.add(q)

    @web.middleware
    async def signed(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        body = await request.content.read(MAX_BODY_BYTES + 1)
        try:
            if len(body) > MAX_BODY_BYTES:
                raise ServiceError("too_large", f"request body over {MAX_BODY_BYTES} bytes")
            self.verifier.check(request.method, request.path_qs, request.headers, body)
        except ServiceError as e:
            if e.code == "unauthorized":
                log.warning("approval_api_unauthorized", extra={"ev": {"path": request.path, "reason": e.message,
                                                                       "remote": request.remote}})
            return _error(e)
        request[BODY] = body
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception as e:  # every failure is a JSON error; unexpected ones are logged
            if describe(e).code == "internal":
                log.exception("approval api failed")
            return _error(e)

    async def list_(self, request: web.Request) -> web.Response:
        q = request.query
        try:
            limit = int(q.get("limit", "100"))
        except ValueError:
            raise ServiceError("bad_input", f"limit must be an integer, got {q.get('limit')!r}") from None
        results = await self.service.approval_list(status=q.get("status", "pending"), limit=limit)
        return web.json_response({"results": results})

    async def decide(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(request[BODY] or b"{}")
        except ValueError:
            raise ServiceError("bad_input", "the body must be a JSON object") from None
        if not isinstance(body, dict) or set(body) - {"decided_by", "remember"}:
            raise ServiceError("bad_input", "the body must be a JSON object with only decided_by and remember")
        decided = await self.service.approval_decide(request.match_info["id"], request.match_info["choice"],
                                                     decided_by=body.get("decided_by", "api"),
                                                     remember=body.get("remember", "once"))
        return web.json_response(decided)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        q: Stream = asyncio.Queue(SSE_QUEUE_MAX)
        try:
            try:
                await self._listen(q)
            except Exception as e:  # the store is away: end this stream (the client reconnects) with the reason
                log.warning("approval_stream_refused", extra={"ev": {"error": describe(e).message}})
                await resp.write(f": {describe(e).code}\n\n".encode())
                return resp
            await resp.write(b": connected\n\n")
            while (item := await self._next(q)) is not None:
                await resp.write(item)
        except ConnectionResetError:
            pass
        finally:
            self.streams.discard(q)
        return resp

    async def _next(self, q: Stream) -> bytes | None:
        """The next SSE frame: an event, a heartbeat comment after SSE_HEARTBEAT_S, or None at stop."""
        try:
            item = await asyncio.wait_for(q.get(), SSE_HEARTBEAT_S)
        except TimeoutError:
            return b": heartbeat\n\n"
        if item is None:
            return None
        event, data = item
        return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def start_approval_api(service: Any, cfg: NodeConfig, port: int | None = None) -> ApprovalApi:
    """Serve the approval API on ``approval.http_host``:``port`` (default ``approval.http_port``; 0 = any)."""
    load_or_create_key(cfg)
    approvals = service.approvals
    h = _Handlers(service, cfg, ApprovalFeed(approvals.db, approvals.clock, cfg.approval.sweep_interval_s))
    app = web.Application(middlewares=[h.signed], client_max_size=MAX_BODY_BYTES)
    app.add_routes([web.get("/v1/approvals", h.list_), web.get("/v1/approvals/stream", h.stream),
                    web.post(r"/v1/approvals/{id}/{choice:approve|deny}", h.decide)])
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, cfg.approval.http_host, cfg.approval.http_port if port is None else port)
    await site.start()
    bound = runner.addresses[0][1]
    unsubscribe = approvals.subscribe(h.wake)
    follower = asyncio.get_running_loop().create_task(h.follow(), name="approval-feed")
    return ApprovalApi(runner, bound, h.streams, follower, unsubscribe)
