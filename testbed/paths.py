"""Where the testbed runs from: the source tree (the repository root), and ``bench/out/`` under it, where each
bench writes its JSON by default (git ignores it)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_OUT = ROOT / "bench" / "out"
