"""Reports on the node: ``doctor`` (what it runs on, the store's integrity, its audit chain, its hooks), ``peers``
and ``status``.

Each asks the running node first, over its local socket (``node.mcp.socket.ask_node``), and when none answers
reads the store itself, saying so: the same functions the node answers with (``node.mcp.capabilities``,
``node.mcp.peers``), with no runtime. ``doctor --hooks`` shows hooks per event, daemon state and counters:
live from the node's ``memory_capabilities``, else from the hooks file alone, validated, with no counters
(nothing has fired in this process).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_CHECK, EXIT_OK, check_home, emit, run_async
from node.config import NodeConfig
from storage.errors import StorageError

if TYPE_CHECKING:
    from node.cli.common import Commands
    from node.service import Service

COUNT_COLUMNS = ("fired", "allowed", "modified", "denied", "asked", "timeout", "crashed", "malformed", "unavailable")


def add_parsers(sub: Commands) -> None:
    """doctor, peers, status."""
    dr = sub.add_parser("doctor", help="what this node runs on (storage backend, schema, kg backend, key, audit "
                                       "chain), SQLite's integrity check of the store, and its hooks; exit 3 when a "
                                       "check fails")
    dr.add_argument("--hooks", action="store_true",
                    help="only the hooks: per event in chain order, daemon state, fire/deny/timeout/crash counts")
    dr.add_argument("--json", action="store_true")
    dr.set_defaults(handler=_doctor)

    pe = sub.add_parser("peers", help="peers: key fingerprint, link state, last ACK, outbox, dead letters, sync "
                                      "(live from the running node; from the store when none runs)")
    pe.add_argument("--json", action="store_true")
    pe.set_defaults(handler=_peers)
    st = sub.add_parser("status", help="the node's live state: identity, links, outbox, dead letters, hooks "
                                       "(from the running node; from the store when none runs, then exit 3)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=_status)


# ---- live from the node, else from the store ------------------------------------------------

def _live_or_store(cfg: NodeConfig, tool: str, from_store: Callable[[Service], Awaitable[Any]]) -> tuple[str, Any]:
    """("node", the running node's answer to ``tool``) or, when no node answers on its socket,
    ("store", from_store(svc)) with a note on stderr."""
    from node.mcp.socket import ask_node

    async def go() -> tuple[str, Any]:
        live = await ask_node(cfg, tool)
        if live is not None:
            return "node", live
        check_home(cfg)
        from node.assemble import open_service
        svc = await open_service(cfg)
        try:
            return "store", await from_store(svc)
        finally:
            await svc.close()

    source, answer = run_async(go())
    if source == "store":
        print(f"ai-memory: no node answers on {cfg.socket_path}; read from the store (link state not known)",
              file=sys.stderr)
    return source, answer


def _peers(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.mcp.peers import peers
    from node.mcp.registry import PEERS

    _, rows = _live_or_store(cfg, PEERS, lambda svc: peers(svc, None))

    def human(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return "no peers configured or trusted"
        lines = [f"{'agent_id':<28} {'fingerprint':<16} {'link':<13} {'last_ack':>9} {'outbox':>6} "
                 f"{'dead':>5} {'sync_seq':>8} {'unknown_key':>11} {'parked':>6}"]
        for r in rows:
            age = "-" if r["last_ack_age_s"] is None else f"{r['last_ack_age_s']:.0f}s"
            lines.append(f"{r['agent_id']:<28} {r['fingerprint'] or 'untrusted':<16} {r['link_state']:<13} "
                         f"{age:>9} {r['outbox_depth']:>6} {r['dead_letters']:>5} {r['last_sync_seq']:>8} "
                         f"{r.get('parked_unknown_key', 0):>11} {r['parked']:>6}")
        return "\n".join(lines)

    emit(args, rows, human)
    return EXIT_OK


def _status(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.mcp.capabilities import capabilities
    from node.mcp.registry import CAPABILITIES

    source, caps = _live_or_store(cfg, CAPABILITIES, lambda svc: capabilities(svc, None))
    emit(args, {"source": source, **caps}, _status_lines)
    # A probe, as pg_isready is: the report is printed either way, but no node running is a check that failed.
    return EXIT_OK if source == "node" else EXIT_CHECK


def _status_lines(d: dict[str, Any]) -> str:
    where = "running" if d["source"] == "node" else "NOT RUNNING (read from the store)"
    lines = [f"node {d['agent_id'] or '(no identity)'}  {where}",
             f"  key          {d['key_fingerprint'] or 'none (writes are unsigned)'}",
             f"  memories     {d['memories']}   links {sum(d['links_by_attest_level'].values())}   "
             f"change_log_seq {d['change_log_seq']}",
             f"  outbox       {d['outbox_depth']}   dead letters {d['dead_letters']}   sync parked {d['sync_parked']}"
             + (f" ({d['sync_parked_unknown_key']} unknown_key: import the signers' key history)"
                if d.get("sync_parked_unknown_key") else "")]
    restore = d.get("sync", {}).get("restore")
    if restore:
        pct = "-" if restore.get("percent") is None else f"{restore['percent']:g}%"
        peers = restore.get("peers", {})
        lines.append(f"  restore      {restore['state']}   items {restore.get('items') or 0}   {pct} of the peers' "
                     f"logs   peers read to the end {sum(1 for p in peers.values() if p['done'])} of {len(peers)}")
    lines += _catch_up_lines(d.get("sync", {}).get("catch_up") or {})
    for t in d.get("transports", []):
        lines.append(f"  transport    {t}")
    for p in d["peers"]:
        age = "-" if p["last_ack_age_s"] is None else f"{p['last_ack_age_s']:.0f}s ago"
        lines.append(f"  peer         {p['agent_id']:<28} {p['link_state']:<13} last ACK {age}")
    for a in d.get("agents", {}).get("agents", []):
        calls = sum(a["calls"].values())
        lines.append(f"  agent        {a['agent_id']:<28} {a['state']:<8} memories {a['memories']}   bytes "
                     f"{a['bytes']}/{a['quota_bytes'] or 'no quota'}   calls {calls} ({a['calls'].get('ok', 0)} ok)")
    hooks = d.get("hooks", {}).get("hooks", [])
    lines.append(f"  hooks        {len(hooks)} ({', '.join(h['name'] for h in hooks) or 'none'})")
    return "\n".join(lines)


def _catch_up_lines(peers: dict[str, dict[str, Any]]) -> list[str]:
    """One line per peer pulled from: items pulled, its head vs our cursor, the percentage."""
    lines = []
    for peer, c in peers.items():
        pct = "-" if c.get("percent") is None else f"{c['percent']:g}%"
        head = "?" if c.get("head") is None else c["head"]
        lines.append(f"  sync         {peer:<28} {pct:>6}   pulled {c.get('pulled', 0)}   cursor {c.get('cursor')} "
                     f"of head {head}   lag {c.get('lag_seqs') if c.get('lag_seqs') is not None else '-'} seqs")
    return lines


# ---- doctor ---------------------------------------------------------------------------------

def _doctor(args: argparse.Namespace, cfg: NodeConfig) -> int:
    report = run_async(hooks_report(cfg))
    hooks_ok = not report.get("reload_error")
    if args.hooks:
        emit(args, {"hooks": report}, lambda d: render_hooks(d["hooks"]))
        return EXIT_OK if hooks_ok else EXIT_CHECK
    check_home(cfg)
    # The file first, read-only, before anything opens it for writing: damage can stop the service from opening.
    integrity = _integrity(cfg)
    r: dict[str, Any] = {"storage_backend": cfg.storage.backend}
    try:
        r.update(run_async(_service_facts(cfg)))
    except StorageError as e:
        if integrity is None or integrity["ok"]:
            raise
        r["service"] = f"not opened: [{e.code}] {e.message}"
    r.update(storage_integrity=integrity, hooks=report)
    emit(args, r, _doctor_lines)
    sound = integrity is None or bool(integrity["ok"])
    return EXIT_OK if sound and r.get("audit_chain_ok") and hooks_ok else EXIT_CHECK


def _integrity(cfg: NodeConfig) -> dict[str, Any] | None:
    """SQLite's integrity_check of the store, by damaged table (None on Postgres; ok when there is no file yet)."""
    import sqlite3

    from storage.errors import translate
    from storage.integrity import FileCheck

    if cfg.storage.backend != "sqlite":
        return None
    if not cfg.db_path.exists():
        return {"ok": True, "path": str(cfg.db_path), "check": "none: no database yet", "seconds": 0.0,
                "damaged": [], "messages": []}
    try:
        return FileCheck(cfg.db_path, full=True).run().as_dict()
    except sqlite3.Error as e:  # the check could not run at all (the file unreadable): one error line
        raise translate(e, f"checking {cfg.db_path}") from e


async def _service_facts(cfg: NodeConfig) -> dict[str, Any]:
    from node.assemble import open_service

    svc = await open_service(cfg)
    try:
        chain = await svc.audit_verify()
        return {"schema_version": svc.db.schema_version, "kg_backend": svc.kg.backend, "agent_id": svc.agent_id,
                "signing": svc.identity is not None, "audit_chain_ok": chain["ok"]}
    finally:
        await svc.close()


def _doctor_lines(r: dict[str, Any]) -> str:
    lines = [f"{k}: {v}" for k, v in r.items() if k not in ("hooks", "storage_integrity")]
    lines.extend(_integrity_lines(r["storage_integrity"]))
    lines.append(render_hooks(r["hooks"]))
    return "\n".join(lines)


def _integrity_lines(found: dict[str, Any] | None) -> list[str]:
    from storage.integrity import RECOVERY

    if found is None:
        return ["storage_integrity: not checked here (Postgres checks its own pages: amcheck)"]
    if found["ok"]:
        return [f"storage_integrity: ok ({found['check']}, {found['seconds']:.2f} s)"]
    return [f"storage_integrity: DAMAGED {found['path']}: " + ", ".join(d["what"] for d in found["damaged"]),
            *(f"  sqlite: {m}" for m in found["messages"][:3]), f"  what to do: {RECOVERY}"]


async def hooks_report(cfg: NodeConfig) -> dict[str, Any]:
    """The hooks as the running node reports them ("source": "node"), else from the hooks file ("file")."""
    from node.hooks.pipeline import HookPipeline
    from node.mcp.registry import CAPABILITIES
    from node.mcp.socket import ask_node

    caps = await ask_node(cfg, CAPABILITIES)
    if caps is None:
        pipeline = HookPipeline.open(cfg)  # raises HookError (config_invalid ...) on a bad file
        try:
            return {"source": "file", **pipeline.snapshot()}
        finally:
            await pipeline.close()
    assert isinstance(caps, dict)
    return {"source": "node", **caps["hooks"]}


def render_hooks(report: dict[str, Any]) -> str:
    """``hooks_report`` as the table `ai-memory doctor --hooks` prints."""
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
