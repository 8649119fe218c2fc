"""The node speaks systemd's readiness protocol (sd_notify) to a real unix datagram socket: READY=1 once it serves,
RELOADING=1 then READY=1 around a SIGHUP, STOPPING=1 when SIGTERM drains it; each message from the node's own
pid, as ``NotifyAccess=main`` requires."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from node.sdnotify import ENV, Notifier
from testbed.mesh.local import health, node_command, node_env
from tests.layouts import new_layout

WAIT_S = 60.0
CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


@contextmanager
def listener(address: str) -> Iterator[socket.socket]:
    """A datagram socket at ``address`` (a path, or "\\0name" in the abstract namespace) that receives the
    sender's credentials with each message, as systemd's notify socket does."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        s.bind(address)
        yield s
    finally:
        s.close()


def receive(s: socket.socket, timeout_s: float = WAIT_S) -> tuple[dict[str, str], int]:
    """The next message as {KEY: VALUE} and the sender's pid; fails after ``timeout_s`` without one."""
    s.settimeout(timeout_s)
    try:
        data, ancillary, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(CREDS.size))
    except TimeoutError:
        pytest.fail(f"no sd_notify message within {timeout_s:g} s")
    pid = next(CREDS.unpack(d[:CREDS.size])[0] for level, kind, d in ancillary
               if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS)
    return dict(line.split("=", 1) for line in data.decode().splitlines()), pid


def test_the_environment_variable_is_taken_so_child_processes_do_not_inherit_it() -> None:
    env = {ENV: "/run/systemd/notify", "PATH": "/usr/bin"}
    assert Notifier.from_environment(env).address == "/run/systemd/notify"
    assert env == {"PATH": "/usr/bin"}
    assert not Notifier.from_environment({}).enabled
    assert not Notifier(None).send(READY=1)


def test_an_abstract_namespace_address_is_reached(short_tmp: Path) -> None:
    name = f"am-notify-{os.getpid()}-{short_tmp.name}"
    with listener("\0" + name) as s:
        assert Notifier.from_environment({ENV: "@" + name}).ready("serving")
        fields, pid = receive(s, 5)
    assert fields == {"READY": "1", "STATUS": "serving"} and pid == os.getpid()


def test_a_socket_nobody_listens_on_is_logged_not_raised(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert not Notifier(str(short_tmp / "gone")).ready("serving")
    assert "sd_notify_failed" in caplog.text


@pytest.mark.integration
def test_serve_reports_ready_reloading_and_stopping(short_tmp: Path) -> None:
    spec = new_layout(short_tmp / "tb", 2).node(1)
    address = str(short_tmp / "notify")
    with listener(address) as s, open(spec.home / "node.log", "ab") as log:
        proc = subprocess.Popen(node_command(spec), env={**node_env(spec), ENV: address}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            fields, pid = receive(s)
            assert fields["READY"] == "1" and pid == proc.pid, fields
            assert "serving on 127.0.0.1:" in fields["STATUS"]
            # Ready means serving: the health port and the local MCP socket answer already.
            assert health(spec) is not None
            assert spec.home.joinpath("run", "node.sock").is_socket()

            proc.send_signal(signal.SIGHUP)
            reloading, pid = receive(s)
            assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0 and pid == proc.pid
            assert receive(s)[0]["READY"] == "1"

            proc.send_signal(signal.SIGTERM)
            stopping, pid = receive(s)
            assert stopping == {"STOPPING": "1", "STATUS": "draining (SIGTERM)"} and pid == proc.pid
            assert proc.wait(WAIT_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(WAIT_S)
