"""Splits each ping of a federation bench run into its legs (see sitecustomize.py here for how to record one):

- pinger: from the pinger's clock read to ``send_wire`` returning (the frame written to its socket);
- to B: from then until B's ``_Socket.on_frame`` takes the frame (B's loop reading and parsing it);
- B: inside ``on_frame`` (decode, checks, the ACK made);
- back: from then until the pinger has the ACK (B writing it, the pinger reading it).

    python3 bench/probes/ping_path/split.py DIR [--pings FILE]

DIR holds B's frames-<pid>.bin; FILE (default DIR/pings.json) is what ``--keep-pings`` wrote. Prints p50 / p95 /
p99 of each leg for each phase (idle, the single-link flood, the batched flood), and of the batched flood by
second. A ping is matched to the first small frame B took after the pinger wrote it, before its ACK came back.
"""

from __future__ import annotations

import argparse
import array
import bisect
import json
from pathlib import Path

LEGS = ("round trip", "pinger", "to B", "B", "back")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def legs(samples: list[list[int]], taken: list[int], answered: list[int]) -> list[tuple[int, list[float]]]:
    """(sent ns, [round trip, pinger, to B, B, back] in ms) of every answered ping matched to a frame on B."""
    out = []
    for sent, rtt, written in samples:
        if rtt < 0:
            continue
        i = bisect.bisect_left(taken, written)
        if i == len(taken) or taken[i] > sent + rtt:
            continue
        acked = sent + rtt
        out.append((sent, [x / 1e6 for x in (rtt, written - sent, taken[i] - written, answered[i] - taken[i],
                                              acked - answered[i])]))
    return out


def table(title: str, rows: dict[str, list[list[float]]]) -> str:
    lines = [f"| {title} | pings | " + " | ".join(f"{leg} p50 / p95 / p99 (ms)" for leg in LEGS) + " |",
             "|---|---:|" + "---|" * len(LEGS)]
    for name, values in rows.items():
        if values:
            cells = [" / ".join(f"{pct([v[j] for v in values], q):.2f}" for q in (0.5, 0.95, 0.99))
                     for j in range(len(LEGS))]
            lines.append(f"| {name} | {len(values)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--pings", type=Path, default=None)
    args = p.parse_args()
    kept = json.loads((args.pings or args.dir / "pings.json").read_text())
    files = sorted(args.dir.glob("frames-*.bin"))
    if len(files) != 1:
        raise SystemExit(f"expected one frames-<pid>.bin in {args.dir}, found {len(files)}")
    times = array.array("q")
    times.frombytes(files[0].read_bytes())
    matched = legs(kept["samples"], list(times[0::2]), list(times[1::2]))
    phases = {name: [v for sent, v in matched if lo <= sent < hi] for name, (lo, hi) in kept["windows"].items()}
    print(table("phase", phases))
    if "batched" in kept["windows"]:
        lo, hi = kept["windows"]["batched"]
        by_second: dict[str, list[list[float]]] = {}
        for sent, v in matched:
            if lo <= sent < hi:
                by_second.setdefault(f"batched, second {(sent - lo) // 1_000_000_000}", []).append(v)
        print()
        print(table("batched flood by second", by_second))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
