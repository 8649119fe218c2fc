"""A CLI command imports only what it runs: recall, store, get and status open the store without the HTTP client,
the WebSocket link, the mesh server or the MCP SDK (their import was most of a command's start-up time). The
import graph is pinned here, not the time (that is testbed/bench/startup_bench.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mesh import keys
from testbed.mesh.local import node_command, node_env, wait_ready
from tests.layouts import new_layout
from tests.node_access import cli_in_process

ROOT = Path(__file__).resolve().parents[2]
AGENT = "ai:imports@test"
# Modules a command that only opens the store must not load.
HEAVY = ("aiohttp", "mcp", "mesh.link", "mesh.server", "uvicorn", "starlette", "importlib.metadata",
         "node.events.delivery", "node.federation.sender", "node.mcp.server", "node.node", "urllib.request",
         "http.client")
# The rooms a command that only reads or writes memories does not use, built (and imported) at first use: the
# federation's inbound side and sync pages, the knowledge graph, transcripts and local agents.
ROOMS = ("node.federation.inbound", "node.federation.sync", "node.federation.verify", "node.kg", "node.transcripts",
         "node.agents.local")
# Runs one command in a fresh interpreter and prints which of HEAVY it loaded.
PROBE = """
import json, sys
from node.cli import main
heavy = sys.argv[1].split(",")
try:
    main(sys.argv[2:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in heavy if m in sys.modules)))
"""


def _loaded(home: Path, *args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "AI_MEMORY_HOME"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY + ROOMS), "--home", str(home), *args, "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout.strip().splitlines()[-1]))


def test_recall_store_get_and_status_load_no_http_client_websocket_mcp_sdk_or_unused_room(tmp_path: Path) -> None:
    home = tmp_path / "home"
    keys.generate_identity(home / "keys", AGENT)
    assert _loaded(home, "store", "a memory to read back") == []
    assert _loaded(home, "recall", "memory") == []
    env = {k: v for k, v in os.environ.items() if k != "AI_MEMORY_HOME"}
    listed = subprocess.run([sys.executable, "-m", "node.cli", "--home", str(home), "list", "--json"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    memory_id = json.loads(listed.stdout)[0]["id"]
    assert _loaded(home, "get", memory_id) == []
    # status reports the knowledge graph's backend and the local agents: those two rooms, no other.
    assert _loaded(home, "status") == ["node.agents.local", "node.kg"]


def test_the_mcp_server_loads_no_service_until_it_opens_one_embedded() -> None:
    # Joined to a running node, `ai-memory mcp` only forwards calls: the store's service is the node's.
    probe = ("import json, sys, node.mcp.server; print(json.dumps(sorted(m for m in sys.argv[1].split(',') "
             "if m in sys.modules)))")
    # Nor the embedded backend, the agents' keys, or the HTTP door's bearer tokens (mesh.keys: the node's crypto).
    service = ("node.assemble,node.service,node.federation.facade,node.writepath,aiohttp,mesh.link,node.mcp.backend,"
               "node.agents.local,node.mcp.capabilities,mesh.keys,mesh.agentkeys,node.mcp.agents,storage.db")
    r = subprocess.run([sys.executable, "-c", probe, service], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def test_a_command_that_uses_a_lazily_built_room_loads_it(tmp_path: Path) -> None:
    # The knowledge graph is built at its first use, not skipped: `kg timeline` loads it.
    home = tmp_path / "home"
    keys.generate_identity(home / "keys", AGENT)
    assert _loaded(home, "store", "a memory") == []
    env = {k: v for k, v in os.environ.items() if k != "AI_MEMORY_HOME"}
    listed = subprocess.run([sys.executable, "-m", "node.cli", "--home", str(home), "list", "--json"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    memory_id = json.loads(listed.stdout)[0]["id"]
    assert _loaded(home, "kg", "timeline", memory_id) == ["node.kg"]


def test_a_command_line_builds_only_its_commands_parser_and_parses_as_the_whole_parser_does() -> None:
    from node.cli import build_parser
    from node.cli.common import command_named

    for argv in (["recall", "cats", "--limit", "3"], ["--home", "/h", "--json", "store", "x", "--tag", "a"],
                 ["kg", "timeline", "m1", "--limit", "2"], ["get", "m1", "--home", "/h"],
                 ["--config", "/c.toml", "status", "--json"]):
        named = command_named(argv)
        assert named == next(w for w in argv if w in {"recall", "store", "kg", "get", "status"})
        whole, one = vars(build_parser().parse_args(argv)), vars(build_parser(named).parse_args(argv))
        assert one == whole
    # Where the command is not plain, every parser is built (abbreviated options, help, version, none).
    for argv in (["--hom", "/h", "get", "x"], ["-h"], ["--version"], [], ["--config=/c.toml", "get", "x"]):
        assert command_named(argv) is None


# Runs `ai-memory serve` and, once it stops, writes which of the MCP SDK's modules it had loaded.
SERVE_PROBE = """
import json, sys
from node.cli import main
out, argv = sys.argv[1], sys.argv[2:]
try:
    main(argv)
finally:
    with open(out, "w") as f:
        json.dump(sorted(m for m in ("mcp", "mcp_types", "uvicorn", "starlette", "node.mcp.server")
                         if m in sys.modules), f)
"""


@pytest.mark.integration
def test_a_node_without_an_mcp_http_door_serves_its_local_socket_without_loading_the_mcp_sdk(
        short_tmp: Path) -> None:
    # The SDK's import was most of `serve`'s start-up; the local socket (and `ai-memory mcp` joined over it,
    # which imports the SDK in its own process) needs none of it.
    layout = new_layout(short_tmp / "tb", 2, mcp_http=False)
    spec = layout.node(1)
    out = short_tmp / "loaded.json"
    argv = [sys.executable, "-c", SERVE_PROBE, str(out), *node_command(spec)[3:]]
    with open(spec.home / "node.log", "ab") as log:
        proc = subprocess.Popen(argv, env=node_env(spec), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        wait_ready(layout, [spec], {1: proc}, timeout_s=60.0, want_links=False)
        rc, status, _ = cli_in_process(spec.config_path, spec.home, "status")
        assert rc == 0 and status["source"] == "node"  # the local socket answers
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert json.loads(out.read_text()) == []
