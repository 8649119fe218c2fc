"""Where the benches read and write: the repository they run in, and ``bench/out/`` under it, where each bench
writes its JSON by default (git ignores it)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "out"
