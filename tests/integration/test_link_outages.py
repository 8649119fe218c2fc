"""A peer link against a real `ai-memory serve` peer that goes down twice: each outage is logged, each
recovery too, and a connection that stayed up gives the next outage the minimum reconnect delay again."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from a2a import Backoff
from mesh import peerkeys, tls
from mesh.link import PeerLink
from mesh.linkstate import LinkState

pytestmark = pytest.mark.integration

# Fast, so that the first outage climbs well past one failure while the peer is down.
MIN_S, MAX_S = 0.05, 0.4
SETTLE_S = 0.5
GUARD_S = 60.0  # hang guard for each wait; nothing asserts on elapsed time


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def events(caplog, name: str) -> list[dict]:
    return [{**r.ev, "level": r.levelname} for r in caplog.records if r.name == "mesh.link" and r.getMessage() == name]


async def test_a_peer_that_goes_down_twice_gives_two_link_down_lines_and_a_fresh_backoff(mesh_factory, caplog):
    mesh = mesh_factory(2)
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    await asyncio.to_thread(mesh.start, [2], want_links=False)
    ctx = tls.client_context(n1.home / "tls" / "node.crt", n1.home / "keys" / f"{n1.agent_id}.priv",
                             n1.home / "tls" / "ca.crt")
    pinned = peerkeys.load_peer_keys(n1.home / "peers").keys
    backoff = Backoff(MIN_S, MAX_S)
    link = PeerLink(n2.agent_id, n2.url, ctx, pinned=lambda: pinned, backoff=backoff, ack_timeout_s=2.0,
                    max_bytes=1 << 20, settle_s=SETTLE_S)
    caplog.set_level(logging.INFO, logger="mesh.link")
    task = asyncio.create_task(link.run())
    try:
        await until(lambda: link.state is LinkState.UP, "the first connection")
        await until(lambda: link.health.settled(time.monotonic()), "the link to settle")

        # Outage 1: the peer stays down long enough for the delay to grow.
        await asyncio.to_thread(mesh.stop, 2)
        await until(lambda: link.health.failures >= 4, "several failed reconnects")
        assert link.health.outages == 1
        await asyncio.to_thread(mesh.start, [2], want_links=False)
        await until(lambda: link.state is LinkState.UP, "the link to come back")
        await until(lambda: link.health.settled(time.monotonic()), "the link to settle again")

        # Outage 2: the peer's process dies (kill -9): its socket drops with no close frame.
        await asyncio.to_thread(lambda: mesh.stop(2, kill=True))
        await until(lambda: link.health.outages == 2, "the second outage")
    finally:
        await link.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    downs = events(caplog, "link_down")
    assert [d["outages"] for d in downs] == [1, 2]
    # Each outage starts from one failure, so its first delay is drawn from the minimum's range again.
    assert [d["failures"] for d in downs] == [1, 1]
    assert all(MIN_S <= d["retry_in_s"] <= MIN_S * 2 + 1e-3 for d in downs)
    assert all(d["peer"] == n2.agent_id and d["error"] for d in downs)
    # A peer that stopped (SIGTERM: its drain closes the socket) is news; one that crashed is a warning.
    assert [(d["level"], d["peer_stopped"]) for d in downs] == [("INFO", "cleanly"), ("WARNING", "crashed")]
    ups = events(caplog, "link_up")
    assert len(ups) == 2 and "recovered" not in ups[0]
    assert ups[1]["recovered"] is True and ups[1]["outages"] == 1
