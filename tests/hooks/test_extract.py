"""The extract reference hook: its rules alone, then as a daemon proposing memories that cite their spans."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mesh import keys
from node.config import NodeConfig
from tests.node.conftest import AGENT, make_config
from tools.extract.hook import decide, propose

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "tools" / "extract" / "hook.py"

TRAIL = ("user: hi there.\n"
         "assistant: We decided to pin psycopg 3.2 for the café ☕ service. Then more.\n"
         "user: Remember: the staging key rotates on Mondays!\n"
         "[17] agent-7: TODO: write the runbook\n"
         "assistant (thinking): nothing to keep here.\n")


@pytest.fixture
def cfg(tmp_path: Path) -> NodeConfig:
    c = make_config(tmp_path / "home", transcripts={"ops": {"enabled": True}},
                    hooks={"reload_check_s": 0.01, "daemon_stop_grace_s": 2.0})
    keys.generate_identity(c.keys_dir, AGENT)
    return c


def test_rules_find_decisions_notes_and_follow_ups_with_exact_code_point_spans() -> None:
    found = propose(TRAIL)
    assert [(p.title, p.content) for p in found] == [
        ("decision", "We decided to pin psycopg 3.2 for the café ☕ service."),
        ("note", "Remember: the staging key rotates on Mondays!"),
        ("follow-up", "TODO: write the runbook")]
    assert all(TRAIL[p.start:p.end] == p.content for p in found)


def test_nothing_to_keep_is_allow_and_proposals_are_bounded() -> None:
    assert decide("pre_transcript_store", {"content": "just chatting."}, max_proposals=16) == {"decision": "allow"}
    many = "\n".join(f"TODO: item number {i}" for i in range(50))
    assert len(decide("pre_transcript_store", {"content": many}, max_proposals=5)["delta"]["memories"]) == 5


async def test_extract_daemon_proposals_become_memories_replaying_their_sentences(open_service) -> None:
    svc = await open_service([{"name": "extract", "events": ["pre_transcript_store"], "mode": "daemon",
                               "command": [sys.executable, str(HOOK)], "priority": -100}])
    stored = await svc.transcripts.store(TRAIL, namespace="ops")
    assert len(stored["spans"]) == 3
    texts = []
    for span in stored["spans"]:
        memory = await svc.memory_get(span["memory_id"])
        assert memory["namespace"] == "ops" and memory["source"] == f"transcript:{stored['id']}"
        replayed = await svc.transcripts.replay(span["memory_id"])
        texts.append(replayed["transcripts"][0]["spans"][0]["text"])
        assert texts[-1] == memory["content"]
    assert "TODO: write the runbook" in texts
