"""The mesh fan-out (``testbed bench``'s measurement) of this tree against an older commit, in one run:

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.fanout_ab [--base 534fc3c] [--rounds 3] \
        [--nodes 3,5,10] [--messages 1000]

For each round and each node count, a child process per tree (ab.py here: the code at ``--base`` and this tree's
take turns, the order swapped each round) lays out a fresh local mesh whose nodes run that tree's code, fans a
``ping`` out from node 1 (that tree's ``PeerLink``) and waits for every ACK, then measures the same run's floor (a
bare mTLS echo) and NATS, as fanout.py's ``bench_one`` does. Prints every hold: p50 / p95 per tree with the
floor's and NATS's p95 measured beside it, and the ratios ours/floor and ours/NATS at p95.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from testbed.bench.ab import base_parser, run_child, unpack_tree
from testbed.paths import ROOT

TREES = ("base", "this tree")


def child(nodes: int, messages: int) -> dict[str, Any]:
    """One node count on this process's tree: fanout.py's row, less its samples."""
    from mesh.heap import keep_tls_reads_on_the_heap
    from testbed.bench import floor, nats_peer
    from testbed.bench.fanout import bench_one

    floor.new_loop_policy()
    keep_tls_reads_on_the_heap()
    with tempfile.TemporaryDirectory(prefix="fab-") as work:
        row = bench_one(Path(work), nodes, messages, min(100, max(5, messages // 10)), nats_peer.unavailable())
    return {k: v for k, v in row.items() if k != "_samples"}


def _cell(row: dict[str, Any]) -> str:
    o, f, n = row["ours"], row["floor"], row.get("nats")
    nats = f"{n['p95_ms']:.2f}" if n else "-"
    vs_nats = f"{row['ratio_p95_nats']:.2f}×" if n else "-"
    return (f"{o['p50_ms']:.2f} / {o['p95_ms']:.2f} | {f['p95_ms']:.2f} | {nats} | {row['ratio_p95']:.2f}× | {vs_nats} "
            f"| {o['cpu_ms_per_msg_per_receiver']:.3f} / {o['cpu_ms_per_msg_sender']:.3f}")


def main() -> int:
    p = base_parser(__doc__, "534fc3c", 3)
    p.add_argument("--nodes", default="3,5,10", help="node counts, comma-separated (default 3,5,10)")
    p.add_argument("--messages", type=int, default=1000, help="fan-outs per child (default 1000)")
    p.add_argument("--out", type=Path, help="also write every hold's rows here (JSON)")
    args = p.parse_args()
    nodes = [int(n) for n in args.nodes.split(",") if n]
    if args.child:
        print(json.dumps(child(nodes[0], args.messages)))
        return 0
    if not 1 <= args.rounds <= 20 or not 10 <= args.messages <= 100_000 or not nodes:
        p.error("--rounds must be 1..20, --messages 10..100000, --nodes at least one count")
    rows: list[tuple[int, int, str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="fanout-base-") as tmp:
        base = unpack_tree(args.base, Path(tmp))
        if base is None:
            return 2
        trees = {"base": base, "this tree": ROOT}
        for r in range(args.rounds):
            for n in nodes:
                order = TREES if (r + n) % 2 == 0 else TREES[::-1]
                for name in order:
                    got = run_child("testbed.bench.fanout_ab", trees[name],
                                    ["--nodes", str(n), "--messages", str(args.messages)])
                    rows.append((r + 1, n, name, got))
                    print(f"hold {r + 1}, {n} nodes, {name}: {_cell(got)}", file=sys.stderr)
    if args.out is not None:
        args.out.write_text(json.dumps([{"hold": h, "nodes": n, "code": name, **row} for h, n, name, row in rows],
                                       indent=1) + "\n", encoding="utf-8")
    print(f"`.venv/bin/python -m testbed.bench.fanout_ab --base {args.base} --rounds {args.rounds} --nodes "
          f"{args.nodes} --messages {args.messages}` ({os.cpu_count()} CPUs)\n")
    print("| hold | nodes | code | ours p50 / p95 (ms) | floor p95 | NATS p95 | p95 ours/floor | p95 ours/NATS "
          "| ours CPU ms/msg per receiver / sender |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---|")
    for hold, n, name, row in sorted(rows, key=lambda x: (x[1], x[0], TREES.index(x[2]))):
        print(f"| {hold} | {n} | {name} | {_cell(row)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
