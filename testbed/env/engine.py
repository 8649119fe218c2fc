"""The Docker engine the docker backend and the images use: the `docker` command, bounded, and whether the
daemon answers (`docker info`); `start_engine` starts Debian's dockerd the only way the testbed uses it (host
networking, no bridge, no iptables).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from testbed.errors import TestbedError

ENGINE_CMD = ["dockerd", "--bridge=none", "--iptables=false"]
ENGINE_LOG = Path("/var/log/dockerd-testbed.log")
# Bounds on the engine's own steps (seconds).
INFO_TIMEOUT_S = 20
ENGINE_START_TIMEOUT_S = 30

Say = Callable[[str], None]


def say_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def docker_bin() -> str:
    path = shutil.which("docker")
    if path is None:
        raise TestbedError("engine_unavailable", "no `docker` command on PATH; install the engine with "
                                                 "`apt-get install -y docker.io` (see docs/testbed.md)")
    return path


def docker(*args: str, timeout: float = 60, check: bool = True, input: bytes | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `docker ARGS`, bounded; on failure raise TestbedError with docker's own message."""
    try:
        r = subprocess.run([docker_bin(), *args], capture_output=True, timeout=timeout, input=input,
                           env=env)
    except subprocess.TimeoutExpired:
        raise TestbedError("docker_timeout", f"`docker {' '.join(args)}` did not finish within {timeout:g} s") \
            from None
    if check and r.returncode != 0:
        err = (r.stderr or r.stdout).decode(errors="replace").strip()
        raise TestbedError("docker_failed", f"`docker {' '.join(args[:3])} ...` failed ({r.returncode}): {err}")
    return r


def engine_info() -> tuple[bool, str]:
    """(reachable, server version or the reason it is not)."""
    try:
        r = docker("info", "--format", "{{.ServerVersion}}", timeout=INFO_TIMEOUT_S, check=False)
    except TestbedError as e:
        return False, e.message
    out = r.stdout.decode(errors="replace").strip()
    if r.returncode != 0 or not out or out == "<no value>":
        err = r.stderr.decode(errors="replace").strip().splitlines()
        return False, err[-1] if err else "docker info failed"
    return True, out


def require_engine() -> str:
    ok, detail = engine_info()
    if not ok:
        raise TestbedError("engine_unavailable",
                           f"the Docker engine is not reachable (`docker info`: {detail}). Start it with "
                           f"`testbed image engine --start` or `{' '.join(ENGINE_CMD)} &` "
                           "(install: `apt-get install -y docker.io`; see docs/testbed.md)")
    return detail


def start_engine(say: Say = say_stderr) -> str:
    """Start dockerd (host networking only) in the background, wait until `docker info` answers."""
    ok, detail = engine_info()
    if ok:
        say(f"engine: already running (server {detail})")
        return detail
    if shutil.which("dockerd") is None:
        raise TestbedError("engine_unavailable", "no dockerd; install it with "
                                                 "`apt-get update && apt-get install -y docker.io`")
    say(f"engine: starting `{' '.join(ENGINE_CMD)}`, log in {ENGINE_LOG}")
    log = open(ENGINE_LOG, "ab")
    try:
        subprocess.Popen(ENGINE_CMD, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    finally:
        log.close()
    deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        ok, detail = engine_info()
        if ok:
            say(f"engine: running (server {detail})")
            return detail
        time.sleep(0.5)
    raise TestbedError("engine_unavailable", f"dockerd did not answer within {ENGINE_START_TIMEOUT_S} s; "
                                             f"see {ENGINE_LOG}")
