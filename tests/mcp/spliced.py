"""A real ``ai-memory mcp`` process driven two ways at once on one stdin: the official SDK ``ClientSession``
(initialize, normal tool calls) and raw lines the SDK would never send (broken JSON, arguments nested hundreds
of levels deep, lone surrogate escapes).

Raw lines carry string ids starting ``raw-``; an answer with such an id, or with id null (a line whose id
could not be read), goes to the raw side, every other message to the session."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession
from mcp.shared.message import SessionMessage

from tests.mcp.conftest import CALL_TIMEOUT_S

# How long a raw line's answer is waited for: far below any client's own timeout.
ANSWER_WAIT_S = 10.0


@dataclass
class Spliced:
    session: ClientSession
    proc: Process
    _raw: MemoryObjectReceiveStream[dict[str, Any]]
    _lock: anyio.Lock

    async def write(self, line: str | bytes) -> None:
        data = line.encode() if isinstance(line, str) else line
        assert self.proc.stdin is not None
        async with self._lock:
            await self.proc.stdin.send(data + b"\n")

    async def answer(self, line: str | bytes) -> dict[str, Any]:
        """Write ``line`` and return the server's answer to it (fails after ANSWER_WAIT_S without one)."""
        await self.write(line)
        with anyio.fail_after(ANSWER_WAIT_S):
            return await self._raw.receive()

    async def no_answer(self, line: str | bytes, within_s: float) -> dict[str, Any] | None:
        """Write ``line``; what answers it within ``within_s`` (None: nothing did)."""
        await self.write(line)
        with anyio.move_on_after(within_s):
            return await self._raw.receive()
        return None


def _is_raw(msg: dict[str, Any]) -> bool:
    msg_id = msg.get("id", 0)
    return "method" not in msg and (msg_id is None or (isinstance(msg_id, str) and msg_id.startswith("raw-")))


async def _read_stdout(proc: Process, to_session: MemoryObjectSendStream[SessionMessage | Exception],
                       to_raw: MemoryObjectSendStream[dict[str, Any]]) -> None:
    assert proc.stdout is not None
    buf = b""
    async with to_session, to_raw:
        async for chunk in proc.stdout:
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                msg = json.loads(line)
                if _is_raw(msg):
                    await to_raw.send(msg)
                else:
                    await to_session.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(msg)))


async def _write_stdin(spliced_write: Any, from_session: MemoryObjectReceiveStream[SessionMessage]) -> None:
    async with from_session:
        async for sm in from_session:
            await spliced_write(sm.message.model_dump_json(by_alias=True, exclude_unset=True))


@contextlib.asynccontextmanager
async def spliced_stdio(argv: list[str], env: dict[str, str], cwd: Path, errlog: Path) -> AsyncIterator[Spliced]:
    """``argv`` (an ``ai-memory mcp`` command) with an initialized SDK session and a raw line writer."""
    to_session, session_reads = anyio.create_memory_object_stream[SessionMessage | Exception](64)
    session_writes, from_session = anyio.create_memory_object_stream[SessionMessage](64)
    to_raw, raw_reads = anyio.create_memory_object_stream[dict[str, Any]](64)
    with errlog.open("ab") as err:
        proc = await anyio.open_process(argv, env=env, cwd=cwd, stderr=err)
    try:
        async with anyio.create_task_group() as tg:
            async with ClientSession(session_reads, session_writes, read_timeout_seconds=CALL_TIMEOUT_S) as session:
                spliced = Spliced(session, proc, raw_reads, anyio.Lock())
                tg.start_soon(_read_stdout, proc, to_session, to_raw)
                tg.start_soon(_write_stdin, spliced.write, from_session)
                await session.initialize()
                yield spliced
            tg.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            with anyio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
