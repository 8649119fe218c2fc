"""The service fixtures of tests/node (parametrised by storage backend), shared by the knowledge-graph tests."""

from tests.node.conftest import cfg, svc  # noqa: F401  (pytest finds fixtures by name)
