"""A new node's bootstrap: it joins a mesh whose nodes hold many memories and links and catches up by sync.

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.bootstrap_bench [--nodes 5] [--memories 100000]
        [--page-limits 500[,2000]] [--replicated] [--dir DIR] [--fill-only] [--baseline-s 10] [--ping-interval-ms 20]
        [--timeout-s 900] [--no-perf-md]

1. A real mesh of ``--nodes`` + 1 nodes is laid out (testbed.mesh); the last one is the joiner.
2. Fill: each of the ``--nodes`` nodes writes ``--memories`` memories and as many links of its own, in process,
   through ``Service.memory_store`` and ``memory_link_many`` (signed by its own key, change log, audit event: the
   ordinary write path, which is what makes the signatures real). Its outbox is then emptied and its cursors on
   the other filled nodes set past their logs: the mesh starts in a steady state (nothing queued, nothing to
   pull among the filled nodes) and the joiner must get everything through sync. The filled nodes do not hold
   each other's items: a joiner pulls each writer's changes from that writer while the writer's link is up
   (``skip``), so what it pulls and verifies is the same as on a fully replicated mesh.
3. The filled nodes start; a pinger process (federation_bench's) pings node 2 as node 1 over one mTLS
   WebSocket every ``--ping-interval-ms``: the live traffic.
4. Baseline: ``--baseline-s`` of pings with no bootstrap. Then the joiner starts (an empty store) and pulls every
   peer's log, every item verified and applied as any pulled item is; the bench polls the joiner's ``/metrics``
   (``aimem_sync_pulled_items``, ``aimem_sync_lag_seqs``) until every peer's lag is 0 and its store holds every
   memory and link. Time to caught up (from the joiner's spawn), items/s, and ping p50/p95/p99 during the
   catch-up against the baseline (ratio target <= 2x; time target <= 60 s at 5 nodes x 100k + 100k).

Prints a markdown table, writes bench/out/bootstrap.json and the PERFORMANCE.md section (``--no-perf-md`` to
skip). Every phase is bounded (``--timeout-s``); the node processes and the pinger are always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import re
import shlex
import shutil
import sqlite3
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from node.assemble import open_service
from node.config import load_config
from node.service import Service
from testbed.bench.federation_bench import (
    ping_window,
    start_pinger,
    stop_pinger,
    wait_pinger_ready,
    write_perf_md,
    write_result,
)
from testbed.mesh.build import MeshLayout, NodeSpec, build_layout
from testbed.mesh.local import LocalMesh, start_node
from testbed.mesh.state import cpu_seconds

SECTION = "## Bootstrap (testbed/bench/bootstrap_bench.py)"
RATIO_LIMIT = 2.0
TIME_LIMIT_S = 60.0
POLL_S = 0.25
FILL_CONCURRENCY = 64
LINKS_PER_CALL = 100
# Past every seq a filled node's log holds: the filled nodes start with nothing to pull from each other.
CAUGHT_UP_CURSOR = 2 ** 62
WORDS = ("alpha", "beta", "gamma", "delta", "mesh", "node", "memory", "link", "sync", "page", "peer", "key",
         "signature", "bootstrap", "cursor", "head", "store", "recall", "agent", "trust")


def extra_config(args: argparse.Namespace) -> str:
    return (f"[federation]\nsync_page_limit = {max(args.page_limits)}\n\n"
            "[limits]\nrequests_per_second = 1000000000\nmax_db_bytes = 68719476736\n")


async def fill_node(spec: NodeSpec, n: int, seed: int) -> float:
    """``n`` memories and ``n`` links written by node ``spec`` through its service; seconds taken."""
    cfg = load_config(spec.config_path, env={"AI_MEMORY_HOME": str(spec.home)})
    svc = await open_service(cfg, require_identity=True)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    try:
        ids = await _memories(svc, n, rng)
        await _links(svc, ids, n, rng)
    finally:
        await svc.close()
    return time.perf_counter() - t0


async def _memories(svc: Service, n: int, rng: random.Random) -> list[str]:
    ids: list[str] = []
    sem = asyncio.Semaphore(FILL_CONCURRENCY)

    async def one(text: str) -> str:
        async with sem:
            return str((await svc.memory_store(text, tags=["bootstrap"]))["id"])
    step = 10 * FILL_CONCURRENCY  # the coroutines in flight built a slice at a time
    for start in range(0, n, step):
        texts = [" ".join(rng.choices(WORDS, k=12)) + f" #{i}" for i in range(start, min(n, start + step))]
        ids += await asyncio.gather(*(one(t) for t in texts))
    return ids


async def _links(svc: Service, ids: list[str], n: int, rng: random.Random) -> None:
    # Each memory the source of one link, to another one (never itself): no two links alike.
    items = [{"src_id": ids[i], "dst_id": ids[(i + 1 + rng.randrange(len(ids) - 1)) % len(ids)],
              "relation": "related_to"} for i in range(n)]
    sem = asyncio.Semaphore(8)

    async def call(chunk: list[dict[str, Any]]) -> None:
        async with sem:
            res = await svc.memory_link_many(chunk)
            bad = [r["error"] for r in res["results"] if "error" in r]
            if bad:
                raise RuntimeError(f"links refused while filling: {bad[:3]}")
    await asyncio.gather(*(call(items[i:i + LINKS_PER_CALL]) for i in range(0, len(items), LINKS_PER_CALL)))


def steady_state(spec: NodeSpec, filled: list[NodeSpec]) -> None:
    """Nothing queued on ``spec`` and nothing to pull from the other filled nodes (see the module doc)."""
    conn = sqlite3.connect(spec.home / "data" / "memory.db", timeout=30)
    try:
        conn.execute("DELETE FROM a2a_outbox")
        for other in filled:
            if other.agent_id != spec.agent_id:
                conn.execute("INSERT INTO peer_state (peer, last_sync_seq) VALUES (?, ?) ON CONFLICT (peer) DO "
                             "UPDATE SET last_sync_seq = excluded.last_sync_seq", (other.agent_id, CAUGHT_UP_CURSOR))
        conn.commit()
    finally:
        conn.close()


def clear_outbox(spec: NodeSpec) -> None:
    """Nothing queued on ``spec`` (its writes reach the others by sync, or not at all)."""
    conn = sqlite3.connect(spec.home / "data" / "memory.db", timeout=30)
    try:
        conn.execute("DELETE FROM a2a_outbox")
        conn.commit()
    finally:
        conn.close()


async def replicate(mesh: LocalMesh, filled: list[NodeSpec], want: tuple[int, int], timeout_s: float) -> float:
    """The filled nodes started with nothing queued and catching up with each other by sync until each holds
    ``want`` (memories, links), then stopped; seconds taken."""
    t0 = time.monotonic()
    mesh.start([s.index for s in filled], want_links=False, timeout_s=120)
    try:
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            counts = [held(s) for s in filled]
            if all(c >= want for c in counts):
                return time.monotonic() - t0
            await asyncio.sleep(1.0)
        raise TimeoutError(f"the filled nodes did not replicate in {timeout_s:g} s: {counts} of {want}")
    finally:
        for s in filled:
            mesh.stop(s.index)


def shape(args: argparse.Namespace) -> dict[str, Any]:
    return {"nodes": args.nodes, "memories": args.memories, "replicated": args.replicated}


def saved_layout(root: Path, args: argparse.Namespace) -> MeshLayout | None:
    """The filled mesh kept in ``root`` by an earlier run of the same shape, or None."""
    try:
        kept = json.loads((root / "filled.json").read_text())
    except (OSError, ValueError):
        return None
    if kept.get("shape") != shape(args):
        return None
    return MeshLayout(root=root / "mesh", nodes=[NodeSpec(**{**n, "home": Path(n["home"])}) for n in kept["nodes"]])


def save_layout(root: Path, layout: MeshLayout, args: argparse.Namespace, fill: dict[str, Any]) -> None:
    nodes = [{**dataclasses.asdict(n), "home": str(n.home)} for n in layout.nodes]
    (root / "filled.json").write_text(json.dumps({"shape": shape(args), "nodes": nodes, "fill": fill}))


def forget_joiner(joiner: NodeSpec, filled: list[NodeSpec]) -> None:
    """The joiner's store gone and the filled nodes' cursors on its log with it: each join is a new node."""
    wipe(joiner)
    for spec in filled:
        conn = sqlite3.connect(spec.home / "data" / "memory.db", timeout=30)
        try:
            conn.execute("DELETE FROM peer_state WHERE peer = ?", (joiner.agent_id,))
            conn.execute("DELETE FROM sync_pending WHERE peer = ?", (joiner.agent_id,))
            conn.commit()
        finally:
            conn.close()


def metrics(spec: NodeSpec) -> dict[str, dict[str, float]]:
    """The joiner's per-peer sync figures from /metrics: {family: {peer: value}} (empty while it starts)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{spec.health_port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, dict[str, float]] = {}
    for m in re.finditer(r'^aimem_(sync_lag_seqs|sync_pulled_items_total)\{peer="([^"]+)"\} (\S+)$', text, re.M):
        out.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    return out


def held(spec: NodeSpec) -> tuple[int, int]:
    """(memories, links) in the joiner's store, read-only beside the running node."""
    conn = sqlite3.connect(f"file:{spec.home / 'data' / 'memory.db'}?mode=ro", uri=True, timeout=10)
    try:
        return (conn.execute("SELECT count(*) FROM memories").fetchone()[0],
                conn.execute("SELECT count(*) FROM memory_links").fetchone()[0])
    except sqlite3.OperationalError:
        return 0, 0  # not created yet
    finally:
        conn.close()


async def wait_caught_up(joiner: NodeSpec, peers: list[str], want: tuple[int, int], timeout_s: float,
                         t_spawn: float) -> dict[str, Any]:
    """Poll the joiner until every peer's lag is 0 and it holds ``want`` (memories, links); the progress seen."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = metrics(joiner)
        lag = m.get("sync_lag_seqs", {})
        pulled = sum(m.get("sync_pulled_items_total", {}).values())
        seen.append({"t_s": round(time.monotonic() - t_spawn, 2), "pulled": pulled,
                     "lag_seqs": sum(lag.values()) if lag else None})
        if set(peers) <= set(lag) and not any(lag.values()) and held(joiner) >= want:
            return {"seconds": time.monotonic() - t_spawn, "progress": seen, "held": held(joiner)}
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"the joiner did not catch up in {timeout_s:g} s (held {held(joiner)} of {want}; "
                       f"last {seen[-1:]})")


def log_lines(spec: NodeSpec) -> dict[str, int]:
    """How many sync_progress and sync_caught_up lines the joiner logged."""
    text = (spec.home / "node.log").read_text(errors="replace")
    return {ev: text.count(f'"{ev}"') for ev in ("sync_progress", "sync_caught_up")}


def set_page_limit(spec: NodeSpec, limit: int) -> None:
    """The joiner's federation.sync_page_limit (what it asks a page for; the filled nodes serve up to the most)."""
    text = spec.config_path.read_text()
    spec.config_path.write_text(re.sub(r"^sync_page_limit = \d+$", f"sync_page_limit = {limit}", text, flags=re.M))


def wipe(spec: NodeSpec) -> None:
    """The joiner's store gone (it joins again from nothing) and its log emptied."""
    for path in (spec.home / "data").glob("memory.db*"):
        path.unlink()
    (spec.home / "node.log").unlink(missing_ok=True)


async def join(mesh: LocalMesh, joiner: NodeSpec, filled: list[NodeSpec], page_limit: int, nice: int,
               args: argparse.Namespace) -> dict[str, Any]:
    """One join of an empty joiner asking pages of ``page_limit``, its process ``nice`` steps below the others (as
    an operator would start a node that joins a busy host: `nice -n`, systemd's Nice=): until caught up, then it
    is stopped."""
    set_page_limit(joiner, page_limit)
    served_from = filled_cpu(mesh, filled)
    t0, t_spawn = time.monotonic_ns(), time.monotonic()
    mesh.procs[joiner.index] = start_node(joiner, nice=nice)
    try:
        want = (args.nodes * args.memories, args.nodes * args.memories)
        done = await wait_caught_up(joiner, [s.agent_id for s in filled], want, args.timeout_s, t_spawn)
        t1 = time.monotonic_ns()
        cpu = cpu_seconds(mesh.procs[joiner.index].pid)
        served = filled_cpu(mesh, filled) - served_from
    finally:
        mesh.stop(joiner.index)
    items = 2 * want[0]
    return {"page_limit": page_limit, "nice": nice, "window_ns": [t0, t1], "caught_up_s": round(done["seconds"], 2),
            "items_per_s": round(items / done["seconds"]), "held": done["held"], "progress": done["progress"],
            "log_lines": log_lines(joiner),
            # CPU seconds per wall second of the catch-up: near 1, the joiner is CPU-bound (one event loop).
            "joiner_cpu_per_wall_s": None if cpu is None else round(cpu / done["seconds"], 2),
            "joiner_cpu_ms_per_item": None if cpu is None else round(1000 * cpu / items, 3),
            # The filled nodes' CPU meanwhile (serving their logs to the joiner, pulling its log), all of them.
            "filled_cpu_per_wall_s": round(served / done["seconds"], 2)}


def filled_cpu(mesh: LocalMesh, filled: list[NodeSpec]) -> float:
    """CPU seconds the filled nodes' processes have used, together."""
    return sum(cpu_seconds(mesh.procs[s.index].pid) or 0.0 for s in filled)


async def fill(layout: MeshLayout, mesh: LocalMesh, args: argparse.Namespace) -> dict[str, Any]:
    """Each filled node's own items (and with ``--replicated`` every other's, by sync), then the steady state."""
    filled = [layout.node(i) for i in range(1, args.nodes + 1)]
    fill_s = []
    for i, spec in enumerate(filled):
        fill_s.append(await fill_node(spec, args.memories, seed=i))
        clear_outbox(spec)
        print(f"filled {spec.agent_id}: {args.memories} + {args.memories} in {fill_s[-1]:.1f} s", file=sys.stderr)
    replicate_s = None
    if args.replicated:
        want = (args.nodes * args.memories, args.nodes * args.memories)
        replicate_s = await replicate(mesh, filled, want, args.timeout_s * args.nodes)
        print(f"replicated: every filled node holds {want} after {replicate_s:.1f} s", file=sys.stderr)
    for spec in filled:
        steady_state(spec, filled)
    return {"fill_s": [round(s, 1) for s in fill_s],
            "replicate_s": None if replicate_s is None else round(replicate_s, 1)}


async def run(layout: MeshLayout, mesh: LocalMesh, args: argparse.Namespace, workdir: Path,
              filling: dict[str, Any]) -> dict[str, Any]:
    filled = [layout.node(i) for i in range(1, args.nodes + 1)]
    joiner = layout.node(args.nodes + 1)
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    mesh.start([s.index for s in filled], want_links=False, timeout_s=120)
    proc, ready, stop, out = start_pinger(layout, workdir, args.ping_interval_ms / 1000)
    joins = []
    try:
        await wait_pinger_ready(proc, ready)
        b0 = time.monotonic_ns()
        await asyncio.sleep(args.baseline_s)
        b1 = time.monotonic_ns()
        for limit in args.page_limits:
            for nice in args.joiner_nice:
                forget_joiner(joiner, filled)
                joins.append(await join(mesh, joiner, filled, limit, nice, args))
        t1 = time.monotonic_ns()
        await asyncio.sleep(min(args.baseline_s, 5.0))
        t2 = time.monotonic_ns()
    finally:
        stop_pinger(proc, stop)
    samples = json.loads(out.read_text())
    base, after = ping_window(samples, b0, b1), ping_window(samples, t1, t2)
    for j in joins:
        j["ping_during"] = ping_window(samples, *j.pop("window_ns"))
        ratio = j["ping_during"]["p95_ms"] / base["p95_ms"] if j["ping_during"].get("n") and base.get("n") else None
        j["p95_ratio"] = None if ratio is None else round(ratio, 2)
        j["pass_time"] = j["caught_up_s"] <= TIME_LIMIT_S
        j["pass_ratio"] = ratio is not None and ratio <= RATIO_LIMIT
    return {"bench": "bootstrap", "load": load, "nodes": args.nodes, "memories_per_node": args.memories,
            "links_per_node": args.memories, "items": 2 * args.nodes * args.memories, "replicated": args.replicated,
            **filling, "ping_baseline": base, "ping_after": after, "joins": joins}


async def bench(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The mesh under ``root`` (kept there when ``--dir``, reused when it holds one of this shape), filled, then
    the joins."""
    layout = saved_layout(root, args) if args.dir else None
    mesh_root = root / "mesh"
    if layout is None:
        if mesh_root.exists():
            shutil.rmtree(mesh_root)
        layout = build_layout(mesh_root, args.nodes + 1, mcp_http=False, extra_config=extra_config(args))
        mesh = LocalMesh(layout)
        try:
            filling = await fill(layout, mesh, args)
        finally:
            mesh.stop_all()
        save_layout(root, layout, args, filling)
    else:
        filling = json.loads((root / "filled.json").read_text())["fill"]
        print(f"reusing the filled mesh in {root}", file=sys.stderr)
    if args.fill_only:
        return {}
    for spec in layout.nodes:  # the page size asked may differ from the run that filled it
        text = spec.config_path.read_text()
        spec.config_path.write_text(re.sub(r"^sync_page_limit = \d+$", f"sync_page_limit = {max(args.page_limits)}",
                                           text, flags=re.M))
    mesh = LocalMesh(layout)
    try:
        return await run(layout, mesh, args, root, filling)
    finally:
        mesh.stop_all()


def fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def markdown(r: dict[str, Any], command: str) -> str:
    rows = [f"`{command}`", "",
            f"{r['nodes']} nodes x {r['memories_per_node']:,} memories + {r['links_per_node']:,} links each "
            f"({r['items']:,} items for the joiner); "
            + ("replicated: each filled node holds every writer's items (its change log interleaves its own writes "
               "with what it applied from the others); " if r.get("replicated") else
               "each filled node holds only its own items; ")
            + f"{r['env']['cpus']} CPUs, Python {r['env']['python']}, load average {r.get('load', '-')} before the "
            "run. Each join from an empty store, one after the other in this run, against the same baseline.", "",
            "| join (page size, joiner's nice) | caught up (spawn to every lag 0, every item held) | items/s | "
            "joiner CPU/wall | joiner CPU ms/item | filled nodes' CPU/wall | sync_progress / sync_caught_up lines | "
            "ping p50 / p95 / p99 ms | p95 / baseline |",
            "|---|---|---|---|---|---|---|---|---|"]
    for j in r["joins"]:
        p = j["ping_during"]
        rows.append(f"| {j['page_limit']}, nice {j.get('nice', 0)} | {j['caught_up_s']} s | {j['items_per_s']:,} | "
                    f"{fmt(j['joiner_cpu_per_wall_s'])} | {j['joiner_cpu_ms_per_item']} | "
                    f"{fmt(j['filled_cpu_per_wall_s'])} | {j['log_lines']['sync_progress']} / "
                    f"{j['log_lines']['sync_caught_up']} | {fmt(p.get('p50_ms'))} / {fmt(p.get('p95_ms'))} / "
                    f"{fmt(p.get('p99_ms'))} (n {p.get('n')}, failed {p.get('failed')}) | **{fmt(j['p95_ratio'])}x** |")
    for name, key in (("baseline, no bootstrap", "ping_baseline"), ("after the joins", "ping_after")):
        p = r[key]
        rows.append(f"| {name} | | | | | | | {fmt(p.get('p50_ms'))} / {fmt(p.get('p95_ms'))} / {fmt(p.get('p99_ms'))} "
                    f"(n {p.get('n')}, failed {p.get('failed')}) | |")
    rows += ["", f"Targets: caught up <= {TIME_LIMIT_S:g} s with 5 nodes each holding the mesh's 100k memories + 100k "
             f"links (`--replicated --memories 20000`: 200k items), live p95 <= {RATIO_LIMIT:g}x the baseline."]
    return "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5, help="filled nodes (the joiner is one more)")
    p.add_argument("--memories", type=int, default=100_000, help="memories, and as many links, each filled node writes")
    p.add_argument("--page-limits", type=lambda v: [int(x) for x in v.split(",")], default=[500],
                   help="the joiner joins once per page size, in order (e.g. 500,2000); the filled nodes serve up "
                        "to the largest")
    p.add_argument("--joiner-nice", type=lambda v: [int(x) for x in v.split(",")], default=[0],
                   help="the joiner's nice steps below the filled nodes, one join per value for each page size "
                        "(e.g. 0,10: as started plainly, then under `nice -n 10`)")
    p.add_argument("--replicated", action="store_true",
                   help="each filled node also holds the others' items, replicated by sync before the joins")
    p.add_argument("--dir", type=Path, default=None,
                   help="keep the filled mesh here and reuse it on a later run of the same shape")
    p.add_argument("--fill-only", action="store_true", help="fill (and keep, with --dir) the mesh, join nothing")
    p.add_argument("--baseline-s", type=float, default=10.0, help="seconds of pings with no bootstrap")
    p.add_argument("--ping-interval-ms", type=float, default=20.0)
    p.add_argument("--timeout-s", type=float, default=900.0, help="most seconds the catch-up may take")
    p.add_argument("--no-perf-md", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = ".venv/bin/python -m testbed.bench.bootstrap_bench" + "".join(f" {shlex.quote(x)}"
                                                                            for x in (argv or sys.argv[1:]))
    with contextlib.ExitStack() as stack:
        root = args.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bootbench")))
        root.mkdir(parents=True, exist_ok=True)
        res = asyncio.run(asyncio.wait_for(bench(root, args), (4 + 2 * args.nodes) * args.timeout_s + 600))
    if args.fill_only:
        return 0
    res["command"] = command
    write_result(res, "bootstrap")
    md = markdown(res, command)
    print(md)
    if not args.no_perf_md:
        write_perf_md(md, SECTION)
    return 0 if all(j["pass_time"] and j["pass_ratio"] for j in res["joins"]) else 1


if __name__ == "__main__":
    sys.exit(main())
