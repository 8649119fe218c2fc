"""testbed/'s imports run one way: no module imports, at any depth and from inside a function or not, a module
that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_under_testbed() -> dict[str, Path]:
    return {module_name(p): p for p in (ROOT / "testbed").rglob("*.py") if p.name != "sitecustomize.py"}


def imported(path: Path, modules: dict[str, Path]) -> set[str]:
    """The testbed modules ``path`` imports: ``from testbed.a import b`` names testbed.a, and testbed.a.b when
    that is a module; a package's __init__ runs before any module under it, except the packages ``path`` is
    in (they are loaded already)."""
    own = module_name(path).split(".")
    loaded = {".".join(own[:i]) for i in range(1, len(own) + 1)}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            out |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)} & modules.keys()
    return out - loaded


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_testbed_imports_run_one_way() -> None:
    modules = modules_under_testbed()
    graph = {m: imported(p, modules) - {m} for m, p in modules.items()}
    assert cycle(graph) is None


def test_a_circle_is_found() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
