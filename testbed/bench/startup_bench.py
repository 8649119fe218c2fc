"""Start-up as a user feels it: a CLI command, ``ai-memory mcp`` to its ``initialize`` answer, ``ai-memory serve``
to ready, each timed as a whole process against ``python -c pass`` measured in the same run, pair by pair.

    flock /tmp/bench.lock .venv/bin/python -m testbed.bench.startup_bench [--rounds N] [--store DB]

Every process runs with its bytecode cached (``PYTHONPYCACHEPREFIX`` in a temporary directory, filled by a
warm-up round; ``PYTHONDONTWRITEBYTECODE`` dropped), as an installed package runs, on a small store (a few
memories, a node key). A round runs, in turn:

- ``python -c pass`` (the baseline), then ``ai-memory recall``, ``store``, ``get`` and ``status`` (the console
  script); the ratio of each command's wall time to the same round's baseline;
- ``ai-memory mcp`` embedded (``--embedded``) and joined (to a local socket this bench serves with the store's
  service), from spawn to the ``initialize`` answer on stdout; beside it ``python -c 'import <the MCP SDK modules
  node.mcp.server imports>'`` in the same round: mcp's own share is its time minus (the SDK import minus the
  baseline);
- ``ai-memory serve`` from spawn to ``/readyz`` answering 200 (polled every 10 ms), a node without peers on an
  empty store and, with ``--store DB``, on a hard link (else a copy) of that SQLite file (the million bench's
  ``--keep DIR`` leaves DIR/home/data/memory.db).

CPU time (user + sys, from ``wait4``) is given beside wall time: on a shared machine wall time is mostly other
processes' turn. Prints markdown tables; writes bench/out/startup.json. Targets: each CLI command <= 5x the
baseline's wall time; mcp's own share <= 0.2 s embedded and joined; serve to ready <= 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mesh import keys
from node.assemble import open_service
from node.config import load_config
from node.mcp.backend import ServiceBackend
from node.mcp.socket import start_local_socket
from testbed.bench.storage_bench import pct
from testbed.mesh.build import MeshLayout, build_layout, render_config
from testbed.paths import BENCH_OUT, ROOT

AGENT = "ai:startup@bench"
CLI_TARGET_RATIO = 5.0
MCP_OWN_TARGET_S = 0.2
SERVE_TARGET_S = 2.0
RUN_TIMEOUT_S = 120.0
READY_POLL_S = 0.01
# What node.mcp.server imports from the MCP SDK (and the SDK's own dependencies come with them).
SDK_IMPORT = ("import anyio, mcp_types, mcp.server.lowlevel, mcp.server.stdio, mcp.server.context, "
              "mcp.shared.message, mcp.server.transport_security")
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "startup-bench", "version": "1"}}}


class Timed:
    """One finished process: wall seconds (spawn to the moment measured) and CPU seconds (user + sys)."""

    def __init__(self, wall_s: float, cpu_s: float) -> None:
        self.wall_s, self.cpu_s = wall_s, cpu_s


def stats(xs: list[float]) -> dict[str, float]:
    """p50 / p95 / p99 (nearest rank) of plain values."""
    return {f"p{p}": round(pct(xs, p), 4) for p in (50, 95, 99)}


def _reap(proc: subprocess.Popen[bytes], t0: float, until_s: float | None = None, ok: tuple[int, ...] = (0,)) -> Timed:
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = (until_s if until_s is not None else time.perf_counter()) - t0
    if proc.returncode not in ok and until_s is None:
        raise RuntimeError(f"{proc.args} exited {proc.returncode}")
    return Timed(wall, ru.ru_utime + ru.ru_stime)


def run_cmd(argv: list[str], env: dict[str, str]) -> Timed:
    """Spawn ``argv`` and wait for it to exit (``status`` exits 3 when no node runs: a probe's answer, not a
    failure)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    return _reap(proc, t0, ok=(0, 3) if argv[-1] == "status" else (0,))


def mcp_initialize(argv: list[str], env: dict[str, str]) -> Timed:
    """Spawn ``ai-memory mcp``, send ``initialize``, time to its answer; then close stdin and reap it."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            cwd=ROOT)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    proc.stdin.flush()
    line = proc.stdout.readline()  # bounded: the process ends (and the pipe closes) on any failure
    answered = time.perf_counter()
    if b'"result"' not in line:
        proc.kill()
        raise RuntimeError(f"mcp answered {line[:300]!r}")
    proc.stdin.close()
    timed = _reap(proc, t0, answered)
    proc.stdout.close()
    return timed


def serve_ready(argv: list[str], env: dict[str, str], health_port: int, log: Path) -> Timed:
    """Spawn ``ai-memory serve``, poll ``/readyz`` until 200 (bounded by RUN_TIMEOUT_S), then SIGTERM and reap."""
    t0 = time.perf_counter()
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=ROOT)
    ready = None
    for _ in range(int(RUN_TIMEOUT_S / READY_POLL_S)):
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode} before ready: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=1.0) as r:
                if r.status == 200:
                    ready = time.perf_counter()
                    break
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(READY_POLL_S)
    proc.terminate()
    if ready is None:
        proc.kill()
        raise RuntimeError(f"serve not ready within {RUN_TIMEOUT_S} s")
    return _reap(proc, t0, ready)


def bench_env(pycache: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "AI_MEMORY_HOME")}
    env.update({"PYTHONPYCACHEPREFIX": str(pycache), "AI_MEMORY_HOME": str(home)})
    return env


def ai_memory() -> list[str]:
    script = Path(sys.executable).parent / "ai-memory"
    return [str(script)] if script.exists() else [sys.executable, "-m", "node.cli"]


def node_home(root: Path, store: Path | None) -> tuple[Path, int]:
    """A node without peers (so ready needs no link), its store empty or ``store`` linked in; (config, port)."""
    layout = build_layout(root, 2, mcp_http=False)
    spec = layout.node(1)
    config = spec.config_path
    config.write_text(render_config(MeshLayout(root=root, nodes=[spec]), spec), encoding="utf-8")
    if store is not None:
        data = load_config(config, env={}).db_path
        data.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal"):  # the WAL too, when the store was left with one
            src, dst = Path(f"{store}{suffix}"), Path(f"{data}{suffix}")
            if src.exists():
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copyfile(src, dst)
    return config, spec.health_port


def small_store(home: Path, env: dict[str, str]) -> dict[str, list[str]]:
    """A home with a key and a memory; the CLI commands timed on it."""
    home.mkdir()
    keys.generate_identity(home / "keys", AGENT)
    cli = ai_memory()
    run_cmd([*cli, "store", "a first memory about start-up time"], env)
    got = subprocess.run([*cli, "--json", "recall", "memory"], env=env, capture_output=True, check=True,
                         timeout=RUN_TIMEOUT_S)
    memory_id = json.loads(got.stdout)[0]["id"]
    return {"recall": [*cli, "recall", "memory"], "store": [*cli, "store", "another memory"],
            "get": [*cli, "get", memory_id], "status": [*cli, "status"]}


async def rounds(args: argparse.Namespace, tmp: Path) -> dict[str, list[Timed]]:
    home = tmp / "home"
    env = bench_env(tmp / "pycache", home)
    commands = await asyncio.to_thread(small_store, home, env)
    cli = ai_memory()
    nodes = {"empty": node_home(tmp / "serve-empty", None)}
    if args.store is not None:
        nodes["given"] = node_home(tmp / "serve-given", args.store)
    cfg = load_config(None, env={"AI_MEMORY_HOME": str(home)})
    svc = await open_service(cfg)
    joined_home = tmp / "joined"
    (joined_home / "run").mkdir(parents=True)
    sock = await start_local_socket(ServiceBackend(svc), joined_home / "run" / "node.sock")
    out: dict[str, list[Timed]] = {}
    try:
        for r in range(args.rounds + 1):  # round 0 is the warm-up (it also fills the bytecode cache)
            one: dict[str, Timed] = {"python -c pass": run_cmd([sys.executable, "-c", "pass"], env)}
            for name, argv in commands.items():
                one[name] = await asyncio.to_thread(run_cmd, argv, env)
            one["SDK import"] = run_cmd([sys.executable, "-c", SDK_IMPORT], env)
            one["mcp embedded"] = await asyncio.to_thread(mcp_initialize, [*cli, "mcp", "--embedded"], env)
            one["mcp joined"] = await asyncio.to_thread(mcp_initialize, [*cli, "mcp"], {
                **env, "AI_MEMORY_HOME": str(joined_home)})
            if r % args.serve_every == 0:
                for kind, (config, port) in nodes.items():
                    node_env = {**env, "AI_MEMORY_HOME": str(config.parent)}
                    one[f"serve to ready, {kind} store"] = await asyncio.to_thread(
                        serve_ready, [*cli, "--config", str(config), "serve"], node_env, port,
                        config.with_name("serve.log"))
            if r:
                for k, v in one.items():
                    out.setdefault(k, []).append(v)
            print(f"round {r}: " + ", ".join(f"{k} {v.wall_s:.3f}" for k, v in one.items()), file=sys.stderr)
    finally:
        await sock.stop()
        await svc.close()
    return out


def report(out: dict[str, list[Timed]], args: argparse.Namespace) -> dict[str, Any]:
    base = out["python -c pass"]
    sdk = out["SDK import"]
    rows: dict[str, Any] = {}
    for name, runs in out.items():
        row = {"wall_s": stats([t.wall_s for t in runs]), "cpu_s": stats([t.cpu_s for t in runs])}
        if len(runs) == len(base):
            row["wall_ratio"] = stats([t.wall_s / b.wall_s for t, b in zip(runs, base, strict=True)])
            # A bare interpreter's CPU time is a few ms, counted in 1-4 ms steps: the ratio is coarse.
            row["cpu_ratio"] = stats([t.cpu_s / max(b.cpu_s, 1e-3) for t, b in zip(runs, base, strict=True)])
        if name.startswith("mcp"):
            # Its own share: the SDK's import (beyond a bare interpreter) taken off, round by round.
            row["own_s"] = stats([t.wall_s - (s.wall_s - b.wall_s) for t, s, b in zip(runs, sdk, base, strict=True)])
            row["own_cpu_s"] = stats([t.cpu_s - (s.cpu_s - b.cpu_s) for t, s, b in zip(runs, sdk, base, strict=True)])
        rows[name] = row
    cli_ratio = max(rows[c]["wall_ratio"]["p50"] for c in ("recall", "store", "get", "status"))
    mcp_own = max(rows[m]["own_s"]["p50"] for m in ("mcp embedded", "mcp joined"))
    serve = max(v["wall_s"]["p50"] for k, v in rows.items() if k.startswith("serve"))
    return {"bench": "startup", "rounds": args.rounds, "store": str(args.store) if args.store else None,
            "rows": rows, "target": {"cli_wall_ratio_p50_worst": round(cli_ratio, 2),
                                     "cli_met": cli_ratio <= CLI_TARGET_RATIO,
                                     "mcp_own_s_p50_worst": round(mcp_own, 3), "mcp_met": mcp_own <= MCP_OWN_TARGET_S,
                                     "serve_ready_s_p50_worst": round(serve, 3), "serve_met": serve <= SERVE_TARGET_S}}


def markdown(r: dict[str, Any]) -> str:
    lines = [f"### start-up ({r['rounds']} rounds, each process against `python -c pass` in the same round)", "",
             "| process | wall p50 / p95 / p99 ms | CPU p50 ms | wall ÷ baseline p50 / p95 | CPU ÷ baseline p50 | "
             "own share p50 ms (wall / CPU) |", "|---|---:|---:|---:|---:|---:|"]
    for name, row in r["rows"].items():
        w, c = row["wall_s"], row["cpu_s"]
        ratio = f"{row['wall_ratio']['p50']:.2f} / {row['wall_ratio']['p95']:.2f}" if "wall_ratio" in row else "-"
        cratio = f"{row['cpu_ratio']['p50']:.2f}" if "cpu_ratio" in row else "-"
        own = f"{row['own_s']['p50'] * 1e3:.0f} / {row['own_cpu_s']['p50'] * 1e3:.0f}" if "own_s" in row else "-"
        lines.append(f"| {name} | {w['p50'] * 1e3:.0f} / {w['p95'] * 1e3:.0f} / {w['p99'] * 1e3:.0f} | "
                     f"{c['p50'] * 1e3:.0f} | {ratio} | {cratio} | {own} |")
    lines += ["", f"targets: {r['target']}"]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sb-") as tmp:
        return report(await rounds(args, Path(tmp)), args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="counted rounds after one warm-up (default 20)")
    ap.add_argument("--serve-every", type=int, default=4, help="serve to ready every Nth round (default 4)")
    ap.add_argument("--store", type=Path, default=None, help="a SQLite store to serve too (hard-linked)")
    ap.add_argument("--out", type=Path, default=BENCH_OUT / "startup.json")
    args = ap.parse_args(argv)
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    print(f"\nJSON: {args.out}")
    return result


if __name__ == "__main__":
    main()
