from pathlib import Path

import pytest

from node.config import ConfigError, NodeConfig, from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_loads_and_equals_the_defaults_it_documents(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs" / "node.example.toml", env={"AI_MEMORY_HOME": str(tmp_path)})
    defaults = from_dict({"agent_id": "ai:node-1@lab"}, env={"AI_MEMORY_HOME": str(tmp_path)})
    assert cfg == defaults
    assert cfg.a2a.retry_delays_s == (1.0, 5.0, 25.0)
    assert cfg.a2a.seen_cache_size == 10_000


def test_env_home_overrides_config_home(tmp_path: Path) -> None:
    cfg = from_dict({"home": "/nonexistent/x"}, env={"AI_MEMORY_HOME": str(tmp_path)})
    assert cfg.home == tmp_path
    assert cfg.db_path == tmp_path / "data" / "memory.db"
    assert cfg.keys_dir == tmp_path / "keys"


def test_config_home_used_without_env(tmp_path: Path) -> None:
    assert from_dict({"home": str(tmp_path)}, env={}).home == tmp_path


def test_malformed_toml_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "node.toml"
    bad.write_text("agent_id = [unterminated\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad, env={})
    assert err.value.code == "config_malformed"
    assert str(bad) in err.value.message


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "nope.toml", env={})
    assert err.value.code == "config_not_found"


@pytest.mark.parametrize("raw,needle", [
    ({"a2a": {"ttl_s": "sixty"}}, "a2a.ttl_s"),
    ({"a2a": {"ttl_s": -1}}, "a2a.ttl_s"),
    ({"a2a": {"seen_cache_size": True}}, "a2a.seen_cache_size"),
    ({"a2a": {"retry_delays_s": [1, "x"]}}, "a2a.retry_delays_s[1]"),
    ({"mesh": {"listen_port": 70000}}, "mesh.listen_port"),
    ({"mesh": {"peers": [{"agent_id": "x"}]}}, "mesh.peers[0]"),
    ({"mesh": {"peers": [{"agent_id": "x", "url": "http://a"}]}}, "mesh.peers[0].url"),
    ({"federation": {"write_quorum": 0}}, "federation.write_quorum"),
    ({"federation": {"write_quorum": "most"}}, "federation.write_quorum"),
    ({"mcp": {"http_port": 8080, "http_host": "0.0.0.0"}}, "mcp.http_host"),
    ({"limits": {"max_content_bytes": 0}}, "limits.max_content_bytes"),
    ({"log": {"level": "loud"}}, "log.level"),
])
def test_invalid_value_names_the_key(raw: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(raw, env={})
    assert err.value.code == "config_invalid"
    assert needle in err.value.message


@pytest.mark.parametrize("raw,needle", [({"bogus": 1}, "bogus"), ({"a2a": {"ttl": 60}}, "a2a.ttl")])
def test_unknown_key_is_named(raw: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(raw, env={})
    assert err.value.code == "config_unknown_key"
    assert needle in err.value.message


@pytest.mark.parametrize("quorum,nodes,expected", [(1, 3, 1), ("majority", 3, 2), ("majority", 5, 3), (7, 3, 3)])
def test_quorum_size(quorum: object, nodes: int, expected: int) -> None:
    cfg = from_dict({"federation": {"write_quorum": quorum}}, env={})
    assert cfg.quorum_size(nodes) == expected


def test_namespaces_and_peers_parse() -> None:
    cfg: NodeConfig = from_dict({
        "mesh": {"peers": [{"agent_id": "ai:b", "url": "https://127.0.0.1:7444/"}]},
        "federation": {"namespaces": {"team/x": {"peers": ["ai:b"]}}},
    }, env={})
    assert cfg.mesh.peers[0].url == "https://127.0.0.1:7444"
    assert cfg.federation.namespaces["team/x"].peers == ("ai:b",)


@pytest.mark.parametrize("raw,needle", [
    ({"mesh": {"reconnect_min_s": 5.0, "reconnect_max_s": 1.0}}, "reconnect_min_s"),
    ({"mesh": {"peers": [{"agent_id": "ai:b", "url": "https://a:1"}, {"agent_id": "ai:b", "url": "https://b:1"}]}},
     "twice"),
    ({"agent_id": "ai:me", "mesh": {"peers": [{"agent_id": "ai:me", "url": "https://a:1"}]}}, "itself"),
    ({"federation": {"orphan_hold_s": -1}}, "orphan_hold_s"),
    ({"federation": {"send_window_bytes": 0}}, "federation.send_window_bytes"),
    ({"federation": {"links_per_envelope": 0}}, "federation.links_per_envelope"),
    ({"federation": {"links_per_envelope": 101}}, "1..100"),
    ({"storage": {"synchronous": "off"}}, "storage.synchronous"),
    ({"storage": {"fts_merge_pages": -1}}, "storage.fts_merge_pages"),
    ({"storage": {"integrity_check_interval_s": -1}}, "storage.integrity_check_interval_s"),
    ({"storage": {"start_check_max_bytes": -1}}, "storage.start_check_max_bytes"),
    ({"storage": {"integrity_check_interval_s": float("nan")}}, "storage.integrity_check_interval_s"),
])
def test_inconsistent_settings_are_refused(raw: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(raw, env={})
    assert needle in err.value.message


def test_transcripts_namespace_tables_override_the_shared_defaults() -> None:
    cfg = from_dict({"transcripts": {"max_bytes": 10, "team": {"enabled": True, "replay": "allow"}}}, env={})
    team, other = cfg.transcripts.policy("team"), cfg.transcripts.policy("other")
    assert (team.enabled, team.replay, team.max_bytes) == (True, "allow", 10)
    assert (other.enabled, other.replay, other.max_bytes) == (False, "deny", 10)


@pytest.mark.parametrize(("raw", "code"), [
    ({"team": {"replay": "sometimes"}}, "config_invalid"),
    ({"team": {"enabled": 1}}, "config_invalid"),
    ({"team": {"ttl_s": 0}}, "config_invalid"),
    ({"team": {"colour": "red"}}, "config_unknown_key"),
    ({"lifecycle_batch": 0}, "config_invalid"),
    ({"typo": 3}, "config_unknown_key"),
])
def test_bad_transcripts_settings_are_refused(raw: dict, code: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"transcripts": raw}, env={})
    assert err.value.code == code
