"""`ai-memory status` / `peers` without a running node, and options given before or after the subcommand."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from node.cli import build_parser
from tests.node.conftest import LAB_NODE as A
from tests.node.conftest import run_cli as run


def test_status_without_a_node_reads_the_store_and_says_so(capsys, home: Path) -> None:
    rc, out, err = run(capsys, "--home", str(home), "status", "--json")
    assert rc == 3  # no node running: the report, and the exit of a probe that failed
    status = json.loads(out)
    assert status["source"] == "store" and status["agent_id"] == A and status["node_running"] is False
    assert "no node answers" in err


def test_peers_without_a_node_says_it_read_the_store(capsys, home: Path) -> None:
    rc, out, err = run(capsys, "peers", "--home", str(home))
    assert rc == 0 and "no peers" in out
    assert "no node answers" in err and "link state not known" in err


def test_the_peers_table_shows_each_peers_parked_sync_items(capsys, home: Path) -> None:
    toml = home / "node.toml"
    toml.write_text(f'agent_id = "{A}"\nhome = "{home}"\n[[mesh.peers]]\nagent_id = "ai:b@lab"\n'
                    'url = "https://127.0.0.1:7444/"\n', encoding="utf-8")
    rc, out, _ = run(capsys, "--config", str(toml), "peers")
    header, row = out.splitlines()[:2]
    assert rc == 0 and header.split()[-1] == "parked" and row.split()[0] == "ai:b@lab" and row.split()[-1] == "0"


@pytest.mark.parametrize("order", ["before", "after"])
def test_config_and_json_are_accepted_before_or_after_the_subcommand(capsys, home: Path, order: str) -> None:
    toml = home / "node.toml"
    toml.write_text(f'agent_id = "{A}"\nhome = "{home}"\n', encoding="utf-8")
    opts = ["--config", str(toml), "--json"]
    argv = [*opts, "status"] if order == "before" else ["status", *opts]
    rc, out, _ = run(capsys, *argv)
    assert rc == 3 and json.loads(out)["agent_id"] == A


def test_a_mistyped_home_is_an_error_and_creates_nothing(capsys, tmp_path: Path) -> None:
    wrong = tmp_path / "typo"
    rc, out, err = run(capsys, "--home", str(wrong), "store", "hello")
    assert rc == 1 and err.startswith("ai-memory: error [home_not_found]: ") and err.count("\n") == 1
    assert not wrong.exists()
    rc, _, err = run(capsys, "--home", str(wrong), "status")
    assert rc == 1 and "[home_not_found]" in err and not wrong.exists()


def _parsers(parser: argparse.ArgumentParser, path: str = "ai-memory"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_and_argument_has_a_help_text() -> None:
    missing = [f"{path}: {a.option_strings or a.dest}" for path, p in _parsers(build_parser())
               for a in p._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help]
    assert not missing, missing


def test_approvals_rotate_key_keeps_the_previous_key_in_its_grace(capsys, home: Path) -> None:
    from node.permissions import approval_api

    rc, out, _ = run(capsys, "--home", str(home), "approvals", "rotate-key", "--json")
    first = json.loads(out)
    rc2, out2, _ = run(capsys, "--home", str(home), "approvals", "rotate-key")
    assert rc == rc2 == 0 and "the previous key verifies for 300 s more" in out2
    key_file = Path(first["key_path"])
    assert key_file.parent == home / "keys" and key_file.stat().st_mode & 0o777 == 0o600
    assert (home / "keys" / approval_api.PREV_KEY_FILE).exists()
