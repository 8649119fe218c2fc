"""Splits each ping of a federation bench run into its legs (see sitecustomize.py here for how to record one):

- pinger: from the pinger's clock read to ``send_wire`` returning (the frame written to its socket), or to B
  taking the frame when B, on the same CPU, ran first;
- to B: from then until B's ``_Socket.on_frame`` takes the frame (B's loop reading and parsing it);
- B: inside ``on_frame`` (decode, checks, the ACK made);
- back: from then until the pinger has the ACK (B writing it, the pinger reading it).

    python3 -m testbed.bench.probes.ping_path.split DIR [--pings FILE]

DIR holds B's frames-<pid>.bin; FILE (default DIR/pings.json) is what ``--keep-pings`` wrote. Prints p50 / p95 /
p99 of each leg for each phase (idle, the single-link flood, the batched flood), and of the batched flood by
second. A ping is matched to the frame B took with the same crc32 (each ping's bytes differ: its correlation id);
a ping B's record has no frame for (or one taken outside the ping's round trip) is counted apart.
"""

from __future__ import annotations

import argparse
import array
import json
from pathlib import Path
from typing import Any

LEGS = ("round trip", "pinger", "to B", "B", "back")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def frames_by_crc(times: array.array[int]) -> dict[int, tuple[int, int]]:
    """B's record (taken ns, answered ns, crc32 triples) as crc32 -> (taken, answered); the first frame of a crc."""
    out: dict[int, tuple[int, int]] = {}
    for i in range(0, len(times) - 2, 3):
        out.setdefault(times[i + 2], (times[i], times[i + 1]))
    return out


def legs(samples: list[list[int]], frames: dict[int, tuple[int, int]]) -> tuple[list[tuple[int, list[float]]], int]:
    """(sent ns, [round trip, pinger, to B, B, back] in ms) of every answered ping found on B, and how many answered
    pings were not (no frame with their crc, or one taken outside their round trip)."""
    out = []
    missing = 0
    for sent, rtt, written, crc in samples:
        if rtt < 0:
            continue
        acked = sent + rtt
        taken, answered = frames.get(crc, (0, 0))
        if not sent <= taken <= answered <= acked:
            missing += 1
            continue
        written = min(written, taken)  # B, on the same CPU, may take the frame before the pinger reads its clock
        parts = (rtt, written - sent, taken - written, answered - taken, acked - answered)
        out.append((sent, [x / 1e6 for x in parts]))
    return out, missing


def table(title: str, rows: dict[str, list[list[float]]]) -> str:
    lines = [f"| {title} | pings | " + " | ".join(f"{leg} p50 / p95 / p99 (ms)" for leg in LEGS) + " |",
             "|---|---:|" + "---|" * len(LEGS)]
    for name, values in rows.items():
        if values:
            cells = [" / ".join(f"{pct([v[j] for v in values], q):.2f}" for q in (0.5, 0.95, 0.99))
                     for j in range(len(LEGS))]
            lines.append(f"| {name} | {len(values)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load(directory: Path, pings: Path | None) -> tuple[dict[str, Any], int, dict[int, tuple[int, int]]]:
    """What ``--keep-pings`` wrote (``pings``, default DIR/pings.json), B's pid and B's frames by crc32."""
    kept = json.loads((pings or directory / "pings.json").read_text())
    files = sorted(directory.glob("frames-*.bin"))
    if len(files) != 1:
        raise SystemExit(f"expected one frames-<pid>.bin in {directory}, found {len(files)}")
    times = array.array("q")
    times.frombytes(files[0].read_bytes())
    return kept, int(files[0].stem.split("-")[1]), frames_by_crc(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--pings", type=Path, default=None)
    args = p.parse_args()
    kept, _, frames = load(args.dir, args.pings)
    matched, missing = legs(kept["samples"], frames)
    if missing:
        print(f"({missing} answered pings have no frame in B's record and are left out)")
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
