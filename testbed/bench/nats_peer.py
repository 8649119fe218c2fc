"""The NATS peer for the mesh bench: request/reply scatter through a local ``nats-server`` with TLS.

The bench starts Debian's ``nats-server`` on a free 127.0.0.1 port with mutual TLS (the testbed
layout's CA and node 1's Ed25519 certificate and key: Go's TLS stack takes Ed25519, so no separate
key is made), then N-1 responder subprocesses, each holding its own node's certificate, all
subscribed to one subject. The sender (the bench process, node 1's certificate) publishes each
message once to that subject with a reply subject and waits for all N-1 replies, M times in
sequence: one message to N-1 recipients, wait for all of them, as the mesh fan-out does. Each
responder INSERTs the message into its own SQLite file (WAL, synchronous=NORMAL, one commit per
message, as a node commits a lone message) before it replies.

Responder: ``python -m testbed.bench.nats_peer --url U --cert C --key K --ca CA --db DB --subject S``
prints ``ready`` once its subscription is registered with the server, replies until SIGTERM or
stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from mesh import tls
from testbed.bench import floor
from testbed.env import doctor
from testbed.mesh import procs

START_TIMEOUT_S = 15.0
IO_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
SUBJECT = "bench.scatter"
REPLY_PREFIX = "bench.reply."


# nats-py upgrades its connection with loop.start_tls() and a new StreamReaderProtocol whose connection_made() is
# never called, so the protocol does not know it runs over TLS and answers the server's close_notify as a plain
# half-close; asyncio then logs this line at every clean close (nats-io/nats.py#574 and #727, open in nats-py
# 2.16.0; nats-server 2.9.10 here cannot do TLS-first, which would avoid the upgrade). The cause is not ours and
# the line carries nothing: TLS cannot half-close, the connection closes either way.
NATS_PY_TLS_EOF = "returning true from eof_received() has no effect when using ssl"


class _NatsPyTlsEof(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != NATS_PY_TLS_EOF


@contextlib.contextmanager
def quiet_nats_py_tls_eof() -> Iterator[None]:
    """While NATS connections open and close: asyncio's logger drops exactly nats-py's line above."""
    quiet = _NatsPyTlsEof()
    logger = logging.getLogger("asyncio")
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def unavailable() -> str | None:
    """Why the NATS peer cannot run here (nats-server or nats-py missing), or None when it can."""
    missing = []
    if why := doctor.missing("nats-server"):
        missing.append(why)
    if importlib.util.find_spec("nats") is None:
        missing.append("nats-py not installed (pip install 'attested-mesh[bench]')")
    return "; ".join(missing) or None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _q(p: Path) -> str:
    return '"' + str(p).replace("\\", "\\\\").replace('"', '\\"') + '"'


class NatsServer:
    """``nats-server`` on 127.0.0.1 with mutual TLS, config and log in ``work``; ``with`` always stops it."""

    def __init__(self, work: Path, cert: Path, key: Path, ca: Path) -> None:
        self.work = work
        self.cert, self.key, self.ca = cert, key, ca
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.conf = work / "nats-server.conf"
        self.log = work / "nats-server.log"

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.port}"

    def __enter__(self) -> NatsServer:
        self.work.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.conf.write_text("\n".join([
            f'listen: "127.0.0.1:{self.port}"',
            "tls {",
            f"  cert_file: {_q(self.cert)}",
            f"  key_file: {_q(self.key)}",
            f"  ca_file: {_q(self.ca)}",
            "  verify: true",  # client certificates required, as on the mesh
            "  timeout: 5",
            "}",
            f"log_file: {_q(self.log)}",
            "",
        ]), encoding="utf-8")
        try:
            self.proc = subprocess.Popen(["nats-server", "-c", str(self.conf)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"nats-server exited with {self.proc.returncode} at start: {self._log_tail()}")
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server not listening on 127.0.0.1:{self.port} in "
                                       f"{START_TIMEOUT_S:g} s: {self._log_tail()}")
                time.sleep(0.05)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-800:]
        except OSError:
            return "(no log)"

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)


class NatsResponders:
    """N-1 responder subprocesses, one per node certificate, each with its own SQLite file."""

    def __init__(self, url: str, creds: list[tuple[Path, Path, Path]], work: Path) -> None:
        self.url = url
        self.creds = creds
        self.work = work
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> NatsResponders:
        try:
            for i, (cert, key, ca) in enumerate(self.creds, start=2):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "testbed.bench.nats_peer", "--url", self.url, "--cert", str(cert),
                     "--key", str(key), "--ca", str(ca), "--db", str(self.work / f"responder-{i}.db"),
                     "--subject", SUBJECT],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True))
            for proc in self.procs:
                _wait_ready(proc)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        procs.stop_all(self.procs, STOP_TIMEOUT_S)


def _wait_ready(proc: subprocess.Popen) -> None:
    if procs.first_line(proc, START_TIMEOUT_S, "NATS responder (waiting for ready)").strip() != b"ready":
        raise RuntimeError(f"NATS responder pid {proc.pid} failed to start (exit {proc.poll()})")


async def scatter(url: str, client_ctx, frame: bytes, receivers: int, messages: int,
                  warmup: int) -> tuple[list[float], float]:
    """Publish ``frame`` once to the shared subject and wait for all ``receivers`` replies, in sequence.

    Returns (all-reply latencies in seconds, wall seconds for the measured messages).
    """
    with quiet_nats_py_tls_eof():
        return await _scatter(url, client_ctx, frame, receivers, messages, warmup)


async def _scatter(url: str, client_ctx, frame: bytes, receivers: int, messages: int,
                   warmup: int) -> tuple[list[float], float]:
    import nats  # nats-py is optional (the [bench] extra): unavailable() says when it is missing

    nc = await nats.connect(url, tls=client_ctx, connect_timeout=IO_TIMEOUT_S, allow_reconnect=False,
                            max_reconnect_attempts=0)
    loop = asyncio.get_running_loop()
    state: dict[str, object] = {"seq": -1, "count": 0, "done": None}

    async def on_reply(msg) -> None:
        if int(msg.subject[len(REPLY_PREFIX):]) != state["seq"]:
            return  # a late reply to a timed-out message; the run fails on that timeout anyway
        state["count"] = int(state["count"]) + 1
        if state["count"] == receivers:
            state["done"].set_result(None)  # type: ignore[union-attr]

    async def one(seq: int) -> None:
        state["seq"], state["count"], state["done"] = seq, 0, loop.create_future()
        await nc.publish(SUBJECT, frame, reply=f"{REPLY_PREFIX}{seq}")
        try:
            await asyncio.wait_for(state["done"], IO_TIMEOUT_S)  # type: ignore[arg-type]
        except TimeoutError:
            raise RuntimeError(f"NATS message {seq}: {state['count']} of {receivers} replies "
                               f"in {IO_TIMEOUT_S:g} s") from None

    try:
        await nc.subscribe(REPLY_PREFIX + "*", cb=on_reply)
        await nc.flush(timeout=IO_TIMEOUT_S)
        for i in range(warmup):
            await one(i)
        samples = []
        started = time.perf_counter()
        for i in range(warmup, warmup + messages):
            t0 = time.perf_counter()
            await one(i)
            samples.append(time.perf_counter() - t0)
        return samples, time.perf_counter() - started
    finally:
        await asyncio.wait_for(nc.close(), IO_TIMEOUT_S)


# ---------------------------------------------------------------- responder process


def _open_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
        raise RuntimeError(f"could not switch {path} to WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS inbox (seq INTEGER PRIMARY KEY, subject TEXT NOT NULL, "
                 "reply TEXT NOT NULL, body BLOB NOT NULL, received_at_ms INTEGER NOT NULL)")
    return conn


async def respond(url: str, cert: Path, key: Path, ca: Path, db: Path, subject: str) -> None:
    import nats  # nats-py is optional (the [bench] extra): unavailable() says when it is missing

    conn = _open_db(db)
    ctx = tls.client_context(cert, key, ca)
    nc = await nats.connect(url, tls=ctx, connect_timeout=IO_TIMEOUT_S, allow_reconnect=False,
                            max_reconnect_attempts=0)
    seq = 0

    async def on_msg(msg) -> None:
        nonlocal seq
        seq += 1
        # One transaction and one commit per message, before the reply (the reply means "stored").
        conn.execute("BEGIN")
        conn.execute("INSERT INTO inbox (seq, subject, reply, body, received_at_ms) VALUES (?, ?, ?, ?, ?)",
                     (seq, msg.subject, msg.reply, msg.data, int(time.time() * 1000)))
        conn.execute("COMMIT")
        await nc.publish(msg.reply, b"ok")

    await nc.subscribe(subject, cb=on_msg)
    await nc.flush(timeout=IO_TIMEOUT_S)
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # The bench closes our stdin when it is done (or dies): never outlive it.
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.buffer.read1(1) else None)
    try:
        await stop.wait()
    finally:
        try:
            await asyncio.wait_for(nc.close(), IO_TIMEOUT_S)
        finally:
            conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.bench.nats_peer",
                                description="NATS scatter responder (bench peer)")
    p.add_argument("--url", required=True)
    p.add_argument("--cert", type=Path, required=True)
    p.add_argument("--key", type=Path, required=True)
    p.add_argument("--ca", type=Path, required=True)
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--subject", default=SUBJECT)
    args = p.parse_args(argv)
    floor.new_loop_policy()
    with quiet_nats_py_tls_eof():
        asyncio.run(respond(args.url, args.cert, args.key, args.ca, args.db, args.subject))
    return 0


if __name__ == "__main__":
    sys.exit(main())
