"""``ai-memory transcript``: the conversation trails behind memories (node/transcripts.py): store, replay,
lifecycle."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_OK, emit, with_service
from node.config import NodeConfig
from node.errors import ServiceError

if TYPE_CHECKING:
    from node.cli.common import Commands
    from node.service import Service


def add_parsers(sub: Commands) -> None:
    tr = sub.add_parser("transcript", help="conversation trails behind memories: store, replay, lifecycle")
    trsub = tr.add_commands(dest="sub", required=True, metavar="ACTION")
    ts = trsub.add_parser("store", help="store a transcript (zstd-compressed, signed) citing spans of it")
    ts.add_argument("file", type=Path, help="the transcript text, UTF-8 ('-' reads stdin)")
    ts.add_argument("--namespace", default="default",
                    help="namespace to store it in (its [transcripts] policy applies)")
    ts.add_argument("--span", action="append", dest="spans", default=[], metavar="MEMORY_ID:START:END",
                    help="a memory drawn from [START, END) (Unicode code points) of the text (repeatable)")
    ts.add_argument("--json", action="store_true")
    ts.set_defaults(handler=_store)
    tp = trsub.add_parser("replay", help="the transcript spans a memory was drawn from (exit 1 when not permitted)")
    tp.add_argument("memory_id", help="the memory whose transcript spans to show")
    tp.add_argument("--full", action="store_true", help="whole transcripts, where the namespace allows it")
    tp.add_argument("--json", action="store_true")
    tp.set_defaults(handler=_replay)
    tl = trsub.add_parser("lifecycle", help="archive transcripts past their TTL, delete archived ones past "
                                            "prune_after_s")
    tl.add_argument("--json", action="store_true")
    tl.set_defaults(handler=_lifecycle)


def _span_arg(text: str) -> dict[str, Any]:
    """``MEMORY_ID:START:END`` as a span; bad_input otherwise."""
    parts = text.rsplit(":", 2)
    try:
        memory_id, start, end = parts[0], int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise ServiceError("bad_input", f"--span must be MEMORY_ID:START:END, got {text!r}") from None
    return {"memory_id": memory_id, "start": start, "end": end}


def _store(args: argparse.Namespace, cfg: NodeConfig) -> int:
    spans = [_span_arg(s) for s in args.spans]
    try:
        raw = sys.stdin.buffer.read() if str(args.file) == "-" else args.file.read_bytes()
        text = raw.decode("utf-8")
    except OSError as e:
        raise ServiceError("bad_input", f"cannot read {args.file}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ServiceError("bad_input", f"{args.file} is not UTF-8 text") from None

    async def go(svc: Service) -> int:
        r = await svc.transcripts.store(text, namespace=args.namespace, spans=spans)
        emit(args, r, lambda r: f"{r['id']}  {r['raw_bytes']} bytes -> {r['stored_bytes']} stored, "
                                f"{len(r['spans'])} span(s) ({r['attest_level']})")
        return EXIT_OK
    return with_service(go, cfg)


def _replay(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        r = await svc.transcripts.replay(args.memory_id, full=args.full)

        def human(r: dict[str, Any]) -> str:
            out = []
            for t in r["transcripts"]:
                out.append(f"== {t['transcript_id']} ({t['namespace']}, {t['agent']})")
                out += [t["text"]] if r["full"] else [f"[{s['start']}:{s['end']}] {s['text']}" for s in t["spans"]]
            return "\n".join(out) or "no transcript cites this memory"

        emit(args, r, human)
        return EXIT_OK
    return with_service(go, cfg)


def _lifecycle(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc: Service) -> int:
        r = await svc.transcripts.lifecycle()
        emit(args, r, lambda r: f"archived {len(r['archived'])}, pruned {len(r['pruned'])}")
        return EXIT_OK
    return with_service(go, cfg)
