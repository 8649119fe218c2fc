"""The mTLS A2A transport end to end, between real `ai-memory serve` processes (docs/protocol.md).

Time is driven through the retry schedule in each node's config, never by sleeping through the
default 1/5/25 s schedule; every wait polls a condition with a bounded deadline.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _peer_row(cli, spec, peer_agent_id):
    rc, rows, err = cli(spec, "peers")
    assert rc == 0, err
    return next(r for r in rows if r["agent_id"] == peer_agent_id)


def _send(cli, spec, to, *extra):
    rc, out, err = cli(spec, "a2a", "send", "--to", to, *extra)
    assert isinstance(out, dict), f"rc={rc} stdout={out!r} stderr={err}"
    return rc, out


def test_ack_then_duplicate_then_expired(mesh_factory, cli, node_log, wait_for):
    mesh = mesh_factory(2)
    mesh.start()
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)

    rc, out = _send(cli, n1, n2.agent_id)
    assert rc == 0 and out["http_status"] == 200
    assert out["ack"]["accepted"] is True and out["ack"]["reason"] is None
    assert out["ack"]["recipient"] == n2.agent_id and out["ack"]["correlation_id"] == out["correlation_id"]
    cid = out["correlation_id"]

    rc, out = _send(cli, n1, n2.agent_id, "--correlation-id", cid)
    assert rc == 3 and out["http_status"] == 200  # an ACK, but not "accepted"
    assert out["ack"] == {**out["ack"], "accepted": False, "reason": "duplicate", "correlation_id": cid}

    for ttl in ("0", "-5"):
        rc, out = _send(cli, n1, n2.agent_id, f"--ttl={ttl}")
        assert rc == 3 and out["ack"] is None
        assert out["http_status"] == 410 and out["error"]["code"] == "expired"
        expired_cid = out["correlation_id"]
        wait_for(lambda cid=expired_cid: node_log.has(n2, "expired", correlation_id=cid, sender=n1.agent_id),
                 f"the receiver's structured 'expired' log line for {expired_cid}", timeout_s=10)


def test_queued_message_is_delivered_on_a_retry_after_the_peer_starts(mesh_factory, cli, node_log, wait_for):
    mesh = mesh_factory(2, retry_delays_s=(1.0, 5.0, 25.0))
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    mesh.start([1], want_links=False)

    rc, out, err = cli(n1, "a2a", "send", "--to", n2.agent_id, "--queue")
    assert rc == 0, err
    cid = out["queued"]
    # The first attempt fails while node 2 is down, and the schedule takes over.
    wait_for(lambda: node_log.has(n1, "retry_scheduled", correlation_id=cid, attempt=1),
             "node 1 to schedule a retry", timeout_s=15)
    assert _peer_row(cli, n1, n2.agent_id)["outbox_depth"] == 1

    mesh.start([2], want_links=False)
    wait_for(lambda: _peer_row(cli, n1, n2.agent_id)["outbox_depth"] == 0, "node 1's outbox to drain",
             timeout_s=30, poll_s=0.3)
    row = _peer_row(cli, n1, n2.agent_id)
    assert row["dead_letters"] == 0
    # Node 2 holds it: the same correlation_id again is a duplicate there.
    rc, out = _send(cli, n1, n2.agent_id, "--correlation-id", cid)
    assert out["ack"]["reason"] == "duplicate"
    assert not node_log.has(n1, "dead_letter", correlation_id=cid)


def test_a_message_waiting_its_retry_for_a_link_goes_out_when_the_link_comes_up(mesh_factory, cli, node_log,
                                                                                wait_for):
    """Its retry is 5 minutes away; the link's coming up, not the schedule, sends it (a replayed dead letter
    queued while the peer was down goes out so too)."""
    mesh = mesh_factory(2, a2a={"ttl_s": 3600.0, "retry_delays_s": [300.0], "ack_timeout_s": 0.5})
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    mesh.start([1], want_links=False)
    rc, out, err = cli(n1, "a2a", "send", "--to", n2.agent_id, "--queue")
    assert rc == 0, err
    cid = out["queued"]
    wait_for(lambda: node_log.has(n1, "retry_scheduled", correlation_id=cid, attempt=1),
             "the first attempt to fail while node 2 is down", timeout_s=15)
    mesh.start([2], want_links=False)
    wait_for(lambda: _peer_row(cli, n1, n2.agent_id)["outbox_depth"] == 0, "the message sent once the link is up",
             timeout_s=60, poll_s=0.3)
    assert node_log.has(n1, "sent_on_link_up", peer=n2.agent_id, rows=1)
    rc, out = _send(cli, n1, n2.agent_id, "--correlation-id", cid)
    assert out["ack"]["reason"] == "duplicate"  # node 2 holds it


# Short schedule: 3 attempts of up to ack_timeout_s each (waiting for a link that never comes up). Where the
# peer starts after the replay, the replayed message's attempts must outlast the peer's start: 2 s each.
DEAD_LETTER_CONFIG = "[a2a]\nretry_delays_s = [0.2, 0.4]\nack_timeout_s = 2.0\n"
# Where the peer is up before the replay, the dead-lettering alone is waited for: shorter.
DEAD_LETTER_SOON_CONFIG = "[a2a]\nretry_delays_s = [0.2, 0.4]\nack_timeout_s = 0.5\n"


def _dead_letter_a_ping(mesh, cli, node_log, wait_for):
    """Node 1 up, node 2 never started: a queued ping ends in node 1's dead letters; returns its row."""
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    mesh.start([1], want_links=False)
    rc, out, err = cli(n1, "a2a", "send", "--to", n2.agent_id, "--queue")
    assert rc == 0, err
    cid = out["queued"]

    def dead():
        rc, rows, err = cli(n1, "a2a", "dead-letters")
        assert rc == 0, err
        return [r for r in rows if r["correlation_id"] == cid]

    rows = wait_for(dead, "the message to reach the dead letters", timeout_s=30, poll_s=0.3)
    assert rows[0]["peer"] == n2.agent_id and rows[0]["kind"] == "ping"
    assert rows[0]["attempts"] == 3  # first attempt + one per delay
    assert rows[0]["last_error"] and "link_down" in rows[0]["last_error"]
    assert node_log.has(n1, "dead_letter", correlation_id=cid)
    assert _peer_row(cli, n1, n2.agent_id)["outbox_depth"] == 0
    return rows[0]


def _replay_all(cli, n1, dead_row):
    rc, replayed, err = cli(n1, "a2a", "dead-letters", "--replay-all")
    assert rc == 0, err
    assert [r["dead_letter"] for r in replayed] == [dead_row["id"]]
    return replayed[0]["correlation_id"]


def _assert_delivered(cli, wait_for, n1, n2, cid):
    def delivered():
        row = _peer_row(cli, n1, n2.agent_id)
        return row["outbox_depth"] == 0 and row["dead_letters"] == 0

    wait_for(delivered, "the replayed message to be delivered", timeout_s=30, poll_s=0.3)
    rc, out = _send(cli, n1, n2.agent_id, "--correlation-id", cid)
    assert out["ack"]["reason"] == "duplicate"  # node 2 holds it


def test_unreachable_peer_dead_letters_then_replay_delivers(mesh_factory, cli, node_log, wait_for):
    mesh = mesh_factory(2, extra_config=DEAD_LETTER_CONFIG)
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    dead_row = _dead_letter_a_ping(mesh, cli, node_log, wait_for)
    # Re-queued with a fresh id and expiry; the peer comes up inside the new attempt window.
    new_cid = _replay_all(cli, n1, dead_row)
    mesh.start([2], want_links=False)
    _assert_delivered(cli, wait_for, n1, n2, new_cid)


def test_dead_letter_is_kept_after_the_peer_comes_back_until_replayed(mesh_factory, cli, node_log, wait_for):
    mesh = mesh_factory(2, extra_config=DEAD_LETTER_SOON_CONFIG)
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    dead_row = _dead_letter_a_ping(mesh, cli, node_log, wait_for)
    mesh.start([2])  # both links up: node 2 has pulled node 1's change log
    new_cid = _replay_all(cli, n1, dead_row)
    _assert_delivered(cli, wait_for, n1, n2, new_cid)
    # The node that sent it says so: which dead letter went out again, under which correlation id.
    assert node_log.has(n1, "dead_letter_replayed", dead_letter=dead_row["id"], correlation_id=new_cid,
                        peer=n2.agent_id)


MEMORIES = 50
# Node 2 stays away for as long as the 50 CLI stores take, which a loaded machine stretched past the default
# 60 s TTL (68 s measured): the oldest rows were then due no more before they expired and went to the dead
# letters, and the outbox held 46 rows, not 50 (retry.py: no attempt at or after expires_at). An hour's
# TTL, and a schedule that lasts longer (each delay runs from a failed attempt), keep every row queued
# whatever the load; the delays stay short so the restarted node resends within seconds.
AWAY_TTL_S = 3600.0
AWAY_RETRY_DELAYS_S = (1.0,) * 40 + (5.0,) * 720


def test_sigkill_of_the_sender_loses_and_duplicates_nothing(mesh_factory, cli, node_log, wait_for):
    assert sum(AWAY_RETRY_DELAYS_S) >= AWAY_TTL_S  # only the TTL could take a row out: nothing dead-letters
    mesh = mesh_factory(2, a2a={"ttl_s": AWAY_TTL_S, "retry_delays_s": list(AWAY_RETRY_DELAYS_S)})
    n1, n2 = mesh.layout.node(1), mesh.layout.node(2)
    mesh.start()
    mesh.stop(2)

    def store(i: int) -> str:
        rc, out, err = cli(n1, "store", f"kill-9 memory {i}", "--title", f"m{i}")
        assert rc == 0, err
        return out["id"]

    ids = [store(i) for i in range(MEMORIES)]
    assert len(set(ids)) == MEMORIES
    # The running sender has picked them up and is failing attempts against the stopped peer.
    wait_for(lambda: sum(e.get("event") == "retry_scheduled" for e in node_log(n1)) >= 1,
             "node 1 to be retrying its outbox", timeout_s=20)
    row = _peer_row(cli, n1, n2.agent_id)
    assert (row["outbox_depth"], row["dead_letters"]) == (MEMORIES, 0)

    mesh.stop(1, kill=True)
    mesh.start([2], want_links=False)
    mesh.start([1])

    def received():
        rc, rows, err = cli(n2, "list", "--limit", "100")
        assert rc == 0, err
        return rows if len(rows) >= MEMORIES else None

    wait_for(received, f"node 2 to hold {MEMORIES} memories", timeout_s=60, poll_s=0.5)
    wait_for(lambda: _peer_row(cli, n1, n2.agent_id)["outbox_depth"] == 0, "node 1's outbox to drain",
             timeout_s=30, poll_s=0.3)
    rc, rows, err = cli(n2, "list", "--limit", "100")
    assert rc == 0, err
    got = [r["id"] for r in rows]
    assert len(got) == MEMORIES and set(got) == set(ids)
    assert all(r["version"] == 1 and r["origin"] == n1.agent_id for r in rows)
    assert _peer_row(cli, n1, n2.agent_id)["dead_letters"] == 0
