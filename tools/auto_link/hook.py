"""auto_link: a reference daemon hook that links a new memory to similar ones in its namespace.

Wire it for ``pre_store`` and ``post_store`` (docs/hooks.md, "auto_link"):

- ``post_store``: index the committed memory (only committed memories are ever proposed);
- ``pre_store``: answer ``Modify {"links": [{dst_id, relation, confidence}, ...]}`` with the indexed
  memories of the same namespace whose similarity is at least ``--threshold``; the node writes those
  links, signed, in the new memory's own transaction.

Similarity: cosine over hashed, TF-IDF-weighted unigrams and bigrams (pure Python, no model to download).
``--db PATH`` seeds the index from the node's SQLite file, opened read-only.

Standalone: stdlib only, so it runs under any python3 the operator points hooks.toml at.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sqlite3
import sys
import zlib
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any

WORD = re.compile(r"[^\W_]+")
STOPWORDS = frozenset("""a an and are as at be by for from has have in is it its of on or that the this to was
were will with we you they he she not but if then so than into over about""".split())
BUCKETS = 1 << 18
MAX_TOKENS = 2_000


def features(text: str) -> Counter[int]:
    """Hashed unigram and bigram counts of ``text`` (lowercased words, stopwords dropped)."""
    words = [w for w in WORD.findall(text.lower())[:MAX_TOKENS] if len(w) > 1 and w not in STOPWORDS]
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
    return Counter(zlib.crc32(g.encode()) % BUCKETS for g in grams)


@dataclass
class NamespaceIndex:
    """Inverted index of one namespace: term -> {memory id: tf}; oldest memories leave past ``max_docs``."""

    max_docs: int
    postings: dict[int, dict[str, int]] = field(default_factory=dict)
    docs: OrderedDict[str, tuple[Counter[int], float]] = field(default_factory=OrderedDict)

    def idf(self, term: int) -> float:
        return math.log((1 + len(self.docs)) / (1 + len(self.postings.get(term, ())))) + 1.0

    def _norm(self, tf: Counter[int]) -> float:
        return math.sqrt(sum(((1 + math.log(c)) * self.idf(t)) ** 2 for t, c in tf.items())) or 1.0

    def add(self, memory_id: str, text: str) -> None:
        self.remove(memory_id)
        tf = features(text)
        for t, c in tf.items():
            self.postings.setdefault(t, {})[memory_id] = c
        # The norm is taken with the IDF of the moment: an approximation that keeps each query O(postings).
        self.docs[memory_id] = (tf, self._norm(tf))
        while len(self.docs) > self.max_docs:
            self.remove(next(iter(self.docs)))

    def remove(self, memory_id: str) -> None:
        old = self.docs.pop(memory_id, None)
        if old is None:
            return
        for t in old[0]:
            bucket = self.postings.get(t)
            if bucket is not None:
                bucket.pop(memory_id, None)
                if not bucket:
                    del self.postings[t]

    def similar(self, text: str, *, top_k: int, threshold: float, exclude: str = "") -> list[tuple[str, float]]:
        """Up to ``top_k`` (memory id, cosine) pairs at or above ``threshold``, best first."""
        tf = features(text)
        if not tf or not self.docs:
            return []
        dots: defaultdict[str, float] = defaultdict(float)
        for t, c in tf.items():
            bucket = self.postings.get(t)
            if not bucket:
                continue
            w = (1 + math.log(c)) * self.idf(t)
            for doc, dc in bucket.items():
                dots[doc] += w * (1 + math.log(dc)) * self.idf(t)
        qnorm = self._norm(tf)
        scored = [(doc, dot / (qnorm * self.docs[doc][1])) for doc, dot in dots.items() if doc != exclude]
        scored.sort(key=lambda x: -x[1])
        return [(doc, round(min(score, 1.0), 4)) for doc, score in scored[:top_k] if score >= threshold]


@dataclass
class AutoLinker:
    threshold: float = 0.35
    top_k: int = 3
    relation: str = "related_to"
    max_docs: int = 50_000
    spaces: dict[str, NamespaceIndex] = field(default_factory=dict)

    def index(self, namespace: str) -> NamespaceIndex:
        return self.spaces.setdefault(namespace, NamespaceIndex(self.max_docs))

    def decide(self, event: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The decision for one fire (a dict as printed on the wire)."""
        if event == "pre_store":
            text = f"{payload.get('title', '')}\n{payload['content']}"
            hits = self.index(payload["namespace"]).similar(text, top_k=self.top_k, threshold=self.threshold,
                                                            exclude=payload["id"])
            if hits:
                return {"decision": "modify", "delta": {"links": [
                    {"dst_id": doc, "relation": self.relation, "confidence": score} for doc, score in hits]}}
        elif event in ("post_store", "post_update"):
            m = payload["memory"]
            self.index(m["namespace"]).add(m["id"], f"{m.get('title', '')}\n{m['content']}")
        return {"decision": "allow"}

    def seed(self, db_path: str) -> int:
        """Index the node's stored memories, newest ``max_docs``, from its SQLite file opened read-only."""
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT id, namespace, title, content FROM memories ORDER BY created_at DESC "
                                "LIMIT ?", (self.max_docs,)).fetchall()
        finally:
            conn.close()
        for memory_id, namespace, title, content in reversed(rows):
            self.index(namespace).add(memory_id, f"{title}\n{content}")
        return len(rows)


def serve(linker: AutoLinker, stdin: Any, stdout: Any) -> None:
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
            result = linker.decide(params["event"], params["payload"])
        except (KeyError, TypeError) as e:
            print(f"auto_link: cannot use request {msg.get('id')}: {e!r}", file=sys.stderr)
            result = {"decision": "allow"}
        stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
        stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threshold", type=float, default=0.35, help="least cosine similarity to propose (0..1)")
    p.add_argument("--top-k", type=int, default=3, help="most links proposed per new memory")
    p.add_argument("--relation", default="related_to")
    p.add_argument("--max-docs", type=int, default=50_000, help="memories indexed per namespace")
    p.add_argument("--db", help="the node's SQLite file, to index what is already stored (read-only)")
    args = p.parse_args(argv)
    linker = AutoLinker(threshold=args.threshold, top_k=args.top_k, relation=args.relation, max_docs=args.max_docs)
    if args.db:
        print(f"auto_link: indexed {linker.seed(args.db)} stored memories", file=sys.stderr)
    serve(linker, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
