"""`--version` on both commands: the installed package's version, else pyproject.toml's."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from node import version as version_mod

ROOT = Path(__file__).resolve().parents[2]


def pyproject_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


@pytest.mark.parametrize(("module", "prog"), [("node.cli", "ai-memory"), ("testbed.cli", "testbed")])
def test_version_flag_prints_the_project_version(module: str, prog: str) -> None:
    r = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{prog} {pyproject_version()}"


def test_version_falls_back_to_pyproject_without_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert version_mod.version() == pyproject_version()


def test_version_without_metadata_or_pyproject_is_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    monkeypatch.setattr(version_mod, "PYPROJECT", tmp_path / "absent.toml")
    assert version_mod.version() == "unknown"
