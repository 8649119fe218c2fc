"""``ai-memory doctor --hooks`` as a subprocess: from the file alone, and live from a serving node socket."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from node.mcp.backend import ServiceBackend
from node.mcp.socket import start_local_socket
from tests.hooks.scripts import hook, write_hooks_toml

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 60


def doctor(cfg: NodeConfig, *extra: str) -> tuple[int, Any, str]:
    env = {**os.environ, "AI_MEMORY_HOME": str(cfg.home), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "node.cli", "doctor", "--hooks", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    out: Any = proc.stdout
    if "--json" in extra and proc.returncode == 0:
        out = json.loads(proc.stdout)
    return proc.returncode, out, proc.stderr


async def run_doctor(cfg: NodeConfig, *extra: str) -> tuple[int, Any, str]:
    return await asyncio.to_thread(doctor, cfg, *extra)


async def test_doctor_without_a_node_shows_the_validated_file(cfg: NodeConfig, scripts) -> None:
    exe, daemon = scripts
    cfg.home.mkdir(parents=True, exist_ok=True)
    rc, out, _ = await run_doctor(cfg)
    assert rc == 0 and "no hooks registered" in out
    write_hooks_toml(cfg.hooks_path, [hook("gate", ["pre_store"], exe, "allow", priority=3),
                                      hook("dlp", ["post_recall"], daemon)])
    rc, out, _ = await run_doctor(cfg, "--json")
    assert rc == 0
    assert out["hooks"]["source"] == "file"
    assert out["hooks"]["by_event"] == {"pre_store": ["gate"], "post_recall": ["dlp"]}
    assert {h["name"]: h["runner"].get("state") for h in out["hooks"]["hooks"]} == {"gate": "idle",
                                                                                    "dlp": "not_started"}
    cfg.hooks_path.write_text("[[hooks]]\nname = 'x'\nevents = ['pre_store']\ncommand = ['x']\nmode = 'fork'\n")
    rc, _, err = await run_doctor(cfg)
    assert rc == 1 and "error [config_invalid]" in err and "hooks[0] (x).mode" in err


async def test_doctor_reports_live_counts_and_daemon_state_from_the_node(open_service, cfg: NodeConfig,
                                                                         scripts) -> None:
    exe, daemon = scripts
    svc = await open_service([hook("gate", ["pre_store"], exe, "deny", "nope"),
                              hook("dlp", ["post_recall"], daemon)])
    handle = await start_local_socket(ServiceBackend(svc), cfg.socket_path)
    try:
        await svc.memory_recall("anything")
        rc, out, _ = await run_doctor(cfg)
        assert rc == 0 and "live from the running node" in out
        assert "pre_store" in out and "post_recall" in out
        rc, out, _ = await run_doctor(cfg, "--json")
        hooks = {h["name"]: h for h in out["hooks"]["hooks"]}
        assert hooks["dlp"]["runner"]["state"] == "running"
        assert hooks["dlp"]["counts"] == {"fired": 1, "allowed": 1}
    finally:
        await handle.stop()
