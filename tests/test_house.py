"""The shape of the house, held by CI: imports run one way (no circle, imports inside functions and under
TYPE_CHECKING included), no source file over 800 lines, no function over 60 lines outside the argument-parser
tables."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("base", "a2a", "storage", "mesh", "node", "testbed", "tools")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py"))


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str, modules: set[str]) -> Iterator[str]:
    """Every project module ``path`` imports, wherever the import stands. ``from X import name`` is an import of
    ``X.name`` when that is a module, else of ``X``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


def _graph() -> dict[str, set[str]]:
    paths = {_module(p): p for p in _sources()}
    return {module: {name for name in _imports(path, module, set(paths)) if name in paths and name != module}
            for module, path in paths.items()}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for child in graph[todo.pop()] - seen:
            seen.add(child)
            todo.append(child)
    return seen


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other in a loop, one sorted list per loop (a strongly connected component
    of more than one module)."""
    reach = {m: _reach(graph, m) for m in graph}
    circles = {tuple(sorted(m2 for m2 in reach[m] if m in reach[m2])) for m in graph if m in reach[m]}
    return sorted(list(c) for c in circles)


def test_the_check_sees_a_circle_where_there_is_one() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_anywhere_in_the_house() -> None:
    graph = _graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the scan sees the house
    assert _circles(graph) == []


def test_no_source_file_is_over_800_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert long == {}


def _is_parser_table(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return fn.name.endswith(("parser", "parsers"))


def test_no_function_is_over_60_lines_outside_the_argument_parser_tables() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_parser_table(node):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
