"""Restore from the mesh between real `ai-memory serve` processes: a node of a three-node mesh loses its database,
starts again with `serve --restore`, and gets back every memory and link it held (its own and the others'), each
verifying, with its audit chain whole; its change log goes on past the cursors its peers kept."""

from __future__ import annotations

import subprocess

import pytest

from testbed.mesh import LocalMesh, NodeSpec
from testbed.mesh.local import node_command, node_env, wait_ready
from tests.integration.conftest import ok
from tests.integration.peer_play import change_log_seq

pytestmark = pytest.mark.integration

SYNC_EVERY = "[federation]\nsync_interval_s = 1.0\n"


def _held(spec: NodeSpec) -> tuple[set, set]:
    memories = ok(spec, "list", "--limit", "100")
    links = ok(spec, "links", "--limit", "100")
    return ({(m["id"], m["version"], m["content"], m["origin"]) for m in memories},
            {(r["link_id"], r["relation"], r["observed_by"]) for r in links})


def _serve_restore(mesh: LocalMesh, spec: NodeSpec) -> None:
    """Start ``spec``'s node with `serve --restore`, owned by ``mesh`` (stopped with it), and wait for its links."""
    with open(spec.home / "node.log", "ab") as log:
        mesh.procs[spec.index] = subprocess.Popen(
            [*node_command(spec), "--restore"], env=node_env(spec), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
    wait_ready(mesh.layout, [spec], mesh.procs, want_links=True)


def test_a_node_whose_database_is_lost_is_restored_from_its_peers(mesh_factory, cli, wait_for, node_log) -> None:
    mesh = mesh_factory(3, mcp_http=False, extra_config=SYNC_EVERY)
    n1, n2, n3 = mesh.layout.nodes
    mesh.start()
    mine = [ok(n1, "store", f"node 1's memory {i}") for i in range(3)]
    ok(n1, "update", mine[0]["id"], "--content", "node 1's memory 0, second version")
    theirs = [ok(n2, "store", "node 2's memory"), ok(n3, "store", "node 3's memory")]
    # A link's ends must be on the node that makes it.
    wait_for(lambda: all(len(_held(s)[0]) == 5 for s in (n1, n2, n3)), "every memory on every node")
    ok(n1, "link", mine[0]["id"], theirs[0]["id"], "cites")
    ok(n1, "link", mine[1]["id"], mine[2]["id"], "related_to")
    ok(n2, "link", theirs[0]["id"], mine[1]["id"], "answers")
    ok(n3, "link", theirs[1]["id"], theirs[0]["id"], "related_to")
    wait_for(lambda: all(len(_held(s)[0]) == 5 and len(_held(s)[1]) == 4 for s in (n1, n2, n3)),
             "every memory and link on every node")
    before = _held(n1)
    levels = {m["id"]: m["attest_level"] for m in ok(n1, "list", "--limit", "100")}
    mesh.stop(1)
    old_head = change_log_seq(n1)

    # A store that holds anything is not restored over.
    rc, _, err = cli(n1, "serve", "--restore", json=False)
    assert rc == 1 and "store_not_empty" in err, err

    for f in (n1.home / "data").glob("memory.db*"):
        f.unlink()
    _serve_restore(mesh, n1)
    wait_for(lambda: (ok(n1, "status")["sync"]["restore"] or {}).get("state") == "done", "the restore to end")
    restore = ok(n1, "status")["sync"]["restore"]
    assert restore["percent"] == 100.0 and restore["items"] >= 9 and all(
        p["done"] and p["own_writes"] for p in restore["peers"].values()), restore

    assert _held(n1) == before
    memories = ok(n1, "list", "--limit", "100")
    assert {m["id"]: m["attest_level"] for m in memories} == levels  # own self_signed, the others peer_attested
    for ref in [m["id"] for m in memories] + [r["link_id"] for r in ok(n1, "links", "--limit", "100")]:
        assert ok(n1, "verify", ref)["signature_verified"] is True, ref
    assert ok(n1, "audit", "verify")["ok"] is True
    progress = [e for e in node_log(n1) if e.get("event") == "restore_progress"]
    assert progress and progress[-1]["percent"] == 100.0 and progress[-1]["items"] >= 9
    assert node_log.has(n1, "restore_done")
    assert not (n1.home / "data" / "restore.json").exists()

    # The peers' cursors on node 1's lost log are behind its new one: a change made now reaches them.
    assert change_log_seq(n1) > old_head
    after = ok(n1, "store", "written after the restore")
    wait_for(lambda: cli(n2, "get", after["id"])[0] == 0 and cli(n3, "get", after["id"])[0] == 0,
             "the new memory on nodes 2 and 3")
