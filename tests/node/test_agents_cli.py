"""`ai-memory agents list / delegate / revoke / token` and `identity list` on a real home, and the
``[[mcp.agents]]`` settings' validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mesh import keys
from node.cli import main
from node.config import ConfigError, from_dict

NODE = "ai:node-1@lab"
BOT = "ai:claude-code@laptop"


def run(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, object, str]:
    rc = main(["--home", str(home), *args, "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if out.strip() else None, err


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "n1"
    keys.generate_identity(h / "keys", NODE)
    (h / "config.toml").write_text(f'agent_id = "{NODE}"\n', encoding="utf-8")
    return h


def test_delegate_list_revoke_and_delegate_again_with_a_new_key(capsys, home: Path) -> None:
    rc, made, err = run(capsys, home, "agents", "delegate", BOT)
    assert rc == 0, err
    rc, listed, err = run(capsys, home, "identity", "list")
    assert rc == 0, err
    assert [(r["agent_id"], r["trust"], r["fingerprint"]) for r in listed if r["trust"] == "agent"] \
        == [(BOT, "agent", made["fingerprint"])]
    rc, rows, err = run(capsys, home, "agents", "list")
    assert rc == 0 and [(r["agent_id"], r["state"]) for r in rows] == [(BOT, "live")], err
    rc, revoked, err = run(capsys, home, "agents", "revoke", BOT)
    assert rc == 0 and [r["delegation_id"] for r in revoked] == [made["delegation_id"]], err
    assert not (home / "keys" / "agents" / f"{BOT}.priv").exists()
    rc, rows, err = run(capsys, home, "agents", "list")
    assert [r["state"] for r in rows] == ["revoked"]
    rc, again, err = run(capsys, home, "agents", "delegate", BOT)
    assert rc == 0, err
    assert again["fingerprint"] != made["fingerprint"] and again["delegation_id"] != made["delegation_id"]
    rc, rows, err = run(capsys, home, "agents", "list")
    assert [r["state"] for r in rows] == ["live"]


def test_a_token_is_made_once_per_ask_0600(capsys, home: Path) -> None:
    rc, first, err = run(capsys, home, "agents", "token", BOT)
    assert rc == 0, err
    path = home / "keys" / "agents" / f"{BOT}.token"
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_text().strip() == first["token"]
    rc, second, _ = run(capsys, home, "agents", "token", BOT)
    assert second["token"] != first["token"]


@pytest.mark.parametrize(("agents", "key"), [
    ([{"id": BOT}, {"id": BOT}], "mcp.agents[1].id"),
    ([{"id": BOT, "requests_per_second": 0}], "mcp.agents[0].requests_per_second"),
    ([{"id": BOT, "max_bytes": -1}], "mcp.agents[0].max_bytes"),
    ([{"id": BOT, "quota": 1}], "mcp.agents[0]"),
    ({"id": BOT}, "mcp.agents"),
])
def test_a_bad_agents_table_is_refused_naming_its_key(tmp_path: Path, agents: object, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict({"agent_id": NODE, "home": str(tmp_path), "mcp": {"agents": agents}}, env={})
    assert e.value.code == "config_invalid" and key in e.value.message


def test_agent_settings_hold_together(tmp_path: Path) -> None:
    for mcp, key in (({"agent_ids": "some"}, "mcp.agent_ids"), ({"max_agents": 0}, "mcp.max_agents"),
                     ({"max_agents": 1, "agents": [{"id": BOT}, {"id": "ai:two@x"}]}, "mcp.agents"),
                     ({"agent_delegation_days": 0}, "mcp.agent_delegation_days")):
        with pytest.raises(ConfigError) as e:
            from_dict({"agent_id": NODE, "home": str(tmp_path), "mcp": mcp}, env={})
        assert key in e.value.message, mcp
    cfg = from_dict({"agent_id": NODE, "home": str(tmp_path)}, env={})
    assert cfg.permissions.max_bytes_per_agent == 100 * 1024 * 1024
