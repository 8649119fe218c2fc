"""hooks.toml validation: every error names the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.assemble import open_service
from node.config import from_dict
from node.hooks.config import Mode, load_hooks, parse_hooks
from node.hooks.decision import FailMode
from node.hooks.errors import HookError
from node.hooks.events import HookEvent
from tests.node.conftest import make_config

PATH = Path("/etc/node/hooks.toml")


def one(**kv: Any) -> dict[str, Any]:
    return {"hooks": [{"name": "h", "events": ["pre_store"], "command": ["/bin/true"], **kv}]}


def test_defaults_exec_for_writes_daemon_for_reads_and_class_deadline_as_timeout() -> None:
    f = parse_hooks({"hooks": [
        {"name": "w", "events": ["pre_store"], "command": "hooks/w.py --flag"},
        {"name": "r", "events": ["pre_recall", "post_recall"], "command": ["r"]},
        {"name": "mixed", "events": ["post_recall", "post_store"], "command": ["m"]},
    ]}, path=PATH)
    w, r, mixed = f.hooks
    assert (w.mode, w.timeout_ms, w.fail_mode, w.priority) == (Mode.EXEC, 5000, FailMode.OPEN, 0)
    assert w.command == ("/etc/node/hooks/w.py", "--flag") and w.cwd == Path("/etc/node")
    assert (r.mode, r.timeout_ms) == (Mode.DAEMON, 2000)
    assert (mixed.mode, mixed.timeout_ms) == (Mode.EXEC, 2000)
    assert f.by_event[HookEvent.POST_RECALL] == (r, mixed)


@pytest.mark.parametrize("raw,code,needle", [
    (one(timeout_ms=5001), "config_invalid", "hooks[0] (h).timeout_ms is above the write class deadline"),
    ({"hooks": [{"name": "r", "events": ["pre_recall"], "command": ["x"], "timeout_ms": 3000}]},
     "config_invalid", "read class deadline"),
    (one(timeout_ms=0), "config_invalid", "hooks[0] (h).timeout_ms must be > 0"),
    (one(mode="fork"), "config_invalid", "hooks[0] (h).mode must be one of exec | daemon"),
    (one(fail_mode="maybe"), "config_invalid", "hooks[0] (h).fail_mode"),
    (one(priority="high"), "config_invalid", "hooks[0] (h).priority must be an integer"),
    (one(priority=5000), "config_invalid", "hooks[0] (h).priority must be in"),
    (one(enabled="yes"), "config_invalid", "hooks[0] (h).enabled"),
    (one(env={"A": 1}), "config_invalid", "hooks[0] (h).env"),
    (one(events=[]), "config_invalid", "hooks[0] (h).events must be a non-empty list"),
    (one(events=["pre_store", "pre_stroe"]), "config_invalid", "hooks[0] (h).events[1] is not an event"),
    (one(command=[]), "config_invalid", "hooks[0] (h).command"),
    (one(command="'unterminated"), "config_invalid", "hooks[0] (h).command"),
    (one(timeoutms=5), "config_unknown_key", "hooks[0].timeoutms"),
    ({"hook": []}, "config_unknown_key", "hook"),
    ({"hooks": {"name": "x"}}, "config_invalid", "hooks must be an array"),
    ({"hooks": [{"events": ["pre_store"], "command": ["x"]}]}, "config_invalid", "hooks[0].name"),
    ({"hooks": [{"name": "a", "events": ["pre_store"], "command": ["x"]},
                {"name": "a", "events": ["post_store"], "command": ["y"]}]}, "config_invalid", "'a' is used twice"),
])
def test_invalid_hooks_file_names_the_key(raw: dict[str, Any], code: str, needle: str) -> None:
    with pytest.raises(HookError) as e:
        parse_hooks(raw, path=PATH)
    assert e.value.code == code
    assert needle in e.value.message and str(PATH) in e.value.message


def test_malformed_toml_and_missing_file(tmp_path: Path) -> None:
    assert load_hooks(tmp_path / "absent.toml") is None
    bad = tmp_path / "hooks.toml"
    bad.write_text("[[hooks]\n")
    with pytest.raises(HookError) as e:
        load_hooks(bad)
    assert e.value.code == "config_malformed" and str(bad) in e.value.message


async def test_service_refuses_to_open_on_an_invalid_hooks_file(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "home")
    cfg.home.mkdir(parents=True)
    cfg.hooks_path.write_text("[[hooks]]\nname = 'x'\nevents = ['pre_store']\ncommand = ['x']\ntimeout_ms = 9000\n")
    with pytest.raises(HookError) as e:
        await open_service(cfg)
    assert e.value.code == "config_invalid" and "timeout_ms" in e.value.message


def test_hooks_path_from_config_key_and_env(tmp_path: Path) -> None:
    assert from_dict({"home": str(tmp_path)}, env={}).hooks_path == tmp_path / "hooks.toml"
    assert from_dict({"home": str(tmp_path), "hooks": {"config": "etc/h.toml"}}, env={}).hooks_path == \
        tmp_path / "etc" / "h.toml"
    env = {"AI_MEMORY_HOOKS_CONFIG": "/srv/hooks.toml"}
    assert from_dict({"home": str(tmp_path), "hooks": {"config": "x.toml"}}, env=env).hooks_path == \
        Path("/srv/hooks.toml")


@pytest.mark.parametrize("raw,needle", [
    ({"hooks": {"daemon_queue_max": 0}}, "hooks.daemon_queue_max"),
    ({"hooks": {"daemon_restart_min_s": 5.0, "daemon_restart_max_s": 1.0}}, "hooks.daemon_restart_min_s"),
    ({"hooks": {"reload": 1}}, "hooks.reload"),
])
def test_node_config_hooks_section_is_validated(raw: dict[str, Any], needle: str) -> None:
    from node.config import ConfigError
    with pytest.raises(ConfigError) as e:
        from_dict(raw, env={})
    assert needle in e.value.message


def test_a_directory_where_the_file_should_be_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "hooks.toml").mkdir()
    with pytest.raises(HookError) as e:
        load_hooks(tmp_path / "hooks.toml")
    assert e.value.code == "config_malformed" and "cannot be read" in e.value.message
