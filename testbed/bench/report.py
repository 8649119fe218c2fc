"""bench.md, the fan-out bench's report as a person reads it in a terminal: a few header lines, a short main table
(latency, the ratios to the floor and NATS, the verdicts with how many rounds agree) and a details table with one
line per side (percentiles, throughput, CPU). Every table line fits 100 columns."""

from __future__ import annotations

from typing import Any

# The widest table line bench.md may hold (a terminal of 100 columns shows it unwrapped).
MAX_WIDTH = 100
MAIN_HEADER = "| nodes | msgs | ours p50/p95 ms | p95 ÷ floor | p95 ÷ NATS (rounds) | budget | ≤ budget | ≤ NATS |"
DETAILS_HEADER = "| nodes | side | p50 | p95 | p99 | max | msg/s | receiver CPU/msg | sender CPU/msg |"


def _verdict(rounds: dict[str, Any] | None, key: str, pooled: bool | None) -> str:
    """"yes 5/5" / "no 0/5" / "mixed 3/5" (rounds that hold it / rounds); the pooled verdict alone without rounds."""
    if pooled is None:
        return "-"
    if rounds is not None and key in rounds:
        words = str(rounds[key]["words"])
        return words if not words.startswith("no") else f"**{words}**"
    return "yes" if pooled else "**no**"


def _spread(rounds: dict[str, Any] | None, key: str) -> str:
    if rounds is None or key not in rounds or rounds["count"] < 2:
        return ""
    ratios = rounds[key]["p95_ratios"]
    return f" ({min(ratios):.2f}–{max(ratios):.2f})"


def _main_row(r: dict[str, Any]) -> str:
    o, n, rounds = r["ours"], r.get("nats"), r.get("rounds")
    budget = "-" if r["budget_p95_ms"] is None else f"≤ {r['budget_p95_ms']:g} ms"
    vs_nats = "-" if not n else f"{r['ratio_p95_nats']:.2f}×{_spread(rounds, 'nats')}"
    return (f"| {r['nodes']} | {r['messages']} | {o['p50_ms']:.2f} / {o['p95_ms']:.2f} | {r['ratio_p95']:.1f}× "
            f"| {vs_nats} | {budget} | {_verdict(rounds, 'budget', r['within_budget'])} "
            f"| {_verdict(rounds, 'nats', r['p95_le_nats'] if n else None)} |")


def _details_rows(r: dict[str, Any]) -> list[str]:
    out = []
    for name, key in (("ours", "ours"), ("floor", "floor"), ("NATS", "nats")):
        x = r.get(key)
        if not x:
            continue
        out.append(f"| {r['nodes']} | {name} | {x['p50_ms']:.2f} | {x['p95_ms']:.2f} | {x['p99_ms']:.2f} "
                   f"| {x['max_ms']:.2f} | {x['throughput_msg_s']:.0f} | {x['cpu_ms_per_msg_per_receiver']:.3f} "
                   f"| {x['cpu_ms_per_msg_sender']:.3f} |")
    return out


def _rounds_note(results: list[dict[str, Any]]) -> list[str]:
    counts = sorted({r["rounds"]["count"] for r in results if r.get("rounds")})
    if not counts:
        return ["", "Verdicts are over all messages of one run: compare runs before trusting one near its line."]
    sizes = sorted({m for r in results if r.get("rounds") for m in r["rounds"]["messages"]})
    per = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return ["", f"Noise: ours, the floor and NATS took turns, {'/'.join(map(str, counts))} rounds of {per} messages "
                "each. A ratio is over all messages, in brackets its lowest and highest round; after a verdict, "
                "the rounds that hold it: \"yes\" or \"no\" when all agree, \"mixed\" when they do not, i.e. "
                "within this machine's noise at this size (rerun with more --messages before reading anything "
                "into it)."]


def markdown(report: dict[str, Any]) -> str:
    """bench.md: header lines, the main table, how noisy its verdicts are, the details table."""
    nats = report.get("nats") or {"available": False, "omitted_reason": "not measured"}
    backend = report.get("backend") or {"runs": "local backend"}
    results = report["results"]
    lines = [
        f"Command: `{report['command']}`  ",
        f"Host: {report['host']['cpus']} CPUs, Python {report['host']['python']}, {report['generated_at']}; "
        f"frame {results[0]['frame_bytes']} B ({report['payload']}).  ",
        f"Backend: {backend['runs']}" + (f" (image {backend['image']})" if backend.get("image") else "") + ".  ",
        f"Mode: {report.get('mode', 'default')}.  ",
        (f"NATS peer ({nats['version']}): {nats['shape']}." if nats["available"]
         else f"NATS peer omitted: {nats['omitted_reason']}."),
        "",
        MAIN_HEADER,
        "|---:|---:|---|---:|---|---:|:-:|:-:|",
        *(_main_row(r) for r in results),
        *_rounds_note(results),
        "",
        "Details (latency ms; CPU ms per message, the receivers' averaged):",
        "",
        DETAILS_HEADER,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *(line for r in results for line in _details_rows(r)),
    ]
    servers = [f"{r['nodes']} nodes {r['nats']['cpu_ms_per_msg_server']:.3f}" for r in results if r.get("nats")]
    if servers:
        lines += ["", f"nats-server CPU ms/msg: {', '.join(servers)}."]
    return "\n".join(lines) + "\n"
