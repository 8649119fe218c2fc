"""TermVectors' byte estimate against tracemalloc's count of what it really keeps, for several row shapes.

    .venv/bin/python -m testbed.bench.probes.term_vector_memory

Each shape fills a TermVectors of 4 MiB with windows of 500 rows' texts and prints its estimate (``bytes``),
what tracemalloc counts, and their ratio (1.0: the estimate is exact).
"""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections.abc import Callable

from storage import memories


def shape(name: str, make: Callable[[int], str], rows: int, max_bytes: int = 4 * 1024 * 1024) -> None:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = memories.TermVectors(max_bytes)
    for start in range(0, rows, 500):
        kept.of([make(j) for j in range(start, start + 500)])
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    print(f"| {name} | {len(kept)} | {kept.bytes / 2**20:.2f} | {used / 2**20:.2f} | {used / max(kept.bytes, 1):.2f} |")


def main() -> None:
    rng = random.Random(0)
    vocab = [f"w{k}" for k in range(5000)]
    print("| rows | kept | estimate MiB | tracemalloc MiB | ratio |\n|---|---:|---:|---:|---:|")
    shape("1 word", lambda j: f"{j}\x01the\x01[]", 200_000)
    shape("3 words", lambda j: f"n{j}\x01the of river\x01[]", 200_000)
    shape("~30 words, 20 distinct", lambda j: f"t{j}\x01" + " ".join(rng.choices(vocab[:20], k=30)) + "\x01[]",
          200_000)
    shape("~300 words, ~250 distinct", lambda j: f"t{j}\x01" + " ".join(rng.choices(vocab, k=300)) + "\x01[]",
          30_000)


if __name__ == "__main__":
    main()
