"""`testbed`: build and run an N-node attested-mesh on this machine, and benchmark it.

Every command works on one testbed directory, --dir (default ./.testbed), which holds the CA, one
home per node (keys, peers, certificate, config, node.log) and testbed.json (nodes, pids, ports).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testbed.build import MAX_NODES, TestbedError

DEFAULT_DIR = Path(".testbed")
EXIT_FAILED = 1
EXIT_USAGE = 2
USAGE_CODES = {"bad_node_count", "bad_nodes", "bad_port", "port_in_use", "dir_not_empty", "dir_not_dir", "dir_too_long",
               "backend_unavailable", "bad_messages", "unknown_node"}


def _nodes_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated node counts like 3,5,10, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="testbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=dir_help)
    up.add_argument("--base-port", type=int, default=None,
                    help="use ports P..P+3N-1 (mesh, health, MCP HTTP per node); default: free ephemeral ports")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every link up (default 60)")
    up.add_argument("--json", action="store_true", help="print the node table as JSON")

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

    bn = sub.add_parser("bench", help="all-ACK fan-out latency for N-node meshes against a bare-TLS floor",
                        description="For each N: start a fresh local N-node mesh in a temporary directory under "
                                    "--dir, act as node 1 (its own certificate) and fan a ping envelope out to the "
                                    "other N-1 nodes, waiting for every ACK, --messages times in sequence; then "
                                    "measure the floor (bare asyncio mTLS echo, same certificates and bytes). "
                                    "Writes OUT/bench.json, OUT/bench.md (also printed), OUT/samples.json and, "
                                    "with matplotlib installed, OUT/cdf-<N>n.png. Each mesh is stopped after its run.")
    bn.add_argument("--nodes", type=_nodes_list, default=None, help="comma-separated node counts (default 3,5,10)")
    bn.add_argument("--messages", type=int, default=None, help="messages per node count (default 2000)")
    bn.add_argument("--warmup", type=int, default=None, help="unmeasured messages first (default M/10, 5..100)")
    bn.add_argument("--quick", action="store_true",
                    help=f"small run: --nodes 3 --messages 200 unless given")
    bn.add_argument("--out", type=Path, default=Path("bench-out"), help="report directory (default ./bench-out)")
    bn.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="parent of the temporary mesh directories "
                                                                  f"(default ./{DEFAULT_DIR})")
    bn.add_argument("--no-plot", action="store_true", help="skip the PNG CDFs")
    bn.add_argument("--backend", choices=("local", "docker"), default="local",
                    help="run each mesh as node subprocesses (default) or one container per node")
    from testbed.image import add_parser as add_image_parser
    add_image_parser(sub)
    return p


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows])


def cmd_up(args: argparse.Namespace) -> int:
    from testbed.control import up

    if args.backend == "docker":
        from testbed.docker import up
        state, already = up(args.dir, args.nodes, base_port=args.base_port, ready_timeout_s=args.timeout)
    else:
        state, already = up(args.dir, args.nodes, backend=args.backend, base_port=args.base_port,
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


def cmd_status(args: argparse.Namespace) -> int:
    from testbed.control import node_status, require_state

    state = require_state(args.dir)
    if state.backend == "docker":
        from testbed.docker import node_rows
        rows = node_rows(state)
    else:
        rows = [node_status(n) for n in state.nodes]
    if args.json:
        print(json.dumps({"dir": state.root, "nodes": rows}, indent=2))
    else:
        print(_table([[str(r["node"]), r["agent_id"], str(r["pid"]), "yes" if r["alive"] else "no", r["health"],
                       f"{r['links_up']}/{r['links']}", r["mcp"]] for r in rows],
                     ["node", "agent_id", "pid", "alive", "health", "links up", "MCP endpoint"]))
    healthy = all(r["alive"] and r["health"] == "ok" and r["links_up"] == r["links"] for r in rows)
    return 0 if healthy else EXIT_FAILED


def cmd_down(args: argparse.Namespace) -> int:
    from testbed.control import down, require_state

    if require_state(args.dir).backend == "docker":
        from testbed.docker import down
    for node, what in down(args.dir, grace_s=args.grace):
        print(f"node-{node.index} pid {node.pid}: {what}")
    print(f"testbed in {args.dir.resolve()} removed")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from testbed.control import log_tail, require_state

    if require_state(args.dir).backend == "docker":
        from testbed.docker import log_tail

    print(log_tail(args.dir, args.node, args.lines))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from testbed import bench

    nodes = args.nodes or (list(bench.QUICK_NODES) if args.quick else [3, 5, 10])
    messages = args.messages or (bench.QUICK_MESSAGES if args.quick else 2000)
    if args.backend == "docker":
        from testbed.docker import run_bench
        report = run_bench(nodes, messages, args.out, args.dir, warmup=args.warmup, plot=not args.no_plot)
    else:
        report = bench.run(nodes, messages, args.out, args.dir, warmup=args.warmup, plot=not args.no_plot)
    print((args.out / "bench.md").read_text(encoding="utf-8"))
    print(f"written: {args.out / 'bench.json'}, {args.out / 'bench.md'}"
          + "".join(f", {p}" for p in report["plots"]), file=sys.stderr)
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    from testbed.image import cmd_image as run_image

    return run_image(args)


HANDLERS = {"up": cmd_up, "status": cmd_status, "down": cmd_down, "logs": cmd_logs, "bench": cmd_bench,
            "image": cmd_image}


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
