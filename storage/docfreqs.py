"""How many memories hold each query word (DocFreqs), cached: what recall needs to leave a word in half the rows
out of the ranking and to give the others their idf without FTS5's idf pass (storage/memories.py, recall)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

# How long a word's 'in at least half the memories' answer is reused (DocFreqs), and how many are kept.
DF_TTL_S = 60.0
DF_MAX_TERMS = 50_000
# Past DF_TTL_S a count of k rows is reused while the row count is within k * DF_DRIFT of the one it was measured
# at (its idf moves by ~DF_DRIFT at most): recounting a word in 300k of 1M rows (~10 ms) is then paid once per
# ~10k rows written, not once a minute (PERFORMANCE.md, "A node at a million memories").
DF_DRIFT = 1 / 32
# Rows a Postgres store's mean row length is measured on (DocFreqs.avgdl): within ~1% at 100k rows, a few ms.
AVGDL_SAMPLE_ROWS = 5_000


def common_flags(n: int, counts: list[int]) -> list[bool]:
    """For each word counted in ``counts`` (DocFreqs.counts, of ``n`` rows): is it in at least half the rows?"""
    return [n > 0 and 2 * k >= n for k in counts]


class DocFreqs:
    """How many memories hold each query word, counted up to half the rows (bm25's idf of a word in at least
    half of them is clamped to ~0, so such a word is only 'common').

    Counting a word's rows walks its posting list, the very cost that leaving a common word out of the ranking
    saves, so each count is cached for DF_TTL_S seconds (at most DF_MAX_TERMS words), with the row count it was
    measured against. A stale count costs little: a word near the half-way line has an idf near 0 either way,
    and recall uses the others only to guess how many rows a query matches (which way to walk them). Thread-
    safe: a database's readers share one.
    """

    def __init__(self, *, ttl_s: float = DF_TTL_S, max_terms: int = DF_MAX_TERMS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._max_terms = max_terms
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: tuple[int, float] | None = None      # (row count, measured at)
        self._avgdl: tuple[float, float] | None = None   # (mean row length in tokens, measured at): Postgres
        self._elems: tuple[dict[str, float], float] | None = None  # (pg_stats' lexeme shares, read at): Postgres
        # word (casefolded literal) -> (rows holding it, measured at, the table's row count then)
        self._counts: dict[str, tuple[int, float, int]] = {}

    def common(self, conn: sqlite3.Connection, tokens: list[str]) -> list[bool]:
        """For each FTS5 literal of ``tokens``: is it in at least half the rows?"""
        return common_flags(*self.counts(conn, tokens))

    def counts(self, conn: sqlite3.Connection, tokens: list[str],
               rows: int | None = None) -> tuple[int, list[int]]:
        """The table's row count and, for each FTS5 literal of ``tokens``, how many rows hold it, counted up to
        half the row count (a word counted at the half is in at least half the rows). ``rows``: the row count now
        (SQLite: FTS5's averages record, O(1)); None counts the table at most every DF_TTL_S. A word's count is
        reused for DF_TTL_S, and past it while the row count is within count * DF_DRIFT of its own."""
        now = self._clock()
        with self._lock:
            known = self._rows if self._rows and now - self._rows[1] < self._ttl_s else None
            cached = {t: self._counts.get(t.casefold()) for t in tokens}
        n = rows if rows is not None else known[0] if known else int(
            conn.execute("SELECT count(*) FROM memories").fetchone()[0])
        out, fresh = [], {}
        for t in tokens:
            hit = cached[t] if rows is not None or known else None
            if hit is None or (now - hit[1] >= self._ttl_s and abs(n - hit[2]) > hit[0] * DF_DRIFT):
                hit = (self._count(conn, t, n, now), now, n)
                fresh[t.casefold()] = hit
            out.append(hit[0])
        with self._lock:
            if rows is None and known is None:
                self._rows = (n, now)
            for key, val in fresh.items():
                if len(self._counts) >= self._max_terms:
                    self._counts.pop(next(iter(self._counts)))
                self._counts[key] = val
        return n, out


    def _count(self, conn: Any, token: str, n: int, now: float) -> int:
        """The rows holding ``token``, up to half of ``n``. Counting stops at half the rows: on SQLite a common
        word costs half its posting list, once. On Postgres, where counting visits every matching row, a word
        the planner's statistics track (pg_stats' most common elements of the tsvector, from ANALYZE's sample)
        is taken from them; only the others, the rarer words, are counted."""
        if getattr(conn, "dialect", "sqlite") != "postgres":
            return int(conn.execute(DF_COUNT["sqlite"], (token, (n + 1) // 2)).fetchone()[0])
        share = self._elem_freqs(conn, now).get(token[1:-1].replace('""', '"').lower())
        if share is not None:
            return min(round(share * n), (n + 1) // 2)
        return int(conn.execute(DF_COUNT["postgres"], (pg_word(token), (n + 1) // 2)).fetchone()[0])

    def _elem_freqs(self, conn: Any, now: float) -> dict[str, float]:
        """The tsvector's most common lexemes and the share of rows holding each (pg_stats), kept DF_TTL_S."""
        with self._lock:
            if self._elems is not None and now - self._elems[1] < self._ttl_s:
                return self._elems[0]
        r = conn.execute("SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats "
                         "WHERE schemaname = current_schema() AND tablename = 'memories' AND attname = 'fts'"
                         ).fetchone()
        # The freqs hold three more entries than the elements (their min, max and the nulls' share).
        freqs = dict(zip(r[0], map(float, r[1]), strict=False)) if r and r[0] is not None else {}
        with self._lock:
            self._elems = (freqs, now)
        return freqs

    def avgdl(self, conn: Any) -> float:
        """A Postgres store's mean row length in tokens (what FTS5's averages record holds on SQLite), from a
        sample of about AVGDL_SAMPLE_ROWS rows, kept for DF_TTL_S seconds."""
        now = self._clock()
        with self._lock:
            if self._avgdl is not None and now - self._avgdl[1] < self._ttl_s:
                return self._avgdl[0]
        rows = max(1, int(conn.execute("SELECT greatest(reltuples, 1) FROM pg_class "
                                       "WHERE oid = 'memories'::regclass").fetchone()[0]))
        share = min(100.0, 100.0 * AVGDL_SAMPLE_ROWS / rows)
        # A row's tokens are its tsvector's positions (the 'simple' configuration keeps every word).
        sample = "" if share >= 100.0 else f" TABLESAMPLE SYSTEM ({share:.6f}) REPEATABLE (0)"
        r = conn.execute("SELECT avg((SELECT sum(array_length(positions, 1)) FROM unnest(fts))) "
                         f"FROM memories{sample}").fetchone()
        if r[0] is None and sample:
            r = conn.execute("SELECT avg((SELECT sum(array_length(positions, 1)) FROM unnest(fts))) "
                             "FROM memories").fetchone()
        avgdl = float(r[0] or 0.0)
        with self._lock:
            self._avgdl = (avgdl, now)
        return avgdl


def pg_word(token: str) -> str:
    """An FTS5 literal of fts_tokens as a tsquery lexeme (words are letters and digits: only the quotes)."""
    return "'" + token[1:-1].replace('""', '"').replace("'", "''") + "'"


# A word's rows, counted up to a bound (DocFreqs.counts), per engine.
DF_COUNT = {"sqlite": "SELECT count(*) FROM (SELECT 1 FROM memories_fts WHERE memories_fts MATCH ? LIMIT ?)",
             "postgres": "SELECT count(*) FROM (SELECT 1 FROM memories WHERE fts @@ to_tsquery('simple', ?) "
                         "LIMIT ?) AS k"}
