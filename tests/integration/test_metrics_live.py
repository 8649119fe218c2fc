"""A running 2-node mesh seen by an operator: /metrics (parsed by prometheus-client), /readyz, and the
live `status` / `peers` commands over the node's local socket."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import CLI_TIMEOUT_S, ROOT
from tests.mcp.conftest import http_session, ok

pytestmark = pytest.mark.integration


def get(port: int, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5.0) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def get_accept(port: int, path: str, accept: str) -> tuple[int, str, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=5.0) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def samples(port: int) -> dict[tuple[str, tuple], float]:
    status, ctype, text = get(port, "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def ai_memory(spec, *args: str) -> subprocess.CompletedProcess:
    """The CLI with --config after the subcommand, as operators type it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AI_MEMORY_HOME", None)
    return subprocess.run([sys.executable, "-m", "node.cli", *args, "--config", str(spec.config_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)


async def test_metrics_readiness_and_live_cli_on_a_running_mesh(mesh_factory, wait_for, node_log) -> None:
    mesh = mesh_factory(2)
    mesh.start()
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    peer = (("peer", n2.agent_id),)

    async with http_session(f"http://127.0.0.1:{n1.mcp_http_port}/mcp") as s:
        await ok(s, "memory_store", {"content": "counted by the metrics"})
        bad = await s.call_tool("memory_get", {"id": "00000000-0000-4000-8000-000000000000"})
        assert bad.is_error

    m = wait_for(lambda: (lambda m: m if m.get(("aimem_ack_latency_seconds_count", peer), 0) >= 1 else None)(
        samples(n1.health_port)), "an ACK from node 2 in the histogram")
    assert m[("aimem_peer_link_up", peer)] == 1.0
    assert m[("aimem_peer_link_state", (*peer, ("state", "up")))] == 1.0
    assert ("aimem_outbox_depth", peer) in m and ("aimem_dead_letters", peer) in m
    assert ("aimem_sync_cursor", peer) in m and ("aimem_sync_pulled_items_total", peer) in m
    # Once a pull read node 2's log to its end, nothing of it is left to pull.
    wait_for(lambda: samples(n1.health_port).get(("aimem_sync_lag_seqs", peer)) == 0.0,
             "node 2's log pulled to its end")
    assert m[("aimem_mcp_calls_total", (("outcome", "ok"), ("tool", "memory_store")))] == 1.0
    assert m[("aimem_mcp_calls_total", (("outcome", "not_found"), ("tool", "memory_get")))] == 1.0
    assert m[("aimem_ready", ())] == 1.0
    # What an operator's dashboards start from: the build, the process, the store's size, times as timestamps,
    # MCP call latency; and no _created samples beside the counters.
    assert [k for k in m if k[0] == "aimem_build_info"] and m[("process_cpu_seconds_total", ())] > 0
    assert m[("process_start_time_seconds", ())] > 1.7e9 and m[("aimem_storage_bytes", ())] > 0
    assert m[("aimem_sync_last_pull_timestamp_seconds", peer)] > m[("process_start_time_seconds", ())] - 1
    assert m[("aimem_mcp_call_seconds_count", (("tool", "memory_store"),))] == 1.0
    assert m[("aimem_mcp_call_seconds_bucket", (("le", "+Inf"), ("tool", "memory_get")))] == 1.0
    assert not [k for k in m if k[0].endswith("_created")]
    status, ctype, text = get_accept(n1.health_port, "/metrics", "application/openmetrics-text; version=1.0.0")
    assert status == 200 and ctype.startswith("application/openmetrics-text") and text.endswith("# EOF\n")

    status, _, body = get(n1.health_port, "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True
    assert get(n1.health_port, "/healthz")[0] == 200

    live = ai_memory(n1, "peers", "--json")
    assert live.returncode == 0, live.stderr
    assert [r["link_state"] for r in json.loads(live.stdout)] == ["up"] and "no node answers" not in live.stderr
    st = ai_memory(n1, "status", "--json")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["source"] == "node" and json.loads(st.stdout)["node_running"] is True
    assert json.loads(st.stdout)["sync"]["catch_up"][n2.agent_id]["percent"] == 100.0
    human = ai_memory(n1, "status").stdout
    row = rf"sync +{re.escape(n2.agent_id)} +100% +pulled \d+ +cursor \d+ of head \d+ +lag 0 seqs"
    assert re.search(row, human), human

    # At the default level an idle sync round (nothing applied, pending or parked) is not logged.
    events = node_log(n1)
    assert events and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["ts"]) for e in events)
    assert not [e for e in events if e["event"] == "synced" and not (e["applied"] or e["pending"] or e["parked"])]

    # /readyz is 200 above; its switch to ready is logged on the watch's next look (node/readiness.py WATCH_S).
    wait_for(lambda: node_log.has(n1, "ready"), "the switch to ready logged")
    not_ready_before = [e for e in node_log(n1) if e["event"] == "not_ready"]
    mesh.stop(2)
    ready = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(get(n1.health_port, "/readyz")),
                     "node 1 not ready once its only peer is gone")
    body = json.loads(ready[2])
    assert body["ready"] is False and [r["code"] for r in body["reasons"]] == ["no_peer_link"]
    assert samples(n1.health_port)[("aimem_peer_link_up", peer)] == 0.0
    # Each switch of /readyz is one log line, both ways: ready at start, not ready with its reasons now.
    def switched_to_not_ready() -> list[dict[str, Any]]:
        return [e for e in node_log(n1) if e["event"] == "not_ready"][len(not_ready_before):]

    [switch] = wait_for(switched_to_not_ready, "the switch to not ready logged")
    assert switch["reasons"] == ["no_peer_link"] and switch["level"] == "warning"
    # The start-up line says what runs, from which file, on what, where it listens and whom it trusts.
    [start] = [e for e in node_log(n1) if e["event"] == "node_ready"]
    assert start["config"] == str(n1.config_path.absolute()) and start["backend"] == "sqlite"
    assert start["health"] == f"127.0.0.1:{n1.health_port}" and start["trust"] == "pinned" and start["version"]
