"""The link's peer check runs inside the TLS handshake (mesh/tls.py ``pinned_to``): a peer that is not the agent
dialled, or whose certificate is not over its pinned key, is refused before any request reaches it, on the
WebSocket and on a POST alike, with the check's own code."""

from __future__ import annotations

import asyncio
import time

import pytest

from a2a import Ack, Backoff, Envelope, new_envelope
from mesh import keys
from mesh.errors import MeshError
from mesh.link import PeerLink, post_envelope
from tests.mesh.wire_fixture import CLIENT_ID, SERVER_ID, pair, until


def _live() -> Envelope:
    return new_envelope(CLIENT_ID, [SERVER_ID], {"kind": "ping"}, int(time.time() * 1000), 60_000)


async def _ok(env: Envelope, sender: str) -> Ack:
    return Ack.ok(env.correlation_id, SERVER_ID)


async def _refused_link(p, pki, agent_id: str, pinned) -> PeerLink:
    link = PeerLink(agent_id, p.link.url, pki.ctx(CLIENT_ID), pinned=lambda: pinned, backoff=Backoff(0.05, 0.2),
                    ack_timeout_s=1.0, max_bytes=1 << 20)
    task = asyncio.create_task(link.run())
    try:
        await until(lambda: link.last_error_code is not None, "the link to fail")
    finally:
        await link.close()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
    return link


@pytest.mark.parametrize("case", ["another_agent", "another_key"])
async def test_a_peer_that_is_not_the_one_dialled_is_refused_in_the_handshake_and_hears_no_request(pki, case) -> None:
    requests: list[str] = []
    async with pair(pki, _ok, member=lambda peer: requests.append(peer) or True) as p:
        assert (await p.link.send(_live())).accepted
        seen = len(requests)  # the good link's upgrade
        if case == "another_agent":
            agent, pinned, code = "ai:someone-else@test", {}, "peer_identity_mismatch"
        else:
            other = keys.generate_identity(pki.ca_dir.parent / "other", SERVER_ID)
            agent, pinned, code = SERVER_ID, {SERVER_ID: other.public_key}, "peer_key_mismatch"
        link = await _refused_link(p, pki, agent, pinned)
        assert link.last_error_code == code, link.last_error
        with pytest.raises(MeshError) as info:
            await post_envelope(p.link.url, _live(), pki.ctx(CLIENT_ID), expected_agent_id=agent, pinned=pinned,
                                timeout_s=5.0, max_bytes=1 << 20)
        assert info.value.code == code
        assert len(requests) == seen  # neither the upgrade nor the POST reached the server
