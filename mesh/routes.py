"""The paths a node serves, each spelled once (docs/protocol.md "Routes"): the mTLS mesh port's and the plain
loopback health port's."""

from __future__ import annotations

# The mesh port (mutual TLS).
WS_PATH = "/a2a/v1/ws"
MESSAGES_PATH = "/a2a/v1/messages"
SYNC_PATH = "/a2a/v1/sync"
# Both ports.
HEALTHZ_PATH = "/healthz"
# The health port only.
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"
