"""CPU a received link costs a node, against an older commit, in one run.

    .venv/bin/python -m testbed.bench.receive_bench [--base bf3c103] [--rounds 5] [--envelopes 60]
        [--links-per-envelope 100]

Each child process opens a real node store (SQLite file, writer thread, verify thread) with one peer's
public key imported, stores 300 of that peer's memories, then decodes and applies ``--envelopes``
``links.put`` envelopes of ``--links-per-envelope`` links each (100), every link signed by the peer with Ed25519
(signed before the clock starts). Per envelope it takes the process's CPU time (every thread: the event loop, signature
verification, the writer, the readers) and the wall time from the frame's bytes to the ACK, over the
links it carried, and the longest a 1 ms loop timer waited past its time while the envelope was applied (the
longest stretch a ping's read would wait behind). This is the work a receiving node (B or C in
federation_bench) does per link outside the transport. The code at ``--base`` and this tree's take turns
(ab.py here). Prints p50 / p95 / p99 over all envelopes of all rounds and the ratio of this tree's
p50 to the base's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from a2a import new_envelope
from a2a.envelope import decode_wire
from mesh import keys, peerkeys
from node import attest
from node.assemble import open_service
from node.attest import LinkPayload
from node.config import from_dict
from testbed.bench.ab import alternate, base_parser, pct

PEER, ME = "ai:bench-peer@lab", "ai:bench-node@lab"
MEMORIES = 300
LINKS_PER_ENVELOPE = 100  # the default: a full links.put


async def _measure(home: Path, envelopes: int, per: int) -> dict[str, list[float]]:
    cfg = from_dict({"agent_id": ME, "home": str(home)}, env={})
    keys.generate_identity(cfg.keys_dir, ME)
    peer = keys.generate_identity(home / "peer-keys", PEER)
    peerkeys.import_peer(cfg.peers_dir, peer.pub_path)
    svc = await open_service(cfg, require_identity=True)
    try:
        now = int(time.time() * 1000)
        ids = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(MEMORIES)]
        for mid in ids:
            memory = {"id": mid, "namespace": "default", "title": "", "content": f"content of {mid}", "tags": [],
                      "priority": 5, "confidence": 1.0, "source": "", "origin": PEER, "writer": PEER, "version": 1,
                      "created_at": now, "updated_at": now}
            env = new_envelope(PEER, [ME], {"kind": "memory.put", "memory": memory, "signature": None,
                                            "signed_by": None}, now, 600_000)
            if not (await svc.replicator.apply(env, PEER)).accepted:
                raise RuntimeError("seeding a memory was refused")
        wires = []
        for e in range(envelopes):
            items = []
            for i in range(per):
                n = e * per + i
                link = LinkPayload(src_id=ids[n % MEMORIES], dst_id=ids[(n * 7 + 1) % MEMORIES],
                                   relation=f"bench_{n}", observed_by=PEER, valid_from=now - 1000, valid_until=None)
                items.append({"link": link.to_dict(), "signature": attest.sign(peer.private_key, link),
                              "signed_by": PEER})
            wires.append(new_envelope(PEER, [ME], {"kind": "links.put", "links": items}, now, 600_000).to_wire())
        cpu_us: list[float] = []
        wall_us: list[float] = []
        stretch_us: list[float] = []
        lag = _Lag(asyncio.get_running_loop())
        try:
            for wire in wires:
                await asyncio.sleep(0.002)  # the timer settles (as a node between envelopes)
                lag.worst = 0.0
                c0, w0 = time.process_time(), time.perf_counter()
                ack = await svc.replicator.apply(decode_wire(wire, 1 << 20), PEER)
                c1, w1 = time.process_time(), time.perf_counter()
                if not ack.accepted:
                    raise RuntimeError(f"links.put refused: {ack.reason}")
                cpu_us.append((c1 - c0) / per * 1e6)
                wall_us.append((w1 - w0) / per * 1e6)
                stretch_us.append(lag.worst * 1e6)
        finally:
            lag.stop()
        return {"CPU a link (all threads)": cpu_us, "wall a link": wall_us,
                "longest loop stretch an envelope (1 ms timer late by)": stretch_us}
    finally:
        await svc.close()


class _Lag:
    """A 1 ms loop timer that keeps the most it ran late (s): how long the loop ran other work without a turn."""

    PERIOD_S = 0.001

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.worst = 0.0
        self._due = loop.time() + self.PERIOD_S
        self._handle = loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now = self.loop.time()
        self.worst = max(self.worst, now - self._due)
        self._due = now + self.PERIOD_S
        self._handle = self.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        self._handle.cancel()


def child(envelopes: int, per: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="receive-bench-") as tmp:
        return asyncio.run(_measure(Path(tmp) / "home", envelopes, per))


def main() -> int:
    p = base_parser(__doc__, "bf3c103", 5)
    p.add_argument("--envelopes", type=int, default=60, help="links.put envelopes per child (default 60)")
    p.add_argument("--links-per-envelope", type=int, default=LINKS_PER_ENVELOPE,
                   help=f"links in each links.put (default {LINKS_PER_ENVELOPE}; 2..100)")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.envelopes, args.links_per_envelope)))
        return 0
    if not 1 <= args.rounds <= 50 or not 5 <= args.envelopes <= 1000 or not 2 <= args.links_per_envelope <= 100:
        p.error("--rounds must be 1..50, --envelopes 5..1000 and --links-per-envelope 2..100")
    runs = alternate(args.base, args.rounds, "testbed.bench.receive_bench",
                     ["--envelopes", str(args.envelopes), "--links-per-envelope", str(args.links_per_envelope)])
    if runs is None:
        return 2
    results: dict[str, dict[str, list[float]]] = {"base": {}, "this tree": {}}
    for name, outputs in runs.items():
        for got in outputs:
            for piece, values in got.items():
                # The first envelopes warm caches and the writer: the first tenth of each child is left out.
                results[name].setdefault(piece, []).extend(values[len(values) // 10:])
    print(f"`.venv/bin/python -m testbed.bench.receive_bench --base {args.base} --rounds {args.rounds} "
          f"--envelopes {args.envelopes} --links-per-envelope {args.links_per_envelope}` ({os.cpu_count()} CPUs)\n")
    print("| per received link (the stretch: per envelope) | base p50 / p95 / p99 (µs) | "
          "this tree p50 / p95 / p99 (µs) | p50 this tree / base |")
    print("|---|---|---|---:|")
    for piece in results["base"]:
        (b50, b95, b99), (t50, t95, t99) = (
            tuple(pct(sorted(results[name][piece]), q) for q in (50, 95, 99)) for name in ("base", "this tree"))
        print(f"| {piece} | {b50:.0f} / {b95:.0f} / {b99:.0f} | {t50:.0f} / {t95:.0f} / {t99:.0f} | "
              f"{t50 / b50:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
