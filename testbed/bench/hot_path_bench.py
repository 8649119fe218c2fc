"""Per-envelope costs on a receiving node, against an older commit, in one run.

    .venv/bin/python -m testbed.bench.hot_path_bench [--base b6bd00a] [--rounds 7] [--calls 5000]

Times, one call at a time in batches of ``--calls`` (the per-call figure of a batch is its time over
``--calls``), the pieces every inbound envelope goes through: ``decode_wire`` of a ping to nine
recipients (envelope and payload checks), ``SeenCache.remember`` into a cache holding 10,000 live
entries, the ping's payload check, the accepted ACK's build on the receiver and its read on the sender,
``RateLimiter.wait_s`` of one peer among ten, a decoded ping through ``Receiver.receive_now`` with a node-like
apply, and on the sender one ACK deadline armed and settled; and the argument check every MCP tool call goes through,
``ArgValidator.check``, of a memory_store and of a 100-link memory_link_many. The code at ``--base`` and this
tree's take turns (ab.py here). Prints p50 / p95 / p99 of the per-call figures over the rounds and the ratio
of this tree's p50 to the base's.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import ssl
import sys
import time
import uuid
from typing import Any

from a2a import Ack, Backoff, SeenCache, envelope, new_envelope, validate_payload
from a2a.envelope import decode_wire
from mesh.link import PeerLink
from mesh.receive import Receiver
from node.config import KgConfig, LimitsConfig
from node.mcp.registry import tool_specs
from node.mcp.validate import ArgValidator
from node.ratelimit import RateLimiter
from testbed.bench.ab import alternate, base_parser, pct

SEEN_LIVE = 10_000
PEERS = 10


def child(calls: int) -> dict[str, float]:
    """Per-call µs of each piece, one batch of ``calls`` each, in this process's tree (PYTHONPATH)."""
    now_ms = int(time.time() * 1000)
    out = {**_envelope_pieces(calls, now_ms), **_ack_pieces(calls)}
    limiter = RateLimiter(10 ** 9)
    peers = [f"ai:peer-{i}@lab" for i in range(PEERS)]
    t0 = time.perf_counter()
    for i in range(calls):
        limiter.wait_s(peers[i % PEERS])
    out["RateLimiter.wait_s"] = (time.perf_counter() - t0) / calls * 1e6
    out.update(_tool_args(calls))
    try:
        import uvloop  # the nodes' loop (its timers are what the ACK deadline piece arms)
        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        out.update(runner.run(_in_loop(calls)))
    return out


def _envelope_pieces(calls: int, now_ms: int) -> dict[str, float]:
    """A ping to nine recipients decoded, its correlation id remembered among SEEN_LIVE live ones, its
    payload checked: µs a call."""
    me = "ai:bench-1@lab"
    wire = new_envelope(me, [f"ai:bench-{i}@lab" for i in range(2, 11)], {"kind": "ping", "sent_at": now_ms},
                        now_ms, 60_000).to_wire()
    out = {}
    t0 = time.perf_counter()
    for _ in range(calls):
        decode_wire(wire, 1 << 20)
    out["decode_wire"] = (time.perf_counter() - t0) / calls * 1e6

    seen = SeenCache(maxsize=SEEN_LIVE * 2)
    for i in range(SEEN_LIVE):
        seen.remember(f"live-{i}", now_ms + 600_000)
    ids = [f"new-{i}" for i in range(calls)]
    t0 = time.perf_counter()
    for cid in ids:
        seen.remember(cid, now_ms + 600_000)
    out["SeenCache.remember"] = (time.perf_counter() - t0) / calls * 1e6

    payload = {"kind": "ping", "sent_at": now_ms}
    t0 = time.perf_counter()
    for _ in range(calls):
        validate_payload(payload)
    out["validate_payload (ping)"] = (time.perf_counter() - t0) / calls * 1e6
    return out


def _ack_pieces(calls: int) -> dict[str, float]:
    """The ACK for one ping: built on the receiver, then read by the sender as PeerLink.on_ack_frame does
    (trees with the byte-for-byte match of an accepted ACK try it first): µs a call."""
    cid, peer = str(uuid.uuid4()), "ai:bench-2@lab"
    out = {}
    t0 = time.perf_counter()
    for _ in range(calls):
        Ack.ok(cid, peer).to_wire()
    out["Ack.ok(...).to_wire()"] = (time.perf_counter() - t0) / calls * 1e6
    ack = Ack.ok(cid, peer).to_wire()
    match = getattr(envelope, "accepted_ack", None)
    t0 = time.perf_counter()
    for _ in range(calls):
        if match is None or match(ack, peer, 1 << 20) is None:
            decode_wire(ack, 1 << 20)
    out["ACK read on the sender"] = (time.perf_counter() - t0) / calls * 1e6
    return out


async def _in_loop(calls: int) -> dict[str, float]:
    """Pieces that need a running loop: a decoded ping through ``Receiver.receive_now`` with the node's ping
    apply (``Federation.apply_now`` where the tree has it, else, in older trees, the coroutine stepped inline),
    and on the sender one send's ACK deadline armed and settled by its ACK (``PeerLink._arm_ack_timer``
    + ``_on_ack``)."""
    me, peer = "ai:bench-2@lab", "ai:bench-1@lab"
    limiter = RateLimiter(10 ** 9)

    def apply_now(env: Any, sender: str) -> Any:
        if env.payload.get("kind") != "ping":
            return None
        if limiter.wait_s(sender):
            return Ack.rejected(env.correlation_id, me, "rate_limited")
        validate_payload(env.payload)
        return Ack.ok(env.correlation_id, me)

    async def apply_payload(payload: Any) -> None:
        validate_payload(payload)

    async def apply(env: Any, sender: str) -> Any:  # Federation.apply's shape for a ping
        if limiter.wait_s(sender):
            return Ack.rejected(env.correlation_id, me, "rate_limited")
        await apply_payload(env.payload)
        return Ack.ok(env.correlation_id, me)

    now_ms = int(time.time() * 1000)
    extra = {"apply_now": apply_now} if "apply_now" in inspect.signature(Receiver).parameters else {}
    receiver = Receiver(me, SeenCache(maxsize=SEEN_LIVE * 4), apply, max_bytes=1 << 20,
                        clock_ms=lambda: int(time.time() * 1000), **extra)
    envs = [new_envelope(peer, [me], {"kind": "ping", "sent_at": now_ms}, now_ms, 600_000) for _ in range(calls)]
    t0 = time.perf_counter()
    for env in envs:
        receiver.receive_now(env, peer)
    out = {"Receiver.receive_now (ping, node-like apply)": (time.perf_counter() - t0) / calls * 1e6}

    link = PeerLink(me, "https://127.0.0.1:1", ssl.create_default_context(), pinned=dict, backoff=Backoff(0.1, 1.0),
                    ack_timeout_s=10.0, max_bytes=1 << 20)
    loop = asyncio.get_running_loop()
    cids = [str(uuid.uuid4()) for _ in range(calls)]
    acks = [Ack.ok(cid, me) for cid in cids]
    t0 = time.perf_counter()
    for cid, ack in zip(cids, acks, strict=True):
        fut = link._future(cid, loop)  # noqa: SLF001
        link._arm_ack_timer(cid, fut, loop.time() + 10.0, 10.0)  # noqa: SLF001
        link._on_ack(ack)  # noqa: SLF001
    out["ACK deadline armed and settled (sender, per peer)"] = (time.perf_counter() - t0) / calls * 1e6
    link._mark_down()  # noqa: SLF001
    return out


def _tool_args(calls: int) -> dict[str, float]:
    """``ArgValidator.check`` of a memory_store and of a 100-link memory_link_many (each MCP call's arguments)."""
    v = ArgValidator(tool_specs(LimitsConfig(), KgConfig()))
    store = {"content": "notes from the design review " * 8, "title": "review", "tags": ["design", "review"],
             "namespace": "work"}
    links = {"links": [{"src_id": f"{i:08x}-0000-4000-8000-000000000000", "dst_id": f"{i:08x}-1111-4000-8000-"
                        "000000000000", "relation": "related_to"} for i in range(100)]}
    out = {}
    for name, tool, args, n in (("ArgValidator.check memory_store", "memory_store", store, calls),
                                ("ArgValidator.check memory_link_many (100 links)", "memory_link_many", links,
                                 max(calls // 50, 20))):
        t0 = time.perf_counter()
        for _ in range(n):
            v.check(tool, args)
        out[name] = (time.perf_counter() - t0) / n * 1e6
    return out


def main() -> int:
    p = base_parser(__doc__, "b6bd00a", 7)
    p.add_argument("--calls", type=int, default=5000, help="calls per piece per child (default 5000)")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.calls)))
        return 0
    if not 1 <= args.rounds <= 100 or not 100 <= args.calls <= 1_000_000:
        p.error("--rounds must be 1..100 and --calls 100..1000000")
    results = alternate(args.base, args.rounds, "testbed.bench.hot_path_bench", ["--calls", str(args.calls)])
    if results is None:
        return 2
    command = f"-m testbed.bench.hot_path_bench --base {args.base} --rounds {args.rounds} --calls {args.calls}"
    print(f"`.venv/bin/python {command}`\n")
    print("| piece | base p50 / p95 / p99 (µs a call) | this tree p50 / p95 / p99 (µs a call) | p50 this tree / base |")
    print("|---|---|---|---:|")
    for piece in results["base"][0]:
        cols = []
        for name in ("base", "this tree"):
            v = sorted(x[piece] for x in results[name])
            cols.append((pct(v, 50), pct(v, 95), pct(v, 99)))
        (b50, b95, b99), (t50, t95, t99) = cols
        print(f"| {piece} | {b50:.2f} / {b95:.2f} / {b99:.2f} | {t50:.2f} / {t95:.2f} / {t99:.2f} | {t50 / b50:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
