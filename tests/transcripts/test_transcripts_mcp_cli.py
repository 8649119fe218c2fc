"""Transcript tools through the official MCP SDK client (stdio, a real subprocess) and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import anyio

from tests.mcp.conftest import ROOT, Home, err, make_home, ok, stdio_session

TEST_TIMEOUT_S = 90
CLI_TIMEOUT_S = 60
TEXT = "user: où est le café? ☕\nassistant: rue de la Paix 🙂\n"
# "team" keeps transcripts and lets them be replayed whole; "locked" keeps them, spans only.
POLICY = '\n[transcripts.team]\nenabled = true\nreplay = "allow"\n\n[transcripts.locked]\nenabled = true\n'


def _home(tmp_path) -> Home:
    home = make_home(tmp_path)
    home.toml.write_text(home.toml.read_text(encoding="utf-8") + POLICY, encoding="utf-8")
    return home


async def test_transcript_tools_over_stdio(tmp_path) -> None:
    home = _home(tmp_path)
    start, end = TEXT.index("café"), TEXT.index("☕") + 1
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_session(home) as s:
            a = (await ok(s, "memory_store", {"content": "the café", "namespace": "team"}))["id"]
            stored = await ok(s, "memory_transcript_store", {"content": TEXT, "namespace": "team", "spans": [
                {"memory_id": a, "start": start, "end": end}]})
            assert stored["attest_level"] == "self_signed"
            r = await ok(s, "memory_replay", {"memory_id": a})
            assert r["transcripts"][0]["spans"] == [{"start": start, "end": end, "text": "café? ☕"}]
            full = await ok(s, "memory_replay", {"memory_id": a, "full": True})
            assert full["transcripts"][0]["text"] == TEXT
            b = (await ok(s, "memory_store", {"content": "locked", "namespace": "locked"}))["id"]
            await ok(s, "memory_transcript_store", {"content": TEXT, "namespace": "locked",
                                                    "spans": [{"memory_id": b, "start": 0, "end": 4}]})
            assert (await ok(s, "memory_replay", {"memory_id": b}))["transcripts"][0]["spans"][0]["text"] == "user"
            assert await err(s, "memory_replay", {"memory_id": b, "full": True}) == "permission_denied"
            assert await err(s, "memory_transcript_store", {"content": TEXT}) == "transcripts_disabled"
            assert await err(s, "memory_transcript_store", {"content": "abc", "namespace": "team", "spans": [
                {"memory_id": a, "start": 0, "end": 4}]}) == "span_out_of_range"


def _cli(home: Home, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli", "--config", str(home.toml), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, input=stdin,
                          env={"AI_MEMORY_HOME": str(home.cfg.home), "PYTHONPATH": str(ROOT)})


def test_transcript_cli(tmp_path) -> None:
    home = _home(tmp_path)
    a = _cli(home, "store", "alpha", "--namespace", "locked").stdout.strip()
    stored = _cli(home, "transcript", "store", "-", "--namespace", "locked", "--span", f"{a}:6:10", "--json",
                  stdin=TEXT)
    assert stored.returncode == 0, stored.stderr
    assert json.loads(stored.stdout)["spans"] == [{"memory_id": a, "start": 6, "end": 10}]
    spans = _cli(home, "transcript", "replay", a)
    assert spans.returncode == 0 and "[6:10] où e" in spans.stdout
    denied = _cli(home, "transcript", "replay", a, "--full")
    assert denied.returncode == 1 and "error [permission_denied]" in denied.stderr
    bad = _cli(home, "transcript", "store", "-", "--namespace", "locked", "--span", "nonsense", stdin=TEXT)
    assert bad.returncode == 1 and "error [bad_input]" in bad.stderr
    done = json.loads(_cli(home, "transcript", "lifecycle", "--json").stdout)
    assert done["archived"] == [] and done["pruned"] == []
