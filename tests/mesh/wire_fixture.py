"""Two endpoints on real mutual-TLS loopback sockets, in this process: a MeshServer with a Receiver and a
PeerLink dialling it with another identity's certificate. No mocks: the same classes the node runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from a2a import Backoff, SeenCache
from mesh import ca, keys, tls
from mesh.link import PeerLink
from mesh.linkstate import LinkState
from mesh.receive import Apply, ApplyNow, Receiver
from mesh.server import MeshServer, ServerHooks

SERVER_ID, CLIENT_ID = "ai:server@test", "ai:client@test"
GUARD_S = 30.0  # hang guard; nothing asserts on elapsed time


@dataclass
class Pki:
    ca_dir: Path
    server: keys.Identity
    client: keys.Identity
    server_cert: Path
    client_cert: Path

    def ctx(self, who: str, server: bool = False):
        ident, cert = (self.server, self.server_cert) if who == SERVER_ID else (self.client, self.client_cert)
        make = tls.server_context if server else tls.client_context
        return make(cert, ident.priv_path, self.ca_dir / "ca.crt")


def make_pki(root: Path) -> Pki:
    ca_dir = root / "ca"
    ca.init_ca(ca_dir)
    out = {}
    for agent in (SERVER_ID, CLIENT_ID):
        kd = root / agent.replace(":", "_").replace("@", "_")
        ident = keys.generate_identity(kd, agent)
        cert = kd / "node.crt"
        ca.issue_node_cert(ca_dir, agent, ident.pub_path, cert)
        out[agent] = (ident, cert)
    return Pki(ca_dir, out[SERVER_ID][0], out[CLIENT_ID][0], out[SERVER_ID][1], out[CLIENT_ID][1])


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class Pair:
    receiver: Receiver
    server: MeshServer
    link: PeerLink
    hooks: ServerHooks


@asynccontextmanager
async def pair(pki: Pki, apply: Apply, *, batch_frames: bool = True, apply_timeout_s: float = 10.0,
               member=None, member_generation=None, ack_timeout_s: float = 5.0,
               clock_ms=lambda: int(time.time() * 1000), apply_now: ApplyNow | None = None) -> AsyncIterator[Pair]:
    receiver = Receiver(SERVER_ID, SeenCache(10_000), apply, max_bytes=1 << 20, clock_ms=clock_ms,
                        apply_timeout_s=apply_timeout_s, apply_now=apply_now)
    pinned = {SERVER_ID: pki.server.public_key, CLIENT_ID: pki.client.public_key}
    hooks = ServerHooks(receiver=receiver, pinned=lambda: pinned, health=lambda: {"status": "ok"},
                        member=member, batch_frames=batch_frames)
    if member_generation is not None:
        hooks.member_generation = member_generation
    server = MeshServer(hooks, pki.ctx(SERVER_ID, server=True), "127.0.0.1", 0)
    port = await server.start()
    link = PeerLink(SERVER_ID, f"https://127.0.0.1:{port}", pki.ctx(CLIENT_ID), pinned=lambda: pinned,
                    backoff=Backoff(0.05, 0.2), ack_timeout_s=ack_timeout_s, max_bytes=1 << 20)
    task = asyncio.create_task(link.run())
    try:
        await until(lambda: link.state is LinkState.UP, "the link to come up")
        yield Pair(receiver, server, link, hooks)
    finally:
        await link.close()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), GUARD_S)
        await server.stop(2.0)
