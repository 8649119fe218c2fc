"""Transcripts between real node processes: replicated only where the namespace opts in, and only to the
peers that may see it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from testbed.mesh import NodeSpec
from tests.integration.conftest import run_cli, wait_for

TEXT = "user: où est le café? ☕\nassistant: rue de la Paix 🙂\n"
# "team" replicates its transcripts and is seen by nodes 1 and 2 only; "local" keeps them where written.
CONFIG = """
[federation.namespaces.team]
peers = ["ai:node-1@testbed", "ai:node-2@testbed"]

[transcripts.team]
enabled = true
replicate = true
replay = "allow"

[transcripts.local]
enabled = true
replay = "allow"
"""


def ok(spec: NodeSpec, *args: str) -> dict:
    rc, out, err = run_cli(spec, *args)
    assert rc == 0, f"{args} on node-{spec.index} failed: {err}"
    return out


def transcript_ids(spec: NodeSpec) -> set[str]:
    conn = sqlite3.connect(spec.home / "data" / "memory.db")
    try:
        return {r[0] for r in conn.execute("SELECT id FROM memory_transcripts")}
    finally:
        conn.close()


def test_transcripts_replicate_only_when_opted_in_and_only_to_peers_that_see_the_namespace(mesh_factory,
                                                                                          tmp_path: Path) -> None:
    mesh = mesh_factory(3, mcp_http=False, extra_config=CONFIG)
    a, b, c = mesh.layout.nodes
    mesh.start()
    text_file = tmp_path / "t.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    local_mem = ok(a, "store", "a local memory", "--namespace", "local")["id"]
    local = ok(a, "transcript", "store", str(text_file), "--namespace", "local", "--span", f"{local_mem}:0:4")
    assert "replicating_to" not in local
    team_mem = ok(a, "store", "a team memory", "--namespace", "team")["id"]
    wait_for(lambda: run_cli(b, "get", team_mem)[0] == 0, "the team memory on node 2")
    team = ok(a, "transcript", "store", str(text_file), "--namespace", "team", "--span", f"{team_mem}:6:21")
    assert team["replicating_to"] == [b.agent_id]

    replayed = wait_for(lambda: (r := run_cli(b, "transcript", "replay", team_mem, "--full"))[0] == 0
                        and r[1]["count"] == 1 and r[1], "the team transcript replayed on node 2")
    got = replayed["transcripts"][0]
    assert got["text"] == TEXT and got["spans"][0]["text"] == "où est le café?"
    assert got["attest_level"] == "peer_attested" and got["agent"] == a.agent_id
    # The local transcript was written first and never left node 1; node 3 may not see "team" at all.
    assert transcript_ids(b) == {team["id"]}
    wait_for(lambda: run_cli(c, "get", local_mem)[0] == 0, "the local memory on node 3")
    assert transcript_ids(c) == set()
    assert transcript_ids(a) == {team["id"], local["id"]}


def test_a_peer_that_was_down_gets_the_transcript_by_catch_up_sync(mesh_factory, tmp_path: Path) -> None:
    # Each of the 3 attempts to the down node waits up to ack_timeout_s for its link: kept short.
    mesh = mesh_factory(2, mcp_http=False, a2a={"retry_delays_s": (0.2, 0.4), "ack_timeout_s": 0.5},
                        extra_config=CONFIG)
    a, b = mesh.layout.nodes
    mesh.start()
    # Node 1 sends a restricted namespace's memory only to a peer it knows reads the signed sharing list (its
    # first pull from node 2 tells it): known before node 2 goes down, the memory goes out live and dies there.
    wait_for(lambda: b.agent_id in ok(a, "status").get("a2a", {}).get("memory_put_v2_to", []),
             "node 1 knowing what node 2 reads")
    mesh.stop(2)
    text_file = tmp_path / "t.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    mem = ok(a, "store", "a team memory", "--namespace", "team")["id"]
    team = ok(a, "transcript", "store", str(text_file), "--namespace", "team", "--span", f"{mem}:0:4")
    wait_for(lambda: len(ok(a, "a2a", "dead-letters")) == 2, "node 1's two messages to node 2 dead-lettered")
    mesh.start([2])
    wait_for(lambda: transcript_ids(b) == {team["id"]}, "node 2 caught the transcript up by sync")
    replayed = ok(b, "transcript", "replay", mem)
    assert replayed["transcripts"][0]["spans"][0]["text"] == "user"
    wait_for(lambda: ok(a, "a2a", "dead-letters") == [], "dead letters to node 2 cleared after its catch-up")
