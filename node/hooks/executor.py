"""Running hook programs: ``ExecRunner`` (a subprocess per fire) and ``DaemonRunner`` (one long-lived child).

Both take an event and its payload with a time budget (seconds) and return a parsed ``Decision`` or raise
``HookFailed`` (timeout, crash, malformed answer, unavailable). Every child runs in its own process group,
so a kill reaches whatever it spawned, and every child is reaped: after each exec fire, and on ``close()``.

Wire (docs/hooks.md): exec reads one JSON object ``{hook, event, payload, deadline_ms}`` on stdin and prints
one decision object on stdout. A daemon reads JSON-RPC 2.0 requests, one per line,
``{"jsonrpc": "2.0", "id": n, "method": "fire", "params": {hook, event, payload, deadline_ms}}``, answers
``{"jsonrpc": "2.0", "id": n, "result": <decision>}`` per line (in any order), and exits on stdin EOF or a
``shutdown`` notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from a2a.retry import Backoff
from node.config import HooksConfig
from node.hooks.config import HookSpec
from node.hooks.decision import Decision, DecisionError, Failure, parse_decision
from node.hooks.events import SPECS, HookEvent

log = logging.getLogger("node.hooks")

# Bound on reaping a child after SIGKILL; the kernel needs microseconds, this covers a loaded machine.
REAP_TIMEOUT_S = 5.0
# A hook's stderr is logged, at most this much per chunk.
STDERR_LOG_CHARS = 500
EXEC_STDERR_CAP = 64 * 1024


class HookFailed(Exception):
    """A hook gave no usable answer."""

    def __init__(self, failure: Failure, detail: str) -> None:
        super().__init__(detail)
        self.failure = failure
        self.detail = detail


class Runner(Protocol):
    spec: HookSpec

    async def call(self, event: HookEvent, payload: Mapping[str, Any], timeout_s: float) -> Decision: ...

    def state(self) -> dict[str, Any]: ...

    async def retire(self, grace_s: float) -> None: ...

    async def close(self) -> None: ...


def make_runner(spec: HookSpec, settings: HooksConfig) -> Runner:
    from node.hooks.config import Mode
    if spec.mode is Mode.DAEMON:
        return DaemonRunner(spec, settings)
    return ExecRunner(spec, settings)


def _params(spec: HookSpec, event: HookEvent, payload: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    return {"hook": spec.name, "event": str(event), "payload": payload, "deadline_ms": int(timeout_s * 1000)}


def _json_default(obj: Any) -> Any:
    """What orjson does not know: bytes as hex (signatures), mappings and sets as objects and lists."""
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def to_json(obj: Any) -> bytes:
    """A request as hooks read it (JSON bytes)."""
    return orjson.dumps(obj, default=_json_default)


def _env(spec: HookSpec) -> dict[str, str]:
    return {**os.environ, **dict(spec.env), "AI_MEMORY_HOOK_NAME": spec.name}


def _decode(raw: bytes, event: HookEvent) -> Decision:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise HookFailed(Failure.MALFORMED, f"printed something that is not JSON ({e}): {_clip(raw)}") from None
    return _parse(obj, event)


def _parse(obj: Any, event: HookEvent) -> Decision:
    try:
        return parse_decision(obj, SPECS[event])
    except DecisionError as e:
        raise HookFailed(Failure.MALFORMED, f"answered an invalid decision: {e}") from None


def _clip(raw: bytes, n: int = 120) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return repr(text if len(text) <= n else text[:n] + "...")


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # start_new_session=True made the child a group leader: its group id is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _reap(proc: asyncio.subprocess.Process) -> int | None:
    try:
        return await asyncio.wait_for(proc.wait(), REAP_TIMEOUT_S)
    except TimeoutError:
        log.warning("hook_not_reaped", extra={"ev": {"pid": proc.pid}})
        return None


async def _read_capped(stream: asyncio.StreamReader | None, cap: int) -> tuple[bytes, bool]:
    """Everything up to EOF, or the first ``cap`` bytes and True when there was more."""
    if stream is None:
        return b"", False
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return b"".join(chunks), False
        size += len(chunk)
        if size > cap:
            return b"".join(chunks), True
        chunks.append(chunk)


# ---- exec -----------------------------------------------------------------------------------

class ExecRunner:
    """A subprocess per fire; SIGKILLed (with its group) when it outlives its budget."""

    def __init__(self, spec: HookSpec, settings: HooksConfig) -> None:
        self.spec = spec
        self.settings = settings
        self._live: set[asyncio.subprocess.Process] = set()
        self.spawned = 0

    def state(self) -> dict[str, Any]:
        return {"mode": "exec", "state": "running" if self._live else "idle", "running": len(self._live),
                "spawned": self.spawned}

    async def call(self, event: HookEvent, payload: Mapping[str, Any], timeout_s: float) -> Decision:
        request = to_json(_params(self.spec, event, payload, timeout_s))
        ms = int(timeout_s * 1000)
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *self.spec.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE, cwd=self.spec.cwd, env=_env(self.spec),
                        start_new_session=True)
                except OSError as e:
                    raise HookFailed(Failure.CRASHED, f"could not be started ({e})") from None
                self.spawned += 1
                self._live.add(proc)
                try:
                    out, rc = await self._talk(proc, request)
                finally:
                    if proc.returncode is None:
                        _kill_group(proc)
                        await _reap(proc)
                    self._live.discard(proc)
        except TimeoutError:
            raise HookFailed(Failure.TIMEOUT, f"did not answer within {ms} ms (killed)") from None
        if rc != 0:
            raise HookFailed(Failure.CRASHED, f"exited with status {rc}")
        return _decode(out, event)

    async def _talk(self, proc: asyncio.subprocess.Process, request: bytes) -> tuple[bytes, int]:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(request)
            await proc.stdin.drain()
            proc.stdin.close()
        (out, over), (err, _) = await asyncio.gather(_read_capped(proc.stdout, self.settings.max_reply_bytes),
                                                     _read_capped(proc.stderr, EXEC_STDERR_CAP))
        if over:
            raise HookFailed(Failure.MALFORMED, f"printed more than {self.settings.max_reply_bytes} bytes")
        rc = await proc.wait()
        if err.strip():
            log.info("hook_stderr", extra={"ev": {"hook": self.spec.name, "text": _clip(err, STDERR_LOG_CHARS)}})
        return out, rc

    async def retire(self, grace_s: float) -> None:
        # Nothing lives between fires: fires still running finish (or hit their deadline) on their own.
        return None

    async def close(self) -> None:
        for proc in list(self._live):
            _kill_group(proc)
        for proc in list(self._live):
            await _reap(proc)


# ---- daemon ---------------------------------------------------------------------------------

class DaemonRunner:
    """One long-lived child per hook, started on first use, restarted with backoff after it dies.

    At most ``daemon_queue_max`` requests are outstanding; further fires wait for a slot within their
    own budget (backpressure instead of an unbounded pipe).
    """

    def __init__(self, spec: HookSpec, settings: HooksConfig) -> None:
        self.spec = spec
        self.settings = settings
        self._backoff = Backoff(settings.daemon_restart_min_s, settings.daemon_restart_max_s)
        self._slots = asyncio.Semaphore(settings.daemon_queue_max)
        self._start_lock = asyncio.Lock()
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._in_flight = 0
        self.peak_outstanding = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._failures = 0
        self._restart_at = 0.0
        self._timeouts_in_row = 0
        self._stopping = False
        self.starts = 0
        self.exits = 0
        self.last_exit: str | None = None

    def state(self) -> dict[str, Any]:
        if self._stopping:
            state = "stopped"
        elif self._proc is not None:
            state = "running"
        elif self.starts == 0:
            state = "not_started"
        else:
            state = "backoff"
        return {"mode": "daemon", "state": state, "pid": self._proc.pid if self._proc else None,
                "starts": self.starts, "restarts": max(0, self.starts - 1), "exits": self.exits,
                "last_exit": self.last_exit, "in_flight": self._in_flight, "outstanding": len(self._pending),
                "peak_outstanding": self.peak_outstanding, "queue_max": self.settings.daemon_queue_max}

    async def call(self, event: HookEvent, payload: Mapping[str, Any], timeout_s: float) -> Decision:
        ms = int(timeout_s * 1000)
        self._in_flight += 1
        self._idle.clear()
        try:
            async with asyncio.timeout(timeout_s):
                async with self._slots:
                    reply = await self._request(event, payload, timeout_s)
        except TimeoutError:
            self._timeouts_in_row += 1
            if self._timeouts_in_row >= self.settings.daemon_max_timeouts and self._proc is not None:
                log.warning("hook_daemon_unresponsive", extra={"ev": {"hook": self.spec.name,
                                                                      "timeouts_in_row": self._timeouts_in_row}})
                _kill_group(self._proc)  # the reader sees EOF, reaps it and schedules the restart
            raise HookFailed(Failure.TIMEOUT, f"did not answer within {ms} ms") from None
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        self._timeouts_in_row = 0
        self._failures = 0
        return _parse(reply, event)

    async def _request(self, event: HookEvent, payload: Mapping[str, Any], timeout_s: float) -> Any:
        proc = await self._ensure_started()
        loop = asyncio.get_running_loop()
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[rid] = fut
        self.peak_outstanding = max(self.peak_outstanding, len(self._pending))
        try:
            line = to_json({"jsonrpc": "2.0", "id": rid, "method": "fire",
                           "params": _params(self.spec, event, payload, timeout_s)}) + b"\n"
            assert proc.stdin is not None
            try:
                proc.stdin.write(line)
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise HookFailed(Failure.CRASHED, "daemon closed its stdin") from None
            return await fut
        finally:
            self._pending.pop(rid, None)

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        async with self._start_lock:
            if self._stopping:
                raise HookFailed(Failure.UNAVAILABLE, "is stopped")
            if self._proc is not None:
                return self._proc
            wait = self._restart_at - asyncio.get_running_loop().time()
            if wait > 0:
                await asyncio.sleep(wait)  # bounded by the caller's budget
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.spec.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, cwd=self.spec.cwd, env=_env(self.spec),
                    start_new_session=True, limit=self.settings.max_reply_bytes)
            except OSError as e:
                self._schedule_restart(f"could not be started ({e})")
                raise HookFailed(Failure.CRASHED, f"could not be started ({e})") from None
            self.starts += 1
            self._proc = proc
            log.info("hook_daemon_started", extra={"ev": {"hook": self.spec.name, "pid": proc.pid,
                                                          "starts": self.starts}})
            for coro, name in ((self._read_replies(proc), "replies"), (self._read_stderr(proc), "stderr")):
                task = asyncio.create_task(coro, name=f"hook:{self.spec.name}:{name}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return proc

    def _schedule_restart(self, why: str) -> None:
        self._failures += 1
        self.last_exit = why
        self._restart_at = asyncio.get_running_loop().time() + self._backoff.next_delay(self._failures - 1)

    async def _read_replies(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        why = "closed its stdout"
        try:
            while True:
                line = await proc.stdout.readline()
                if not line:
                    break
                self._on_line(line)
        except ValueError:  # a line past max_reply_bytes: the stream cannot be resynchronised
            why = f"printed a line longer than {self.settings.max_reply_bytes} bytes"
            _kill_group(proc)
        rc = await _reap(proc) if proc.returncode is None else proc.returncode
        if rc is None:
            _kill_group(proc)
        self._on_exit(proc, f"{why}; exit status {rc}")

    def _on_line(self, line: bytes) -> None:
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            msg = None
        rid = msg.get("id") if isinstance(msg, dict) and msg.get("jsonrpc") == "2.0" else None
        fut = self._pending.get(rid) if isinstance(rid, int) else None
        if fut is None or fut.done() or not isinstance(msg, dict):
            log.warning("hook_stray_output", extra={"ev": {"hook": self.spec.name, "line": _clip(line)}})
            return
        if "result" in msg:
            fut.set_result(msg["result"])
        else:
            err = msg.get("error")
            fut.set_exception(HookFailed(Failure.MALFORMED if not isinstance(err, dict) else Failure.CRASHED,
                                         f"answered a JSON-RPC error: {_clip(orjson.dumps(err))}"))

    def _on_exit(self, proc: asyncio.subprocess.Process, why: str) -> None:
        if self._proc is proc:
            self._proc = None
        self.exits += 1
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(HookFailed(Failure.CRASHED, f"daemon exited ({why})"))
        if not self._stopping:
            self._schedule_restart(why)
            log.warning("hook_daemon_exited", extra={"ev": {"hook": self.spec.name, "pid": proc.pid, "why": why,
                                                            "restart_in_s": round(self._restart_in(), 3)}})

    def _restart_in(self) -> float:
        return max(0.0, self._restart_at - asyncio.get_running_loop().time())

    async def _read_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(4096):
            log.info("hook_stderr", extra={"ev": {"hook": self.spec.name,
                                                  "text": _clip(chunk, STDERR_LOG_CHARS)}})

    async def retire(self, grace_s: float) -> None:
        """Let requests in flight finish (up to ``grace_s``), then stop: the reload path."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace_s)
        await self.close()

    async def close(self) -> None:
        """Close stdin (and say shutdown), wait ``daemon_stop_grace_s``, then SIGKILL; always reaps."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            assert proc.stdin is not None
            with contextlib.suppress(OSError, RuntimeError):
                proc.stdin.write(b'{"jsonrpc": "2.0", "method": "shutdown"}\n')
                proc.stdin.close()
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), self.settings.daemon_stop_grace_s)
            except TimeoutError:
                _kill_group(proc)
                await _reap(proc)
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=REAP_TIMEOUT_S)
            for t in pending:
                t.cancel()
