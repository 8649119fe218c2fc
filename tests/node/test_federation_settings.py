"""Review: federation.send_window_bytes, links_per_envelope and background_nice, from TOML to what a node does."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import tomllib
from pathlib import Path

import pytest

from mesh import keys
from node import priority
from node.assemble import open_service
from node.config import ConfigError, NodeConfig, from_dict, load_config
from tests.node.conftest import AGENT, make_config
from tests.node.test_links_put import _decoded, _queued_links

B = "ai:b@lab"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("key", ["send_window_bytes", "links_per_envelope", "background_nice"])
@pytest.mark.parametrize("value", ["64", 64.0, 8.5, True, False, -1, [1], {"a": 1}])
def test_a_bad_value_is_a_clear_config_error(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"federation": {key: value}}, env={})
    assert err.value.code == "config_invalid" and f"federation.{key}" in err.value.message


@pytest.mark.parametrize("line", ['send_window_bytes = "64KiB"', "send_window_bytes = 65536.0",
                                  "send_window_bytes = true", "links_per_envelope = 2.5",
                                  "links_per_envelope = 0", "links_per_envelope = 1000"])
def test_bad_values_in_a_toml_file_are_refused(tmp_path: Path, line: str) -> None:
    p = tmp_path / "node.toml"
    p.write_text(f'agent_id = "ai:x"\n[federation]\n{line}\n')
    with pytest.raises(ConfigError) as err:
        load_config(p, env={})
    assert err.value.code == "config_invalid"


@pytest.mark.parametrize("value", [1, 1024, 4095])
def test_a_window_below_4_kib_is_refused(value: int) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"federation": {"send_window_bytes": value}}, env={})
    assert err.value.code == "config_invalid" and ">= 4096" in err.value.message


def test_a_window_of_4_kib_is_taken() -> None:
    assert from_dict({"federation": {"send_window_bytes": 4096}}, env={}).federation.send_window_bytes == 4096


def test_the_example_config_sets_the_defaults() -> None:
    raw = tomllib.loads((ROOT / "configs" / "node.example.toml").read_text())
    cfg = from_dict({"federation": {k: raw["federation"][k] for k in ("send_window_bytes", "links_per_envelope")}},
                    env={})
    d = from_dict({}, env={})
    assert (cfg.federation.send_window_bytes, cfg.federation.links_per_envelope) == \
        (d.federation.send_window_bytes, d.federation.links_per_envelope) == (65536, 100)


@pytest.mark.parametrize("most, kinds", [
    (1, ["link.put"] * 5),
    (2, ["links.put", "links.put", "link.put"]),
    (100, ["links.put"]),
])
async def test_links_per_envelope_one_sends_every_link_as_a_link_put(tmp_path: Path, most: int,
                                                                     kinds: list[str]) -> None:
    cfg = make_config(tmp_path / "home", mesh={"peers": [{"agent_id": B, "url": "https://127.0.0.1:1/"}]},
                      federation={"links_per_envelope": most})
    keys.generate_identity(cfg.keys_dir, AGENT)
    s = await open_service(cfg, require_identity=True)
    try:
        s.replicator.note_accepts(B, ["links.put"])
        ids = [(await s.memory_store(f"memory {i}"))["id"] for i in range(6)]
        out = await s.memory_link_many([{"src_id": ids[0], "dst_id": ids[i], "relation": "rel"} for i in range(1, 6)])
        assert out["made"] == 5
        to_b = await _queued_links(s, B)
        assert [r.kind for r in to_b] == kinds
        dsts = []
        for r in to_b:
            p = _decoded(r).payload
            dsts += [item["link"]["dst_id"] for item in p["links"]] if r.kind == "links.put" else [p["link"]["dst_id"]]
        assert dsts == ids[1:]
    finally:
        await s.close()


@pytest.mark.parametrize("value", [-1, 20, 100])
def test_background_nice_out_of_0_to_19_is_refused(value: int) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"federation": {"background_nice": value}}, env={})
    assert err.value.code == "config_invalid" and "0..19" in err.value.message


def _nice() -> int:
    """The calling thread's nice value."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not priority.SUPPORTED, reason="per-thread priorities are Linux only")
@pytest.mark.parametrize("steps", [0, 5, 19])
async def test_background_nice_lowers_the_writer_and_the_verifier_only(cfg: NodeConfig, steps: int) -> None:
    cfg = dataclasses.replace(cfg, federation=dataclasses.replace(cfg.federation, background_nice=steps))
    base = _nice()
    s = await open_service(cfg, require_identity=True)
    try:
        writer = await s.db.write(lambda conn: _nice())
        verifier = await asyncio.get_running_loop().run_in_executor(s.replicator.verifier.executor, _nice)
        reader = await s.db.read(lambda conn: _nice())
        lowered = min(priority.MAX_NICE, base + steps)
        assert (writer, verifier, reader, _nice()) == (lowered, lowered, base, base)
    finally:
        await s.close()
