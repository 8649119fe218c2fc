"""`testbed`: build and run an N-node attested-mesh on this machine, and benchmark it.

Every command works on one testbed directory, --dir (default ./.testbed), which holds the CA, one
home per node (keys, peers, certificate, config, node.log) and testbed.json (nodes, pids, ports).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from node.version import version
from testbed import faults
from testbed.env import doctor, fresh, image
from testbed.errors import TestbedError
from testbed.mesh import control, docker
from testbed.mesh.build import MAX_NODES

DEFAULT_DIR = Path(".testbed")
EXIT_FAILED = 1
EXIT_USAGE = 2
USAGE_CODES = {"bad_node_count", "bad_nodes", "bad_port", "port_in_use", "dir_not_empty", "dir_not_dir", "dir_too_long",
               "backend_unavailable", "bad_messages", "unknown_node", "bad_netem", "bad_fault", "no_netns",
               "bad_option"}


def _nodes_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated node counts like 3,5,10, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="testbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="cmd", required=True)
    dir_help = f"testbed directory (default: ./{DEFAULT_DIR})"

    up = sub.add_parser("up", help="lay out an N-node mesh, start every node, wait until every peer link is up",
                        description="Make a CA, N identities and certificates, exchange every .pub, write configs, "
                                    "start N node processes on 127.0.0.1 and wait until every node reports every "
                                    "peer link up; then print a table of nodes. If DIR already holds a running "
                                    "testbed, report it and exit 0. A failed start stops what it started.")
    up.add_argument("--nodes", type=int, required=True, help=f"number of nodes, 2..{MAX_NODES}")
    up.add_argument("--backend", choices=("local", "docker"), default="local",
                    help="local: node subprocesses (default); docker: one host-network container per node "
                         "(needs `testbed image base`; see docs/testbed.md)")
    up.add_argument("--compose", choices=docker.COMPOSE_CHOICES, default="auto",
                    help="docker backend: start the containers with the compose plugin (`docker compose`), the "
                         "standalone `docker-compose` (1.x), whichever answers (auto, the default), or `docker run` "
                         "(run); a compose that is absent or refuses DIR/compose.yaml falls back to `docker run`")
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=dir_help)
    up.add_argument("--base-port", type=int, default=None,
                    help="use ports P..P+3N-1 (mesh, health, MCP HTTP per node); default: free ephemeral ports")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every link up (default 60)")
    up.add_argument("--json", action="store_true", help="print the node table as JSON")
    up.add_argument("--netns", action="store_true",
                    help="local backend: each node in its own network namespace on a testbed-private bridge "
                         "(10.231.K.0/24), so `testbed fault` can delay, drop and partition per node; needs root "
                         "(without it: loopback only, no network faults)")

    st = sub.add_parser("status", help="per node: pid alive, /healthz, peer links up")
    st.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=dir_help)
    st.add_argument("--json", action="store_true", help="print JSON")

    dn = sub.add_parser("down", help="stop exactly the node pids this testbed started and remove its directory",
                        description="SIGTERM each recorded pid (only while it is still the process the testbed "
                                    "started), SIGKILL after --grace seconds, then remove the CA, node homes and "
                                    "testbed.json from DIR (and DIR if it is left empty).")
    dn.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=dir_help)
    dn.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)")

    lg = sub.add_parser("logs", help="print the tail of one node's log")
    lg.add_argument("node", help="node index (1), directory name (node-1) or agent_id")
    lg.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=dir_help)
    lg.add_argument("--lines", type=int, default=50, help="last K lines (default 50; 0 = all)")

    bn = sub.add_parser("bench", help="all-ACK fan-out latency for N-node meshes against a bare-TLS floor and NATS",
                        description="For each N: start a fresh local N-node mesh in a temporary directory under "
                                    "--dir, act as node 1 (its own certificate) and fan a ping envelope out to the "
                                    "other N-1 nodes, waiting for every ACK, --messages times in sequence; then "
                                    "measure the floor (bare asyncio mTLS echo, same certificates and bytes) and, "
                                    "when nats-server and nats-py are installed (`pip install '.[bench]'`), a NATS "
                                    "request/reply scatter to N-1 responders that each commit to SQLite first. "
                                    "Writes OUT/bench.json, OUT/bench.md (also printed), OUT/samples.json and, "
                                    "with matplotlib installed, OUT/cdf-<N>n.png. Each mesh is stopped after its run.")
    bn.add_argument("--nodes", type=_nodes_list, default=None, help="comma-separated node counts (default 3,5,10)")
    bn.add_argument("--messages", type=int, default=None, help="messages per node count (default 2000)")
    bn.add_argument("--warmup", type=int, default=None, help="unmeasured messages first (default M/10, 5..100)")
    bn.add_argument("--quick", action="store_true",
                    help="small run: --nodes 3 --messages 200 unless given")
    bn.add_argument("--out", type=Path, default=Path("bench-out"), help="report directory (default ./bench-out)")
    bn.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="parent of the temporary mesh directories "
                                                                  f"(default ./{DEFAULT_DIR})")
    bn.add_argument("--no-plot", action="store_true", help="skip the PNG CDFs")
    bn.add_argument("--backend", choices=("local", "docker"), default="local",
                    help="run each mesh as node subprocesses (default) or one container per node")
    bn.add_argument("--netem", default=None, metavar="SPEC",
                    help='emulated WAN, e.g. "delay 25ms 5ms loss 1%%": every node (and floor receiver) in its '
                         "own namespace with that delay/loss on its egress; needs root")
    bn.add_argument("--everything-on", action="store_true",
                    help="local backend: before each mesh starts, give every node the daemon post_recall hook "
                         "(a Python JSON-RPC daemon), 1,000 permission rules in enforce mode that allow the "
                         "mesh's own agents; then make one recall per node (starts the hook daemon) and check in "
                         "its memory_capabilities that both are loaded and that it signs memory versions "
                         "(testbed nodes always do). The pings measured fire "
                         "no hook and ask the gate nothing; the report states the mode")
    fl = sub.add_parser("fault", help="inject a fault into a --netns testbed: latency|loss|partition|heal|kill|restart",
                        description="latency NODE 25ms [JITTER]: delay NODE's egress; loss NODE 1%%: drop that share "
                                    "of NODE's egress packets; partition A B: drop traffic between A and B; heal "
                                    "[NODE|all]: undo latency, loss and partitions; kill NODE: SIGKILL its process; "
                                    "restart NODE: stop (if running) and start it again, wait until healthy. "
                                    "latency/loss/partition/heal need `testbed up --netns`; kill/restart work on "
                                    "any local testbed.")
    fl.add_argument("action", choices=("latency", "loss", "partition", "heal", "kill", "restart"))
    fl.add_argument("targets", nargs="*", help="node(s) and values, see above")
    fl.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=dir_help)
    fl.add_argument("--timeout", type=float, default=60.0, help="restart: seconds to wait until ready (default 60)")
    image.add_parser(sub)
    doctor.add_parser(sub)
    fresh.add_parser(sub)
    return p


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows])


def cmd_up(args: argparse.Namespace) -> int:
    if args.backend == "docker":
        if getattr(args, "netns", False):
            raise TestbedError("bad_option", "--netns applies to the local backend only (containers share the "
                                             "host network here)")
        state, already = docker.up(args.dir, args.nodes, base_port=args.base_port, ready_timeout_s=args.timeout,
                                   compose_choice=args.compose)
    elif getattr(args, "netns", False) and _netns_ok():
        state, already = control.up_netns(args.dir, args.nodes, base_port=args.base_port,
                                          ready_timeout_s=args.timeout, say=lambda m: print(m, file=sys.stderr))
    else:
        state, already = control.up(args.dir, args.nodes, backend=args.backend, base_port=args.base_port,
                                    ready_timeout_s=args.timeout)
    if already:
        print(f"testbed: a testbed is already running in {state.root} ({len(state.nodes)} nodes); "
              f"nothing started", file=sys.stderr)
    if args.json:
        print(json.dumps({"dir": state.root, "already_running": already,
                          "nodes": [{"node": n.index, "agent_id": n.agent_id, "pid": n.pid, "port": n.port,
                                     "fingerprint": n.fingerprint, "mcp": n.mcp_endpoint} for n in state.nodes]},
                         indent=2))
    else:
        print(_table([[str(n.index), n.agent_id, str(n.port), n.fingerprint, n.mcp_endpoint] for n in state.nodes],
                     ["node", "agent_id", "mesh port", "fingerprint", "MCP endpoint"]))
        if not already:
            print(f"\n{len(state.nodes)} nodes up, every link up; state in {state.root}/testbed.json; "
                  f"stop with: testbed down --dir {state.root}")
    return 0


def _netns_ok() -> bool:
    ok, why = doctor.ip_netns_supported()
    if not ok:
        print(f"testbed: --netns refused: {why}; running loopback-only, without network faults", file=sys.stderr)
    return ok


def cmd_status(args: argparse.Namespace) -> int:
    state = control.require_state(args.dir)
    if state.backend == "docker":
        rows = docker.node_rows(state)
    elif (Path(state.root) / "netns.json").exists():
        rows = faults.node_rows(Path(state.root))
    else:
        rows = [control.node_status(n) for n in state.nodes]
    if args.json:
        print(json.dumps({"dir": state.root, "nodes": rows}, indent=2))
    else:
        docker_health = state.backend == "docker"  # Docker's own health check state, beside ours
        print(_table([[str(r["node"]), r["agent_id"], str(r["pid"]), "yes" if r["alive"] else "no", r["health"],
                       *([r["docker_health"]] if docker_health else []), f"{r['links_up']}/{r['links']}", r["mcp"]]
                      for r in rows],
                     ["node", "agent_id", "pid", "alive", "health", *(["docker health"] if docker_health else []),
                      "links up", "MCP endpoint"]))
    healthy = all(r["alive"] and r["health"] == "ok" and r["links_up"] == r["links"] for r in rows)
    return 0 if healthy else EXIT_FAILED


def cmd_down(args: argparse.Namespace) -> int:
    if (args.dir / "netns.json").exists():
        results, done = control.down_netns(args.dir, grace_s=args.grace)
        for node, what in results:
            print(f"node-{node.index} pid {node.pid}: {what}")
        print("\n".join(done))
        print(f"testbed in {args.dir.resolve()} removed")
        return 0
    down = docker.down if control.require_state(args.dir).backend == "docker" else control.down
    for node, what in down(args.dir, grace_s=args.grace):
        print(f"node-{node.index} pid {node.pid}: {what}")
    print(f"testbed in {args.dir.resolve()} removed")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    log_tail = docker.log_tail if control.require_state(args.dir).backend == "docker" else control.log_tail
    print(log_tail(args.dir, args.node, args.lines))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    # Imported here for start-up cost: the bench pulls aiohttp and the node's stack (~0.3 s), which the other
    # commands do not need.
    from testbed.bench import fanout

    nodes = args.nodes or (list(fanout.QUICK_NODES) if args.quick else [3, 5, 10])
    messages = args.messages or (fanout.QUICK_MESSAGES if args.quick else 2000)
    if args.backend == "docker":
        if args.netem or args.everything_on:
            raise TestbedError("bad_option", f"{'--netem' if args.netem else '--everything-on'} applies to the "
                                             "local backend only")
        report = fanout.run_in_containers(nodes, messages, args.out, args.dir, warmup=args.warmup,
                                          plot=not args.no_plot)
    else:
        extra: dict[str, object] = {"netem": args.netem} if args.netem else {}
        if args.everything_on:
            extra["everything_on"] = True
        report = fanout.run(nodes, messages, args.out, args.dir, warmup=args.warmup, plot=not args.no_plot,
                            **extra)
    print((args.out / "bench.md").read_text(encoding="utf-8"))
    print(f"written: {args.out / 'bench.json'}, {args.out / 'bench.md'}"
          + "".join(f", {p}" for p in report["plots"]), file=sys.stderr)
    return 0


def cmd_fault(args: argparse.Namespace) -> int:
    for line in faults.run_fault(args.dir, args.action, args.targets, timeout_s=args.timeout):
        print(line)
    return 0


HANDLERS = {"up": cmd_up, "status": cmd_status, "down": cmd_down, "logs": cmd_logs, "bench": cmd_bench,
            "image": image.cmd_image, "fault": cmd_fault, "doctor": doctor.cmd_doctor,
            "fresh-check": fresh.cmd_fresh_check}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return HANDLERS[args.cmd](args)
    except KeyboardInterrupt:
        return 130
    except TestbedError as e:
        print(f"testbed: error [{e.code}]: {e.message}", file=sys.stderr)
        return EXIT_USAGE if e.code in USAGE_CODES else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
