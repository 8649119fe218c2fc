"""`testbed fresh-check`: the README's two commands in a fresh Debian bookworm that has only Python 3.11.

The rootfs is debootstrapped once into a cache directory (minbase + python3, python3-venv, python3-pip) and
copied for every check, so each check starts from the same pristine system. A clean clone of this repository
(HEAD, not the working tree) goes to /root/attested-mesh in the copy, with the host's pip configuration (the
host reaches PyPI through it: config files, the CA bundle they name, local wheel/index directories bound
read-only at the same paths). /proc, /sys and /dev are mounted for the run and always unmounted; the copy is
removed only when nothing is mounted under it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.env import doctor
from testbed.env.image import (
    APT_TIMEOUT_S,
    DEBOOTSTRAP_TIMEOUT_S,
    SUITE,
    apt_mirror,
    mounts_under,
    run_stage,
)
from testbed.errors import TestbedError
from testbed.paths import ROOT

DEFAULT_CACHE = Path("/var/cache/attested-mesh/fresh-bookworm")
PACKAGES = ("python3", "python3-venv", "python3-pip")
REPO_IN_CHROOT = Path("/root/attested-mesh")
COMMANDS = ("scripts/test", "scripts/run")  # the README's two commands
COMMAND_TIMEOUT_S = 2400
COPY_TIMEOUT_S = 600
MOUNT_TIMEOUT_S = 30
READY_MARK = ".fresh-check-ready"
CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
              "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
# pip settings whose values may name files or directories on this host.
PIP_PATH_KEYS = ("cert", "client-cert", "find-links", "extra-index-url", "index-url", "constraint", "requirement")
PIP_CONFIG_FILES = (Path("/etc/pip.conf"), Path("/etc/xdg/pip"), Path.home() / ".config/pip",
                    Path.home() / ".pip")


def _say(msg: str) -> None:
    print(f"fresh-check: {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], timeout: float, what: str) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TestbedError("fresh_check_failed", f"{what} did not finish within {timeout:g} s") from None
    if r.returncode != 0:
        raise TestbedError("fresh_check_failed", f"{what} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")


def ensure_rootfs(cache: Path, *, rebuild: bool, mirror: str | None) -> Path:
    """The cached pristine rootfs, debootstrapped (once) when missing or when ``rebuild``."""
    rootfs = cache / "rootfs"
    if (rootfs / READY_MARK).exists() and not rebuild:
        _say(f"cached bookworm rootfs: {rootfs}")
        return rootfs
    if mounts_under(cache):
        raise TestbedError("fresh_check_failed", f"something is mounted under {cache}: {mounts_under(cache)}")
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    staging = cache / "rootfs.partial"
    log = cache / "debootstrap.log"
    mirror = mirror or apt_mirror()
    _say(f"debootstrap --variant=minbase {SUITE} from {mirror} into {staging} (once; log: {log})")
    run_stage(["debootstrap", "--variant=minbase", SUITE, str(staging), mirror], DEBOOTSTRAP_TIMEOUT_S,
               "debootstrap", log)
    _say(f"apt-get install --no-install-recommends {' '.join(PACKAGES)} in the rootfs")
    shutil.copyfile("/etc/resolv.conf", staging / "etc/resolv.conf")
    env = {"PATH": CHROOT_ENV["PATH"], "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
                ["apt-get", "clean"]):
        run_stage(["chroot", str(staging), *cmd], APT_TIMEOUT_S, " ".join(cmd[:2]), log, env)
    (staging / READY_MARK).write_text(f"{SUITE} {' '.join(PACKAGES)}\n")
    staging.rename(rootfs)
    return rootfs


def host_pip_paths() -> list[Path]:
    """Local files and directories the host's pip configuration names (CA bundle, wheel dirs, file:// indexes)."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    paths: list[Path] = []
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"[^.]*\.([a-z-]+)='(.*)'", line.strip())
        if not m or m.group(1) not in PIP_PATH_KEYS:
            continue
        for value in m.group(2).split():
            p = Path(value.removeprefix("file://"))
            # A local index's pages link to its files beside it (<root>/simple -> ../../files/...).
            if m.group(1).endswith("index-url") and value.startswith("file://"):
                p = p.parent
            if p.is_absolute() and p.exists():
                paths.append(p)
    return paths


def pip_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("PIP_")}


class Chroot:
    """A throwaway copy of the cached rootfs with the mounts a test run needs; ``with`` always unmounts."""

    def __init__(self, rootfs: Path) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="am-fresh-", dir="/var/tmp"))
        self.root = self.work / "rootfs"
        self.mounted: list[Path] = []
        _say(f"copying the rootfs to {self.root}")
        try:
            _run(["cp", "-a", str(rootfs), str(self.root)], COPY_TIMEOUT_S, "copying the rootfs")
        except TestbedError:
            shutil.rmtree(self.work, ignore_errors=True)  # nothing is mounted yet
            raise

    def mount(self, target: Path, *args: str) -> None:
        where = self.root / target.relative_to("/")
        where.mkdir(parents=True, exist_ok=True)
        _run(["mount", *args, str(where)], MOUNT_TIMEOUT_S, f"mount {' '.join(args)} {where}")
        self.mounted.append(where)

    def bind_readonly(self, host: Path) -> None:
        """``host`` at the same path inside: a copy for a file, a read-only bind mount for a directory."""
        inside = self.root / host.relative_to("/")
        if host.is_file():
            inside.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(host, inside)
            return
        self.mount(host, "--bind", str(host))
        _run(["mount", "-o", "remount,bind,ro", str(inside)], MOUNT_TIMEOUT_S, f"remount {inside} read-only")

    def __enter__(self) -> Chroot:
        try:
            self.mount(Path("/proc"), "-t", "proc", "proc")
            self.mount(Path("/sys"), "-t", "sysfs", "sysfs")
            self.mount(Path("/dev"), "--bind", "/dev")
            self.mount(Path("/dev/pts"), "--bind", "/dev/pts")
            self.mount(Path("/dev/shm"), "-t", "tmpfs", "tmpfs")
        except BaseException:
            self.__exit__()  # `with` does not call __exit__ when __enter__ fails
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for where in reversed(self.mounted):
            if subprocess.run(["umount", str(where)], capture_output=True, timeout=MOUNT_TIMEOUT_S).returncode:
                subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=MOUNT_TIMEOUT_S)
        left = mounts_under(self.work)
        if left:
            _say(f"still mounted, {self.work} kept: {left}")
            return
        shutil.rmtree(self.work, ignore_errors=True)


def install_repo(chroot: Chroot, repo: Path) -> None:
    """A clean clone of ``repo`` (its HEAD) plus the host's pip configuration, inside the chroot."""
    dest = chroot.root / REPO_IN_CHROOT.relative_to("/")
    _run(["git", "clone", "-q", "--no-hardlinks", str(repo), str(dest)], COPY_TIMEOUT_S, "git clone")
    shutil.copyfile("/etc/resolv.conf", chroot.root / "etc/resolv.conf")
    for item in PIP_CONFIG_FILES:
        if item.is_file():
            chroot.bind_readonly(item)
        elif item.is_dir():
            for f in item.rglob("*"):
                if f.is_file():
                    chroot.bind_readonly(f)
    for path in host_pip_paths():
        chroot.bind_readonly(path)


def run_inside(chroot: Chroot, command: str, log: Path) -> tuple[int, float]:
    """Run ``command`` in the repo inside the chroot, output appended to ``log``; (exit code, seconds)."""
    env = {**CHROOT_ENV, **pip_environment()}
    argv = ["chroot", str(chroot.root), "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()),
            "/bin/bash", "-c", f"cd {REPO_IN_CHROOT} && {command}"]
    t0 = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"\n$ {command}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                timeout=COMMAND_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    return rc, time.monotonic() - t0


def pytest_summary(log: Path) -> list[str]:
    """The short test summary (SKIPPED/FAILED lines) and the final counts line from a run's log."""
    lines = log.read_text(errors="replace").splitlines()
    keep = [ln for ln in lines if ln.startswith(("SKIPPED", "FAILED", "ERROR", "XFAIL"))]
    finals = [ln for ln in lines if re.match(r"^=+ .*\b(passed|failed|error)\b.* in [0-9.]+s", ln)]
    return keep + finals[-1:]


def fresh_check(repo: Path, cache: Path, log: Path, *, rebuild: bool = False, mirror: str | None = None) -> int:
    if why := doctor.missing("root", "debootstrap"):
        raise TestbedError("fresh_check_failed", why)
    rootfs = ensure_rootfs(cache, rebuild=rebuild, mirror=mirror)
    log.write_text("")
    failed = 0
    with Chroot(rootfs) as chroot:
        install_repo(chroot, repo)
        for command in COMMANDS:
            _say(f"running `{command}` in the chroot (log: {log})")
            rc, secs = run_inside(chroot, command, log)
            _say(f"`{command}`: exit {rc} after {secs:.0f} s")
            failed += rc != 0
    for line in pytest_summary(log):
        print(line)
    print(f"fresh-check: {len(COMMANDS) - failed}/{len(COMMANDS)} commands passed; full log: {log}")
    return 0 if failed == 0 else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fresh-check", help="run scripts/test and scripts/run in a fresh bookworm chroot with "
                                           "only Python 3.11 (root, debootstrap)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=ROOT, help="git repository to clone (default: this source tree)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"rootfs cache (default {DEFAULT_CACHE})")
    p.add_argument("--log", type=Path, default=Path("/var/tmp/am-fresh-check.log"),
                   help="output of both commands (default /var/tmp/am-fresh-check.log)")
    p.add_argument("--rebuild", action="store_true", help="debootstrap the cached rootfs again")
    p.add_argument("--mirror", default=None, help="Debian mirror (default: the one in /etc/apt/sources.list*)")


def cmd_fresh_check(args: argparse.Namespace) -> int:
    return fresh_check(args.repo.resolve(), args.cache, args.log, rebuild=args.rebuild, mirror=args.mirror)
