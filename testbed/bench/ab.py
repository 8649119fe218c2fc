"""This tree against an older commit, in one run: the commit is unpacked with ``git archive`` into a temporary
directory and child processes (``python -m MODULE --child ...``) alternate between its code and this tree's
round by round, so drift on a shared machine falls on both.

A child imports the product (a2a, mesh, node, storage) from the tree it runs in and the bench code (testbed)
from this tree: the unpacked commit's testbed/ is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from testbed.paths import ROOT

CHILD_TIMEOUT_S = 300


def pct(sorted_v: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of sorted values."""
    return sorted_v[min(len(sorted_v) - 1, max(0, round(q / 100 * len(sorted_v) + 0.5) - 1))]


def run_child(module: str, tree: Path, args: list[str]) -> Any:
    """``python -m module --child ARGS`` run on ``tree``'s code (its working directory, first on PYTHONPATH);
    its JSON output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", module, "--child", *args],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    if done.returncode:
        raise RuntimeError(f"{module} child in {tree} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def unpack_tree(rev: str, into: Path) -> Path | None:
    """The repository at ``rev`` unpacked into ``into``, less its testbed/ (None, said on stderr, when git cannot
    archive it)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=False)
    if archive.returncode:
        print(f"{Path(sys.argv[0]).name}: git archive {rev}: {archive.stderr.decode().strip()}", file=sys.stderr)
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    shutil.rmtree(into / "testbed", ignore_errors=True)
    return into


def alternate(rev: str, rounds: int, module: str, child_args: list[str]) -> dict[str, list[Any]] | None:
    """``module``'s child output for ``rounds`` runs each of the tree at ``rev`` ("base") and this one ("this
    tree"), alternating which goes first round by round; None when ``rev`` cannot be unpacked."""
    with tempfile.TemporaryDirectory(prefix=f"{module.rsplit('.', 1)[-1]}-base-") as tmp:
        base = unpack_tree(rev, Path(tmp))
        if base is None:
            return None
        results: dict[str, list[Any]] = {"base": [], "this tree": []}
        for r in range(rounds):
            order = [("base", base), ("this tree", ROOT)]
            for name, tree in order if r % 2 == 0 else order[::-1]:
                results[name].append(run_child(module, tree, child_args))
            print(f"round {r + 1}/{rounds}", file=sys.stderr)
        return results


def base_parser(doc: str, base: str, rounds: int) -> argparse.ArgumentParser:
    """The options every before/after bench shares: ``--base``, ``--rounds`` and the hidden ``--child``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--base", default=base, help=f"the commit to compare against (default {base})")
    p.add_argument("--rounds", type=int, default=rounds, help=f"child processes per tree (default {rounds})")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p
