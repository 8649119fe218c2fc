"""Images for the Docker backend, built with no image registry (docs/testbed.md).

* engine: the Docker daemon must answer `docker info` (testbed/env/engine.py); `testbed image engine` says
  whether it does and, with --start, starts Debian's dockerd.
* base:   `debootstrap --variant=minbase bookworm` from the apt mirror this host already uses, python3 +
  python3-venv + ca-certificates added with apt-get in the chroot, then `tar | docker import`.
* node:   configs/Dockerfile FROM the base. The project and its dependencies are built into wheels on
  the host (`pip wheel`, PyPI is reachable from the host) and installed in the image with
  `pip install --no-index`, so `docker build` needs no network at all.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from node.version import version
from testbed.env import doctor
from testbed.env.engine import (
    ENGINE_CMD,
    INFO_TIMEOUT_S,
    Say,
    docker,
    docker_bin,
    engine_info,
    require_engine,
    say_stderr,
    start_engine,
)
from testbed.errors import TestbedError
from testbed.paths import ROOT

DOCKERFILE = ROOT / "configs" / "Dockerfile"
BASE_TAG = "attested-mesh-base:bookworm"
NODE_REPO = "attested-mesh-node"
# The id of the base image a node image was built on (`image node --base X` never keeps one built on another).
BASE_ID_LABEL = "attested-mesh.base-id"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bounds on every external step (seconds).
DEBOOTSTRAP_TIMEOUT_S = 1200
APT_TIMEOUT_S = 1200
IMPORT_TIMEOUT_S = 600
WHEEL_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 900
SOURCE_DIRS = ("node", "mesh", "a2a", "storage", "testbed")


def image_id(tag: str) -> str | None:
    r = docker("image", "inspect", "--format", "{{.Id}}", tag, check=False, timeout=INFO_TIMEOUT_S)
    return r.stdout.decode().strip() if r.returncode == 0 else None


# --- base image -----------------------------------------------------------------------------------

def apt_mirror(suite: str = SUITE) -> str:
    """The Debian mirror this host's apt uses for ``suite`` (sources.list or deb822 .sources)."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
                if "deb" in fields.get("Types", "").split() and suite in fields.get("Suites", "").split():
                    uris = [u for u in fields.get("URIs", "").split() if "security" not in u]
                    if uris:
                        return uris[0].rstrip("/")
        else:
            for line in text.splitlines():
                m = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)\s", line.strip() + " ")
                if m and m.group(2) == suite and "security" not in m.group(1):
                    return m.group(1).rstrip("/")
    return DEFAULT_MIRROR


def run_stage(cmd: list[str], timeout: float, what: str, log: Path, env: dict | None = None) -> None:
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise TestbedError("image_failed", f"{what} did not finish within {timeout:g} s; log: {log}") from None
    if r.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise TestbedError("image_failed", f"{what} failed ({r.returncode}); log: {log}\n{tail}")


def mounts_under(path: Path) -> list[str]:
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    p = str(path.resolve())
    return [ln.split()[1] for ln in lines if ln.split()[1] == p or ln.split()[1].startswith(p + "/")]


def build_base(tag: str = BASE_TAG, *, force: bool = False, mirror: str | None = None,
               say: Say = say_stderr) -> str:
    """Make ``tag`` from Debian packages with debootstrap + docker import; returns the image id."""
    require_engine()
    existing = image_id(tag)
    if existing and not force:
        say(f"image base: {tag} already exists ({existing[:19]}); kept (use --force to rebuild)")
        return existing
    if os.geteuid() != 0:
        raise TestbedError("image_failed", "debootstrap and chroot need root")
    if why := doctor.missing("debootstrap"):
        raise TestbedError("image_failed", why)
    mirror = mirror or apt_mirror()
    work = Path(tempfile.mkdtemp(prefix="am-base-", dir="/var/tmp"))
    rootfs = work / "rootfs"
    log = work.parent / f"{work.name}.log"
    t0 = time.monotonic()
    stage = lambda n, text: say(f"image base [{n}/5] {text} (+{time.monotonic() - t0:.0f}s)")  # noqa: E731
    try:
        stage(1, f"debootstrap --variant=minbase {SUITE} from {mirror} (log: {log})")
        run_stage(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror],
                   DEBOOTSTRAP_TIMEOUT_S, "debootstrap", log)
        stage(2, f"apt-get install {' '.join(BASE_PACKAGES)} in the chroot")
        shutil.copyfile("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
        # No service may start inside the chroot.
        (rootfs / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
        (rootfs / "usr/sbin/policy-rc.d").chmod(0o755)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
        run_stage(["chroot", str(rootfs), "apt-get", "update", "-q"], APT_TIMEOUT_S, "apt-get update", log, env)
        run_stage(["chroot", str(rootfs), "apt-get", "install", "-y", "-q", "--no-install-recommends",
                    *BASE_PACKAGES], APT_TIMEOUT_S, "apt-get install", log, env)
        stage(3, "cleaning apt caches and lists")
        run_stage(["chroot", str(rootfs), "apt-get", "clean"], APT_TIMEOUT_S, "apt-get clean", log, env)
        for d in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for entry in (rootfs / d).glob("*"):
                if entry.is_file():
                    entry.unlink()
        (rootfs / "usr/sbin/policy-rc.d").unlink()
        (rootfs / "etc/resolv.conf").write_text("")
        stage(4, f"tar -C rootfs -c . | docker import - {tag}")
        if mounts_under(rootfs):
            raise TestbedError("image_failed", f"something is mounted under {rootfs}: {mounts_under(rootfs)}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        try:
            imp = subprocess.run([docker_bin(), "import", "--change", 'CMD ["/bin/bash"]', "-", tag],
                                 stdin=tar.stdout, capture_output=True, timeout=IMPORT_TIMEOUT_S)
        finally:
            tar.stdout.close()
            tar.wait(IMPORT_TIMEOUT_S)
        if imp.returncode != 0 or tar.returncode != 0:
            raise TestbedError("image_failed", f"docker import failed: {imp.stderr.decode(errors='replace')}")
        ident = image_id(tag) or imp.stdout.decode().strip()
        size = docker("image", "inspect", "--format", "{{.Size}}", tag).stdout.decode().strip()
        stage(5, f"{tag} imported: {ident[:19]}, {int(size) / 1e6:.0f} MB")
        return ident
    finally:
        if not mounts_under(work):
            shutil.rmtree(work, ignore_errors=True)


# --- node image -----------------------------------------------------------------------------------

def source_digest(base_id: str = "") -> str:
    """A digest of what goes into the node image: the base image's id, pyproject, the Dockerfile and every
    package's .py files."""
    h = hashlib.sha256(base_id.encode() + b"\0")
    files = [ROOT / "pyproject.toml", DOCKERFILE]
    for d in SOURCE_DIRS:
        files += sorted(p for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def node_tag(base_id: str = "") -> str:
    """attested-mesh-node:<version>-<digest>: a changed source tree or another base image is another tag."""
    return f"{NODE_REPO}:{version()}-{source_digest(base_id)}"


def release_tag() -> str:
    """attested-mesh-node:<version>, also given to every node image built (configs/compose.yaml names it)."""
    return f"{NODE_REPO}:{version()}"


def build_node(tag: str | None = None, *, base: str = BASE_TAG, force: bool = False, say: Say = say_stderr) -> str:
    """Build the node image from configs/Dockerfile on ``base``; returns the tag. Kept when it exists and was built
    on ``base`` as it is now (the default tag's digest covers the base image's id; a given ``tag`` built on another
    base is rebuilt)."""
    require_engine()
    base_id = image_id(base)
    if base_id is None:
        raise TestbedError("no_base_image", f"base image {base} does not exist; build it with "
                                            f"`testbed image base --tag {base}`")
    tag = tag or node_tag(base_id)
    built_on = _label(tag, BASE_ID_LABEL)
    if built_on == base_id and not force:
        say(f"image node: {tag} already exists, built on {base} ({base_id[:19]}); kept")
        docker("tag", tag, release_tag(), timeout=INFO_TIMEOUT_S)
        return tag
    if built_on is not None and not force:
        say(f"image node: {tag} exists but was built on another base ({built_on[:19] or 'unknown'}, not {base} "
            f"{base_id[:19]}); rebuilding")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="am-node-ctx-") as ctx_s:
        ctx = Path(ctx_s)
        say("image node [1/2] pip wheel the project and its dependencies into the build context")
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                            "-w", str(ctx / "wheels"), str(ROOT)], capture_output=True, timeout=WHEEL_TIMEOUT_S)
        if r.returncode != 0:
            raise TestbedError("image_failed", f"pip wheel failed: {r.stderr.decode(errors='replace')[-2000:]}")
        shutil.copyfile(DOCKERFILE, ctx / "Dockerfile")
        n = len(list((ctx / "wheels").glob("*.whl")))
        say(f"image node [2/2] docker build {tag} FROM {base} ({n} wheels, no network) "
            f"(+{time.monotonic() - t0:.0f}s)")
        # The classic builder: no buildx plugin is needed, and the build uses no network.
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        docker("build", "--network", "none", "--build-arg", f"BASE_IMAGE={base}", "--build-arg",
               f"VERSION={version()}", "-t", tag, "-t", release_tag(), "--label", f"{BASE_ID_LABEL}={base_id}",
               "--label", f"attested-mesh.source={source_digest(base_id)}", str(ctx), timeout=BUILD_TIMEOUT_S,
               env=env)
    say(f"image node: {tag} (also {release_tag()}) built on {base} (+{time.monotonic() - t0:.0f}s)")
    return tag


def _label(tag: str, label: str) -> str | None:
    """Image ``tag``'s ``label`` ("" when it has none), or None when there is no such image."""
    r = docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', tag, check=False,
               timeout=INFO_TIMEOUT_S)
    if r.returncode != 0:
        return None
    value = r.stdout.decode().strip()
    return "" if value == "<no value>" else value


# --- CLI (`testbed image ...`) ------------------------------------------------------------------

def add_parser(sub: argparse._SubParsersAction) -> None:
    im = sub.add_parser("image", help="Docker backend: engine check, base image (debootstrap), node image")
    isub = im.add_subparsers(dest="image_cmd", required=True)
    eng = isub.add_parser("engine", help="check the Docker engine (`docker info`); --start starts dockerd "
                                         "with --bridge=none --iptables=false")
    eng.add_argument("--start", action="store_true", help="start dockerd when it is not running")
    base = isub.add_parser("base", help="debootstrap a minimal bookworm + python3 and `docker import` it",
                           description="debootstrap --variant=minbase bookworm from this host's apt mirror, "
                                       "add python3, python3-venv and ca-certificates with apt-get in the "
                                       "chroot, then `tar | docker import`. An existing tag is kept unless "
                                       "--force.")
    base.add_argument("--tag", default=BASE_TAG, help=f"image tag (default {BASE_TAG})")
    base.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    base.add_argument("--mirror", default=None, help="Debian mirror (default: the one in /etc/apt/sources.list*)")
    node = isub.add_parser("node", help="build the node image from configs/Dockerfile on the base image")
    node.add_argument("--base", default=BASE_TAG, help=f"base image (default {BASE_TAG})")
    node.add_argument("--tag", default=None, help=f"image tag (default {NODE_REPO}:<version>-<source digest>)")
    node.add_argument("--force", action="store_true", help="rebuild even when the tag exists")


def cmd_image(args: argparse.Namespace) -> int:
    if args.image_cmd == "engine":
        if args.start:
            start_engine()
            return 0
        ok, detail = engine_info()
        if ok:
            print(f"engine: reachable (server {detail})")
            return 0
        print(f"engine: NOT reachable ({detail})\nstart it with: testbed image engine --start   "
              f"(or: {' '.join(ENGINE_CMD)} &)", file=sys.stderr)
        return 1
    if args.image_cmd == "base":
        print(f"{args.tag} {build_base(args.tag, force=args.force, mirror=args.mirror)}")
        return 0
    print(build_node(args.tag, base=args.base, force=args.force))
    return 0
