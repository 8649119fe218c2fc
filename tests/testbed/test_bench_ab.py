"""The before/after benches' children (testbed/bench/ab.py): a tree unpacked from git without its testbed/,
and a child run on it that takes the bench code from this tree."""

from __future__ import annotations

from pathlib import Path

from testbed.bench import ab


def test_an_unpacked_tree_holds_the_product_and_not_the_bench_code(tmp_path: Path) -> None:
    tree = ab.unpack_tree("HEAD", tmp_path)
    assert tree == tmp_path
    assert (tree / "a2a" / "__init__.py").is_file() and (tree / "node").is_dir()
    assert not (tree / "testbed").exists()


def test_an_unknown_commit_is_said_and_gives_none(tmp_path: Path) -> None:
    assert ab.unpack_tree("no-such-commit-here", tmp_path) is None


def test_a_child_runs_on_the_unpacked_tree(tmp_path: Path) -> None:
    tree = ab.unpack_tree("HEAD", tmp_path)
    assert tree is not None
    out = ab.run_child("testbed.bench.hot_path_bench", tree, ["--calls", "100"])
    assert "decode_wire" in out and "Receiver.receive_now (ping, node-like apply)" in out
    assert all(v > 0 for v in out.values())
