"""The project's version: the installed package's metadata, else pyproject.toml beside the source tree."""

from __future__ import annotations

import tomllib
from pathlib import Path

DIST_NAME = "attested-mesh"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def version() -> str:
    """e.g. "0.1.0"; "unknown" when neither the metadata nor pyproject.toml can be read."""
    # Here, not at the top: importing importlib.metadata (zipfile, email) costs a CLI command ~15 ms, and only
    # --version asks.
    from importlib import metadata

    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        pass
    try:
        return str(tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
