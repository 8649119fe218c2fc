"""The floor for the mesh bench: a bare asyncio mutual-TLS 1.3 echo, no WebSocket, no CBOR, no
protocol checks, no storage. Same certificates, same payload bytes, same fan-out shape as the bench,
so "ours / floor" says what the mesh stack costs on top of the transport.

Receiver: ``python -m testbed.bench.floor --cert C --key K --ca CA`` listens on 127.0.0.1 (ephemeral
port), prints ``port <n>`` on stdout, echoes length-prefixed frames until SIGTERM or stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import struct
import subprocess
import sys
import time
from pathlib import Path

from mesh import tls
from mesh.heap import keep_tls_reads_on_the_heap
from testbed.mesh import procs

HEADER = struct.Struct("!I")
ECHO_HIGH_WATER = 1 << 20
START_TIMEOUT_S = 15.0
IO_TIMEOUT_S = 10.0


def new_loop_policy() -> None:
    """uvloop when installed, as the nodes use it, so the floor runs on the same event loop."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readexactly(HEADER.size)
            body = await reader.readexactly(HEADER.unpack(head)[0])
            writer.write(head + body)
            if writer.transport.get_write_buffer_size() > ECHO_HIGH_WATER:
                await writer.drain()  # a pipelining client: do not buffer without bound
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def serve(cert: Path, key: Path, ca: Path, host: str = "127.0.0.1") -> None:
    """Echo length-prefixed frames over mTLS on ``host``:<free port> (printed as ``port N``) until stdin closes."""
    ctx = tls.server_context(cert, key, ca)
    server = await asyncio.start_server(_echo, host, 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # The bench closes our stdin when it is done (or dies): never outlive it.
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.buffer.read1(1) else None)
    async with server:
        await stop.wait()


class FloorReceivers:
    """N echo receiver subprocesses, each with a node's certificate; ``with`` stops them all."""

    def __init__(self, creds: list[tuple[Path, Path, Path]]) -> None:
        self.creds = creds
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []

    def __enter__(self) -> FloorReceivers:
        try:
            for cert, key, ca in self.creds:
                proc = subprocess.Popen([sys.executable, "-m", "testbed.bench.floor", "--cert", str(cert),
                                         "--key", str(key), "--ca", str(ca)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
                self.procs.append(proc)
            for proc in self.procs:
                self.ports.append(read_port(proc))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        procs.stop_all(self.procs, START_TIMEOUT_S)


def read_port(proc: subprocess.Popen) -> int:
    line = procs.first_line(proc, START_TIMEOUT_S, "floor receiver (waiting for its port)").decode().split()
    if len(line) != 2 or line[0] != "port":
        raise RuntimeError(f"floor receiver pid {proc.pid} failed to start (exit {proc.poll()})")
    return int(line[1])


async def fan_out(addrs: list[tuple[str, int]], client_ctx: ssl.SSLContext, frame: bytes, messages: int,
                  warmup: int) -> tuple[list[float], float]:
    """Send ``frame`` to every receiver at ``addrs`` (host, port) and wait for every echo, ``messages`` times
    in sequence.

    Returns (all-echo latencies in seconds, wall seconds for the measured messages).
    """
    conns = [await asyncio.wait_for(asyncio.open_connection(host, port, ssl=client_ctx), IO_TIMEOUT_S)
             for host, port in addrs]
    wire = HEADER.pack(len(frame)) + frame

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(wire)
        await reader.readexactly(len(wire))

    try:
        for _ in range(warmup):
            await asyncio.wait_for(asyncio.gather(*(one(r, w) for r, w in conns)), IO_TIMEOUT_S)
        samples = []
        started = time.perf_counter()
        for _ in range(messages):
            t0 = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(one(r, w) for r, w in conns)), IO_TIMEOUT_S)
            samples.append(time.perf_counter() - t0)
        return samples, time.perf_counter() - started
    finally:
        for _, w in conns:
            w.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.bench.floor",
                                description="bare mTLS echo receiver (bench floor)")
    p.add_argument("--cert", type=Path, required=True)
    p.add_argument("--key", type=Path, required=True)
    p.add_argument("--ca", type=Path, required=True)
    args = p.parse_args(argv)
    new_loop_policy()
    keep_tls_reads_on_the_heap()  # as the nodes do: the floor's reads do not pay an mmap either
    asyncio.run(serve(args.cert, args.key, args.ca))
    return 0


if __name__ == "__main__":
    sys.exit(main())
