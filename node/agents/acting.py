"""The principal a local call runs as: an agent of this node (its own key, vouched for by a delegation) or, when
none is named, the node itself.

A context variable, as ``node.permissions.approvals.APPROVED`` is: the MCP doors set it around each tool call
(``acting_as``) and an approval sets it around the replay of the parked call, so the write path, the service, the
knowledge graph and the transcripts read one answer (``WritePath.agent_id``) without a principal threaded
through every signature.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from mesh.keys import Identity


@dataclass(frozen=True, slots=True)
class Principal:
    """An agent of this node: its identity (keypair under ``<home>/keys/agents/``) and the delegation this node
    signed for it (``delegation_id``), in force from ``valid_from`` until ``valid_until`` (unix ms)."""

    agent_id: str
    identity: Identity
    delegation_id: str
    valid_from: int
    valid_until: int


ACTING: ContextVar[Principal | None] = ContextVar("acting_agent", default=None)


def acting() -> Principal | None:
    """The agent the current call runs as; None: the node itself."""
    return ACTING.get()


@contextlib.contextmanager
def acting_as(principal: Principal | None) -> Iterator[None]:
    """Run the block as ``principal`` (None: as the node)."""
    token = ACTING.set(principal)
    try:
        yield
    finally:
        ACTING.reset(token)
