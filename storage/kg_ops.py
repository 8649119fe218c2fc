"""Which walk implementation serves the knowledge graph: recursive CTEs (storage/graph.py) or Cypher
on Apache AGE (storage/age.py). Both take the same arguments and return the same rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from storage import graph
from storage.graph import Edge
from storage.sqlconn import Conn

KG_BACKENDS = ("sqlite-cte", "postgres-cte", "postgres-age")


class GraphOps(Protocol):
    def reach(self, conn: Conn, start: str, depth: int, relations: Sequence[str] | None, as_of: int,
              limit: int) -> list[tuple[str, int]]: ...

    def edges_into(self, conn: Conn, dst_ids: Iterable[str], relations: Sequence[str] | None,
                   as_of: int) -> list[Edge]: ...

    def paths(self, conn: Conn, src: str, dst: str, max_depth: int, relations: Sequence[str] | None,
              as_of: int, cap: int) -> list[list[str]]: ...


class _Cte:
    reach = staticmethod(graph.reach)
    edges_into = staticmethod(graph.edges_into)
    paths = staticmethod(graph.paths)


def for_backend(name: str) -> GraphOps:
    """The walk implementation for a ``kg_backend`` name."""
    if name == "postgres-age":
        from storage.age import AgeOps
        return AgeOps()
    return _Cte()
