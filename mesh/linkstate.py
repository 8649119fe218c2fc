"""A peer link's state, apart from the link (``mesh.link.PeerLink``) so that code that only reads it (the sync
loop's "is the peer up") does not import the WebSocket client."""

from __future__ import annotations

import enum


class LinkState(enum.StrEnum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"
    CLOSED = "closed"
