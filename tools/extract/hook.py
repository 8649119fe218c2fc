"""extract: a reference hook that proposes memories from a transcript, each citing the span it came from.

Wire it for ``pre_transcript_store`` (docs/transcripts.md, "Hooks"); off by default (hooks.example.toml).
It answers ``Modify {"memories": [{content, start, end, title}, ...]}``: one proposal per sentence that
states a decision, a preference, a fact to keep or a follow-up, found by rules (cue phrases at a sentence
start or after a speaker label), no model to download. ``start``/``end`` are Unicode code points of the
transcript, so the node cites exactly the sentence. The node stores each proposal as a memory in the
transcript's namespace and links it to the span.

Standalone: stdlib only, so it runs under any python3 the operator points hooks.toml at.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from typing import Any

# Cue -> the title the proposed memory gets. Matched case-insensitively at a sentence's start.
RULES: tuple[tuple[str, str], ...] = (
    (r"(?:we|i) (?:decided|agreed|chose|will go with)\b", "decision"),
    (r"decision\s*:", "decision"),
    (r"(?:remember|note)(?: that)?\s*[:,]?", "note"),
    (r"(?:i|we|the user) (?:prefer|prefers|always|never)\b", "preference"),
    (r"(?:the )?root cause (?:is|was)\b", "root cause"),
    (r"(?:the )?fix (?:is|was)\b", "fix"),
    (r"(?:todo|action item|follow[- ]up)\s*[:,]?", "follow-up"),
)
_CUE = re.compile("|".join(f"(?:{r})" for r, _ in RULES), re.IGNORECASE)
# A sentence: up to a full stop, question or exclamation mark followed by a space, or a line end ("3.2" stays).
_SENTENCE = re.compile(r"[^\n]+?(?:[.!?](?=\s)|$)", re.MULTILINE)
# "user:", "assistant (thinking):", "[1700000000] agent-7:" before the sentence itself.
_SPEAKER = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?(?:[\w .()-]{1,40}:\s+)?")


@dataclass(frozen=True)
class Proposal:
    content: str
    start: int        # code points into the transcript
    end: int
    title: str

    def to_wire(self) -> dict[str, Any]:
        return {"content": self.content, "start": self.start, "end": self.end, "title": self.title}


def propose(text: str, *, max_proposals: int = 16, min_chars: int = 12) -> list[Proposal]:
    """Sentences of ``text`` that start (after any speaker label) with a cue of ``RULES``, in text order."""
    out: list[Proposal] = []
    for m in _SENTENCE.finditer(text):
        if len(out) >= max_proposals:
            break
        lead = _SPEAKER.match(m.group())
        # The cue may open the sentence itself ("TODO: ...") or follow a speaker label ("user: TODO: ...").
        for offset in dict.fromkeys((m.start(), m.start() + (lead.end() if lead else 0))):
            body = text[offset:m.end()]
            stripped = body.strip()
            cue = _CUE.match(stripped)
            if cue is None or len(stripped) < min_chars:
                continue
            start = offset + (len(body) - len(body.lstrip()))
            out.append(Proposal(content=stripped, start=start, end=start + len(stripped), title=_title(cue.group())))
            break
    return out


def _title(cue: str) -> str:
    return next(title for rule, title in RULES if re.fullmatch(rule, cue, re.IGNORECASE))


def decide(event: str, payload: dict[str, Any], *, max_proposals: int) -> dict[str, Any]:
    """The decision for one fire (a dict as printed on the wire)."""
    if event == "pre_transcript_store":
        found = propose(payload["content"], max_proposals=max_proposals)
        if found:
            return {"decision": "modify", "delta": {"memories": [p.to_wire() for p in found]}}
    return {"decision": "allow"}


def serve(stdin: Any, stdout: Any, *, max_proposals: int) -> None:
    """JSON-RPC 2.0 over NDJSON until EOF or ``shutdown``; a request it cannot use is answered allow."""
    for line in stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("method") == "shutdown":
            return
        if "id" not in msg:
            continue
        try:
            params = msg["params"]
            result = decide(params["event"], params["payload"], max_proposals=max_proposals)
        except (KeyError, TypeError) as e:
            print(f"extract: cannot use request {msg.get('id')}: {e!r}", file=sys.stderr)
            result = {"decision": "allow"}
        stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
        stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-proposals", type=int, default=16, help="most memories proposed per transcript (<= 32)")
    args = p.parse_args(argv)
    serve(sys.stdin, sys.stdout, max_proposals=min(args.max_proposals, 32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
