"""``ai-memory doctor --hooks``: hooks per event, daemon state and counters.

Live from the running node (its ``memory_capabilities`` over the local socket) when one answers; else
from the hooks file alone, validated, with no counters (nothing has fired in this process).
"""

from __future__ import annotations

from typing import Any

from node.config import NodeConfig
from node.hooks.pipeline import HookPipeline

COUNT_COLUMNS = ("fired", "allowed", "modified", "denied", "asked", "timeout", "crashed", "malformed", "unavailable")


async def hooks_report(cfg: NodeConfig) -> dict[str, Any]:
    from node.live import ask_node

    caps = await ask_node(cfg, "memory_capabilities")
    if caps is None:
        pipeline = HookPipeline.open(cfg)  # raises HookError (config_invalid ...) on a bad file
        try:
            return {"source": "file", **pipeline.snapshot()}
        finally:
            await pipeline.close()
    assert isinstance(caps, dict)
    return {"source": "node", **caps["hooks"]}


def render(report: dict[str, Any]) -> str:
    where = ("live from the running node" if report["source"] == "node"
             else "from the file (no node running: no counters)")
    present = "" if report.get("config_present", True) else " (absent: no hooks)"
    lines = [f"hooks: {report['config']}{present}, {where}"]
    if report.get("reload_error"):
        lines.append(f"  RELOAD FAILED, still running the last good config: {report['reload_error']}")
    if not report["by_event"]:
        lines.append("  no hooks registered")
        return "\n".join(lines)
    width = max(len(e) for e in report["by_event"])
    lines.append("")
    lines.extend(f"  {event:<{width}}  {' > '.join(names)}" for event, names in report["by_event"].items())
    lines.append("")
    head = f"  {'hook':<20} {'mode':<6} {'state':<11} {'pid':>7} " + " ".join(f"{c:>9}" for c in COUNT_COLUMNS)
    lines.append(head)
    for h in report["hooks"]:
        runner = h["runner"]
        state = runner["state"] if h["enabled"] else "disabled"
        pid = runner.get("pid") or "-"
        counts = " ".join(f"{h['counts'].get(c, 0):>9}" for c in COUNT_COLUMNS)
        lines.append(f"  {h['name']:<20} {h['mode']:<6} {state:<11} {pid!s:>7} {counts}")
    return "\n".join(lines)
