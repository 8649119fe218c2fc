"""What a first `scripts/run` (or test, lint, doctor) says while it makes `.venv`: scripts/_venv.sh, run for real
on a copy of itself beside a one-module project (its own build backend), with pip offline (no index; the wheels
CPython bundles for ensurepip are the only ones it may take). A first run says each step and each package pip
collects; a run that finds the venv up to date says nothing; a failed install shows pip's own last lines and
where the whole log is, and exits 1."""

from __future__ import annotations

import ensurepip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = Path(ensurepip.__file__).parent / "_bundled"
RUN_TIMEOUT_S = 300

PYPROJECT = """\
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "first-run-probe"
version = "0.1.0"

[project.optional-dependencies]
test = []
lint = []
"""

# A PEP 517/660 build backend in the project itself, so pip needs no setuptools or wheel (nothing from an index):
# the editable wheel is a .pth file naming the project's directory.
BACKEND = """\
import base64, hashlib, os, zipfile

NAME, VERSION = "first_run_probe", "0.1.0"
DIST = NAME + "-" + VERSION


def _record(files):
    lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(path + ",sha256=" + digest + "," + str(len(data)))
    return "\\n".join(lines + [DIST + ".dist-info/RECORD,,"]) + "\\n"


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = DIST + "-py3-none-any.whl"
    files = {
        NAME + ".pth": (os.path.dirname(os.path.abspath(__file__)) + "\\n").encode(),
        DIST + ".dist-info/METADATA": ("Metadata-Version: 2.1\\nName: first-run-probe\\nVersion: " + VERSION
                                      + "\\n").encode(),
        DIST + ".dist-info/WHEEL": (b"Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\n"
                                   b"Tag: py3-none-any\\n"),
    }
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(DIST + ".dist-info/RECORD", _record(files))
    return name


build_wheel = build_editable


def get_requires_for_build_editable(config_settings=None):
    return []


def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError
"""


def _project(tmp_path: Path, backend: str = BACKEND) -> Path:
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "_venv.sh", root / "scripts" / "_venv.sh")
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "constraints.txt").write_text("")
    (root / "backend.py").write_text(backend)
    (root / "probe.py").write_text("ANSWER = 42\n")
    return root


def _source(root: Path) -> subprocess.CompletedProcess[str]:
    """``source scripts/_venv.sh`` as scripts/run does, then import the project from the venv it made."""
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "PYTHON": sys.executable, "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(BUNDLED), "PIP_NO_CACHE_DIR": "1"}
    # Inside an && list, as a caller may: errexit does not hold there, so a failure must exit on its own.
    script = 'source scripts/_venv.sh && cd / && python -c "import probe; print(probe.ANSWER)"'
    return subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)


@pytest.fixture(autouse=True)
def _bundled_wheels() -> None:
    if not any(BUNDLED.glob("pip-*.whl")):
        pytest.skip(f"this Python bundles no pip wheel in {BUNDLED} (a CPython build does; Debian's needs "
                    "apt-get install -y python3-venv)")


def test_a_first_run_says_what_it_does_and_a_later_one_says_nothing(tmp_path: Path) -> None:
    root = _project(tmp_path)
    first = _source(root)
    assert first.returncode == 0 and first.stdout == "42\n", first.stderr
    lines = first.stderr.splitlines()
    assert lines[0].startswith(f"scripts: first run: creating {root / '.venv'} with Python 3.")
    assert lines[1].startswith("scripts: installing attested-mesh and its dependencies into .venv (pip, about")
    assert f"log: {root / '.venv' / 'pip-install.log'}" in lines[1]
    assert "scripts:   upgrading pip in .venv" in lines
    assert f"scripts:   [1] Obtaining file://{root}" in lines  # the project itself, one line per package
    assert any(line.startswith("scripts:   installing ") and line.endswith("packages into .venv (the longest "
                                                                          "step, up to a minute)") for line in lines)
    assert lines[-2:] == ["scripts:   done", "scripts: the venv is ready; later runs reuse it"]
    assert all(line.startswith("scripts: ") for line in lines), first.stderr  # pip's own output stays in the log

    again = _source(root)
    assert again.returncode == 0 and again.stdout == "42\n" and again.stderr == ""


def test_a_failed_install_shows_pips_last_lines_and_the_log(tmp_path: Path) -> None:
    first = "    name = DIST"
    broken = BACKEND.replace(first, "    raise RuntimeError('am-test: this build breaks')\n" + first, 1)
    root = _project(tmp_path, broken)
    r = _source(root)
    assert r.returncode == 1 and r.stdout == ""
    assert "RuntimeError: am-test: this build breaks" in r.stderr  # pip's own lines, from the log's tail
    assert f"scripts: pip install failed; the whole output is in {root / '.venv' / 'pip-install.log'}" in r.stderr
    # Nothing is stamped: the next run installs again instead of trusting a half-made venv.
    assert not list((root / ".venv").glob(".installed-*"))
