"""Transcripts benchmark: store and replay latency for 100 KB transcripts, and zstd level-3 compression ratio
on a generated conversation corpus (no downloads: a fixed-seed generator of agent conversations).

    .venv/bin/python -m testbed.bench.transcripts_bench [--quick] [--out bench/out/transcripts.json]

Store is ``TranscriptRoom.store`` end to end (validation, compression on a worker thread, Ed25519
signature, one group-commit transaction with its signed event and 8 span links), on a real SQLite file
with ``synchronous = "full"``. Replay is ``TranscriptRoom.replay`` of a memory citing 8 spans (read,
decompress, hash check), then the same with ``full=true``. One operation at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mesh import keys
from node.assemble import open_service
from node.config import from_dict
from storage import transcripts
from testbed.bench.figures import pct

SEED = 13
AGENT = "ai:bench@lab"
TRANSCRIPT_BYTES = 100 * 1024
SPANS_PER_TRANSCRIPT = 8

_TOPICS = ("the deploy to eu-west", "the flaky integration test", "the Postgres migration", "a customer's invoice",
           "the on-call handover", "a memory leak in the indexer", "rotating the signing key", "the café's menu")
_OPENERS = ("Can you look into", "I need help with", "What do we know about", "Summarise", "Why did we change",
            "Draft a plan for", "Check the logs for", "Compare the options for")
_WORDS = ("latency", "rollback", "quorum", "replica", "schema", "budget", "timeout", "ticket", "owner", "release",
          "canary", "error", "retry", "backoff", "index", "cursor", "shard", "window", "metric", "alert", "deadline",
          "config", "namespace", "signature", "peer", "outbox", "journal", "snapshot", "checkpoint", "queue")
_TOOLS = ("memory_recall", "memory_store", "shell", "http_get", "sql")


def conversation(rnd: random.Random, size: int) -> str:
    """A conversation of about ``size`` UTF-8 bytes: user turns, assistant reasoning, tool calls with JSON
    arguments and results, timestamps and ids, some accented and CJK text and emoji, as agent trails look."""
    out: list[str] = []
    total = 0
    t = 1_700_000_000
    while total < size:
        t += rnd.randint(1, 90)
        topic = rnd.choice(_TOPICS)
        lines = [f"[{t}] user: {rnd.choice(_OPENERS)} {topic}? " + rnd.choice(("", "Merci 🙏", "急ぎです", "ok"))]
        for _ in range(rnd.randint(1, 4)):
            words = " ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(8, 30)))
            lines.append(f"[{t}] assistant (thinking): {words.capitalize()}.")
        if rnd.random() < 0.6:
            tool = rnd.choice(_TOOLS)
            args = {"query": topic, "limit": rnd.randint(1, 20), "request_id": f"{rnd.getrandbits(64):016x}"}
            lines.append(f"[{t}] tool_call {tool} {json.dumps(args)}")
            rows = [{"id": f"{rnd.getrandbits(128):032x}", "score": round(rnd.random(), 3),
                     "text": " ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(4, 12)))}
                    for _ in range(rnd.randint(1, 5))]
            lines.append(f"[{t}] tool_result {json.dumps(rows, ensure_ascii=False)}")
        lines.append(f"[{t}] assistant: " + " ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(10, 40))) + ".")
        block = "\n".join(lines) + "\n"
        out.append(block)
        total += len(block.encode("utf-8"))
    text = "".join(out)
    return text.encode("utf-8")[:size].decode("utf-8", "ignore")



def summary(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "p50": round(pct(ms, 50), 3), "p95": round(pct(ms, 95), 3),
            "p99": round(pct(ms, 99), 3), "mean": round(statistics.fmean(ms), 3)}


async def run(n: int, corpus_docs: int) -> dict[str, Any]:
    rnd = random.Random(SEED)
    corpus = [conversation(rnd, TRANSCRIPT_BYTES) for _ in range(corpus_docs)]
    raw = sum(len(c.encode("utf-8")) for c in corpus)
    packed = sum(len(transcripts.compress(c)[0]) for c in corpus)
    with tempfile.TemporaryDirectory(prefix="tx-bench-") as home:
        cfg = from_dict({"agent_id": AGENT, "home": home, "transcripts": {"enabled": True, "replay": "allow"}}, env={})
        keys.generate_identity(cfg.keys_dir, AGENT)
        svc = await open_service(cfg, require_identity=True)
        try:
            store_ms, replay_ms, full_ms = [], [], []
            cited: list[str] = []
            for i in range(n):
                text = corpus[i % len(corpus)]
                mid = (await svc.memory_store(f"memory {i}"))["id"]
                step = len(text) // SPANS_PER_TRANSCRIPT
                spans = [{"memory_id": mid, "start": k * step, "end": k * step + 200}
                         for k in range(SPANS_PER_TRANSCRIPT)]
                t0 = time.perf_counter()
                await svc.transcripts.store(text, spans=spans)
                store_ms.append((time.perf_counter() - t0) * 1000)
                cited.append(mid)
            for mid in cited:
                t0 = time.perf_counter()
                await svc.transcripts.replay(mid)
                replay_ms.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await svc.transcripts.replay(mid, full=True)
                full_ms.append((time.perf_counter() - t0) * 1000)
        finally:
            await svc.close()
    return {"transcript_bytes": TRANSCRIPT_BYTES, "spans_per_transcript": SPANS_PER_TRANSCRIPT,
            "store_ms": summary(store_ms), "replay_spans_ms": summary(replay_ms), "replay_full_ms": summary(full_ms),
            "corpus": {"documents": corpus_docs, "raw_bytes": raw, "zstd3_bytes": packed,
                       "ratio": round(raw / packed, 2)},
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="50 operations instead of 500")
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args()
    result = asyncio.run(run(50 if args.quick else 500, 20 if args.quick else 100))
    print("| operation (100 KB transcript) | n | p50 ms | p95 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for name, key in (("store (8 spans)", "store_ms"), ("replay: cited spans", "replay_spans_ms"),
                      ("replay: full=true", "replay_full_ms")):
        s = result[key]
        print(f"| {name} | {s['n']} | {s['p50']} | {s['p95']} | {s['p99']} |")
    c = result["corpus"]
    print(f"\ncompression (zstd level 3): {c['documents']} conversations, {c['raw_bytes']} -> {c['zstd3_bytes']} "
          f"bytes, ratio {c['ratio']}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
