"""The fan-out bench's sender: node 1 of a laid-out mesh, played by this process with node 1's own
certificate and key and one PeerLink per other node (as node/node.py builds its links), fanning one ``ping``
envelope out to the other N-1 nodes and waiting for every ACK, message after message."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from a2a import Backoff, new_envelope
from mesh import keys, peerkeys, tls
from mesh.link import PeerLink
from mesh.linkstate import LinkState
from node.config import load_config
from testbed.bench.figures import Measured
from testbed.errors import TestbedError
from testbed.mesh.build import MeshLayout, NodeSpec
from testbed.mesh.state import cpu_seconds
from testbed.progress import Progress

LINK_UP_TIMEOUT_S = 30.0
ACK_TIMEOUT_S = 10.0
TTL_MS = 60_000


def node_creds(spec: NodeSpec) -> tuple[Path, Path, Path]:
    """(certificate, private key, CA certificate) of the node ``spec`` lays out."""
    cfg = load_config(spec.config_path, env={})
    ident = keys.load_identity(spec.home / "keys", spec.agent_id)
    return cfg.cert_path, ident.priv_path, cfg.ca_cert_path


def ping_frame(layout: MeshLayout, sent_at_ms: int) -> tuple[str, bytes]:
    """(correlation id, wire bytes) of one ping from node 1 to every other node."""
    me = layout.node(1).agent_id
    env = new_envelope(me, [n.agent_id for n in layout.nodes[1:]], {"kind": "ping", "sent_at": sent_at_ms},
                       sent_at_ms, TTL_MS)
    return env.correlation_id, env.to_wire()


def _links(layout: MeshLayout) -> list[PeerLink]:
    cert, key, ca = node_creds(layout.node(1))
    ctx = tls.client_context(cert, key, ca)
    pinned = peerkeys.load_peer_keys(layout.node(1).home / "peers").keys
    cfg = load_config(layout.node(1).config_path, env={})
    return [PeerLink(n.agent_id, n.url, ctx, pinned=lambda: pinned,
                     backoff=Backoff(cfg.mesh.reconnect_min_s, cfg.mesh.reconnect_max_s),
                     ack_timeout_s=ACK_TIMEOUT_S, max_bytes=cfg.a2a.max_message_bytes)
            for n in layout.nodes[1:]]


async def _all_up(links: list[PeerLink]) -> None:
    deadline = time.monotonic() + LINK_UP_TIMEOUT_S
    while any(link.state is not LinkState.UP for link in links):
        if time.monotonic() > deadline:
            down = [f"{k.agent_id} ({k.last_error})" for k in links if k.state is not LinkState.UP]
            raise TestbedError("links_not_up", f"bench links not up in {LINK_UP_TIMEOUT_S:g} s: {down}")
        await asyncio.sleep(0.02)


async def bench_mesh(layout: MeshLayout, pids: list[int], messages: int, warmup: int,
                     progress: Progress | None = None) -> Measured:
    """``warmup`` unmeasured fan-outs, then ``messages`` measured ones; the receivers' CPU read from ``pids``."""
    links = _links(layout)

    async def fan(i: int) -> None:
        cid, frame = ping_frame(layout, int(time.time() * 1000))
        acks = await asyncio.gather(*(link.send_wire(cid, frame) for link in links))
        bad = [a for a in acks if not a.accepted or a.reason is not None]
        if bad:
            raise TestbedError("bench_rejected", f"message {i}: ACK {bad[0]!r}")

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(link.run(), name=f"bench-link:{link.agent_id}") for link in links]
        try:
            await _all_up(links)
            for i in range(warmup):
                await fan(i)
            cpu0 = [cpu_seconds(p) or 0.0 for p in pids]
            self0 = time.process_time()
            samples: list[float] = []
            started = time.perf_counter()
            for i in range(messages):
                t0 = time.perf_counter()
                await fan(i)
                samples.append(time.perf_counter() - t0)
                if progress is not None and i % 50 == 0:
                    progress.update(i, "messages (mesh)")
            wall = time.perf_counter() - started
            self_cpu = time.process_time() - self0
            cpu = [(cpu_seconds(p) or 0.0) - c for p, c in zip(pids, cpu0, strict=True)]
            if progress is not None:
                progress.update(messages, "messages (mesh)")
            return samples, wall, cpu, self_cpu
        finally:
            for link in links:
                await link.close()
            del tasks
