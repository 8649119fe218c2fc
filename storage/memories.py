"""The memories table and its FTS5 recall. Sync functions taking ``conn`` first; times are unix ms.

Recall strategy: the user string never reaches FTS5 syntax. Word runs (letters and digits) are
extracted, de-duplicated, and each is quoted as an FTS5 string literal (``"`` doubled), so operators,
column filters, ``NEAR(``, ``*`` and stray quotes are plain text. All tokens are ANDed first (precise,
and cheap: FTS5 intersects posting lists); only if that finds nothing are they ORed, so a query with one
word the corpus lacks still finds something. Both rank by bm25 (title 2.0, content 1.0, tags 1.5)
with the LIMIT inside the FTS subquery, so only ``limit`` rows are joined to memories.

bm25 scores every matching row, so a broad query (a word in most memories) would cost O(matches):
~100 ms at 100k. When more than RANK_WINDOW rows match, only the RANK_WINDOW most recently inserted
matches are ranked (FTS5 walks matches in rowid order and stops there): recency is a fair tie-breaker
for memories, and the cost is bounded. Equal scores keep insertion order (the older memory first), as
FTS5's rank sorter left them.

What remained at 100k (docs/perf-history.md, "Recall at 100k") was FTS5's idf pass, a walk of each ranked word's
whole posting list (~25 ns a row: 2-4 ms at 100k, ~10 ms for a word in a third of 1M rows), and its rank sorter.
bm25 clamps the idf of a word in at least half the rows to 1e-6, so such a word only filters: the window is still
the rows matching every word, but only the other words are ranked (DocFreqs caches which words those are). When
every word is common, or the ranked words' rows add up to IDF_PASS_ROWS or more, the window is ranked here from
its rows' text (_rank_common, _rank_window; ASCII text only, else bm25 ranks), each word's idf from DocFreqs'
counts: bm25's scores without its idf pass. Otherwise bm25() is called in the select list and sorted by SQLite's
top-k sort (about twice as fast as the rank sorter, the same scores); the window is found and ranked in one
statement. When the words' counts suggest that no more than RANK_WINDOW rows hold them all, FTS5 walks the
matches oldest first (cheaper), stopping one row past the window; when the guess was wrong the window is walked
newest first as before (_search_all).
"""

from __future__ import annotations

import heapq
import json
import math
import re
import sqlite3
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple

from storage.docfreqs import DocFreqs as DocFreqs
from storage.docfreqs import common_flags, pg_word
from storage.errors import StorageCode, StorageError

_COLUMNS = ("id, namespace, title, content, tags, priority, confidence, source, origin, version, created_at, "
            "updated_at, writer, signature, signed_by, attest_level, share_with, received_from, signed_set")
_MARKS = ",".join("?" * len(_COLUMNS.split(",")))
_M_COLS = ", ".join(f"m.{c.strip()}" for c in _COLUMNS.split(","))
# Letters and digits only: '_' and punctuation are separators for FTS5's unicode61 tokenizer too.
_WORD = re.compile(r"[^\W_]+")
# Bounds the cost of a pasted paragraph: the first words carry the intent.
MAX_QUERY_TOKENS = 32
# bm25 scores every match, so a word found in most of 100k memories costs ~100 ms; ranking only the most
# recent RANK_WINDOW matches bounds that (see recall()).
RANK_WINDOW = 500
# Ranked words' rows (their idf pass, ~25 ns each) from which the window is ranked here (_rank_window, ~10-20 us
# a window row, a window of at most RANK_WINDOW rows) rather than by bm25().
IDF_PASS_ROWS = 200_000
# Chunks of candidate rows _rank_window reads when it checks common words itself, before it gives way to bm25.
WINDOW_READS = 64
# The rank set by migration 1 ('bm25(2.0, 1.0, 1.5)': title, content, tags), called directly.
_BM25 = "bm25(memories_fts, 2.0, 1.0, 1.5)"
# SQLite's default bound on host parameters is 32766; stay far below it.
_CHUNK = 500
# FTS5's bm25 as _BM25 calls it, for the every-word-common ranking done here (_rank_common): the constants
# k1 and b, the weights of title, content and tags, and the idf of a word in at least half the rows.
_K1, _B = 1.2, 0.75
_WEIGHTS = (2.0, 1.0, 1.5)
_CLAMPED_IDF = 1e-6
# _term_vector separates a row's cells with \x01, and makes every other byte but ASCII letters and digits
# (upper case folded to lower, as unicode61 folds ASCII) a space: what is left are the cells' tokens.
_CELL = "\x01"
_TOKEN_BYTES = bytes(b + 32 if 65 <= b <= 90 else b if 48 <= b <= 57 or 97 <= b <= 122 or b == 1 else 32
                     for b in range(256))
_K1_PLUS_1 = _K1 + 1.0
# How much memory the rows' term vectors kept for _rank_common may take (TermVectors' estimate, within ~10% of
# tracemalloc's count for rows of 1 to 300 words): an every-word-common window is the newest rows holding those
# words, so such queries read mostly the same rows again. 16 MiB holds ~3,000 rows of ~300 bytes of text
# (several windows of 500), fewer of longer ones.
TERM_VECTOR_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRow:
    id: str                     # uuid4, minted at the origin
    namespace: str
    title: str = ""
    content: str
    tags: tuple[str, ...] = ()
    priority: int = 5
    confidence: float = 1.0
    source: str = ""
    origin: str                 # agent_id of the memory's creator; the same for every version
    version: int = 1
    created_at: int             # unix ms
    updated_at: int             # unix ms
    writer: str = ""            # agent_id that wrote this version ("" = the origin)
    signature: bytes | None = None   # Ed25519 by the writer over the canonical version payload
    signed_by: str | None = None
    attest_level: str = "unsigned"
    share_with: tuple[str, ...] | None = None  # agents the origin shares the namespace with; None = all
    received_from: str | None = None            # peer this version arrived from; None = written here
    signed_set: int = 1  # the signature's field set: 1 without share_with (older versions), 2 with it (attest.py)

    def __post_init__(self) -> None:
        if not self.writer:
            object.__setattr__(self, "writer", self.origin)

    @property
    def author(self) -> str:
        """Who wrote this version."""
        return self.writer or self.origin


ApplyResult = Literal["inserted", "updated", "stale", "duplicate"]
Row = tuple[Any, ...]


def _row(r: Row) -> MemoryRow:
    return MemoryRow(id=r[0], namespace=r[1], title=r[2], content=r[3], tags=tuple(json.loads(r[4])),
                     priority=r[5], confidence=r[6], source=r[7], origin=r[8], version=r[9],
                     created_at=r[10], updated_at=r[11], writer=r[12], signature=r[13], signed_by=r[14],
                     attest_level=r[15], share_with=None if r[16] is None else tuple(json.loads(r[16])),
                     received_from=r[17], signed_set=r[18])


def _params(m: MemoryRow) -> Row:
    return (m.id, m.namespace, m.title, m.content, json.dumps(list(m.tags), ensure_ascii=False),
            m.priority, m.confidence, m.source, m.origin, m.version, m.created_at, m.updated_at,
            m.writer or m.origin, m.signature, m.signed_by, m.attest_level,
            None if m.share_with is None else json.dumps(list(m.share_with), ensure_ascii=False), m.received_from,
            m.signed_set)


def insert(conn: sqlite3.Connection, m: MemoryRow) -> None:
    """Insert a new memory; an existing id raises StorageError('duplicate_memory')."""
    try:
        conn.execute(f"INSERT INTO memories ({_COLUMNS}) VALUES ({_MARKS})", _params(m))
    except sqlite3.IntegrityError as e:
        if "memories.id" in str(e):
            raise StorageError(StorageCode.DUPLICATE_MEMORY, f"a memory with id {m.id!r} already exists") from e
        raise


def get(conn: sqlite3.Connection, id: str) -> MemoryRow | None:
    r = conn.execute(f"SELECT {_COLUMNS} FROM memories WHERE id = ?", (id,)).fetchone()
    return _row(r) if r else None


def list_(conn: sqlite3.Connection, namespace: str | None = None, limit: int = 50,
          offset: int = 0) -> list[MemoryRow]:
    """Memories newest first (by created_at, then insertion order)."""
    if namespace is None:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM memories ORDER BY created_at DESC, rowid DESC "
                            "LIMIT ? OFFSET ?", (limit, offset))
    else:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM memories WHERE namespace = ? "
                            "ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?", (namespace, limit, offset))
    return [_row(r) for r in rows]


def count(conn: sqlite3.Connection, namespace: str | None = None) -> int:
    if namespace is None:
        n = conn.execute("SELECT count(*) FROM memories").fetchone()[0]
    else:
        n = conn.execute("SELECT count(*) FROM memories WHERE namespace = ?", (namespace,)).fetchone()[0]
    return int(n)


def counts_by_attest_level(conn: sqlite3.Connection) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in conn.execute("SELECT attest_level, count(*) FROM memories GROUP BY 1")}


def get_many(conn: sqlite3.Connection, ids: Iterable[str]) -> dict[str, MemoryRow]:
    """The stored rows among ``ids``, by id."""
    return {r[0]: _row(r) for r in _rows_by_id(conn, _COLUMNS, ids)}


def _rows_by_id(conn: sqlite3.Connection, columns: str, ids: Iterable[str]) -> Iterator[Row]:
    """``columns`` (the id first) of the stored rows among ``ids``: one query per ``_CHUNK`` ids."""
    wanted = list(dict.fromkeys(ids))
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i:i + _CHUNK]
        marks = ",".join("?" * len(chunk))
        yield from conn.execute(f"SELECT {columns} FROM memories WHERE id IN ({marks})", chunk)


class Reach(NamedTuple):
    """Who may see a stored memory: its namespace and the list that travelled with it (None: every peer the
    namespace's policy names). What an inbound link's ends are checked against, read without the rest of the row."""

    namespace: str
    share_with: tuple[str, ...] | None


def reach_many(conn: sqlite3.Connection, ids: Iterable[str]) -> dict[str, Reach]:
    """The Reach of the stored rows among ``ids``, by id (``get_many`` narrowed to the two columns: an inbound
    links.put looks up ~200 ends a time, and building whole rows was most of that read)."""
    return {r[0]: Reach(r[1], None if r[2] is None else tuple(json.loads(r[2])))
            for r in _rows_by_id(conn, "id, namespace, share_with", ids)}


def next_version(old: MemoryRow, *, writer: str, updated_at: int, title: str | None = None,
                 content: str | None = None, tags: Iterable[str] | None = None, priority: int | None = None,
                 confidence: float | None = None, source: str | None = None) -> MemoryRow:
    """The version after ``old`` with the given fields changed, written by ``writer``, not yet signed.

    ``updated_at`` is raised to the old value + 1 ms when the clock is behind, so the new version's
    time never goes backwards; its version is one more, so it supersedes ``old`` everywhere.
    """
    return replace(
        old,
        title=old.title if title is None else title,
        content=old.content if content is None else content,
        tags=old.tags if tags is None else tuple(tags),
        priority=old.priority if priority is None else priority,
        confidence=old.confidence if confidence is None else confidence,
        source=old.source if source is None else source,
        writer=writer, version=old.version + 1, updated_at=max(updated_at, old.updated_at + 1),
        signature=None, signed_by=None, attest_level="unsigned", received_from=None,
    )


def overwrite(conn: sqlite3.Connection, m: MemoryRow) -> None:
    """Replace the stored version of ``m.id`` with ``m`` (the caller decided it supersedes it)."""
    p = _params(m)
    sets = ", ".join(f"{c.strip()}=?" for c in _COLUMNS.split(",")[1:])
    conn.execute(f"UPDATE memories SET {sets} WHERE id=?", p[1:] + p[:1])


def lww_key(m: MemoryRow) -> tuple[int, int, str]:
    """Last-writer-wins order of versions: version, then updated_at (unix ms), then writer."""
    return m.version, m.updated_at, m.author


def apply_remote(conn: sqlite3.Connection, m: MemoryRow) -> ApplyResult:
    """Apply a verified memory version received from a peer, last-writer-wins on ``lww_key``.

    'inserted': unknown id. 'duplicate': the same version again, a no-op. 'updated': the incoming
    version is newer and replaced the row. 'stale': the stored version is newer; nothing changed.
    Policy (who may write, namespaces, bounds) is the caller's: this only orders versions.
    """
    old = get(conn, m.id)
    if old is None:
        insert(conn, m)
        return "inserted"
    if lww_key(old) == lww_key(m):
        return "duplicate"
    if lww_key(m) > lww_key(old):
        overwrite(conn, m)
        return "updated"
    return "stale"


def fts_tokens(query: str) -> list[str]:
    """The words of ``query`` as FTS5 string literals, de-duplicated (case-insensitively), in order."""
    seen: dict[str, str] = {}
    for word in _WORD.findall(query):
        key = word.casefold()
        if key not in seen:
            seen[key] = '"' + word.replace('"', '""') + '"'
            if len(seen) >= MAX_QUERY_TOKENS:
                break
    return list(seen.values())


def recall(conn: sqlite3.Connection, query: str, limit: int = 10, namespace: str | None = None,
           doc_freqs: DocFreqs | None = None, *,
           rank_window: int = RANK_WINDOW) -> list[tuple[MemoryRow, float]]:
    """Best-matching memories for free text ``query``, best first, with a bm25 score (higher is better).

    Never raises an SQL error for any user string; a query without words returns []. When more than
    ``rank_window`` memories match, only the ``rank_window`` most recently inserted matches are ranked.
    ``doc_freqs`` (one per database, shared by its readers) caches which words are in at least half the
    memories, so that ranking can leave them out without counting them each time; without it they are
    counted for this query.
    """
    tokens = fts_tokens(query)
    if not tokens or limit <= 0:
        return []
    if getattr(conn, "dialect", "sqlite") == "postgres":
        return recall_pg(conn, tokens, limit, namespace, doc_freqs, rank_window)
    averages = _averages(conn)
    n, counts = (doc_freqs or DocFreqs()).counts(conn, tokens, rows=None if averages is None else averages[0])
    common = common_flags(n, counts)
    # bm25 clamps the idf of a word in at least half the rows to 1e-6: it only filters. Ranking by the other
    # words skips their posting-list walk; if every word is common, their (equal) idfs still order by tf.
    ranked = [t for t, c in zip(tokens, common, strict=True) if not c] or tokens
    hits = _rank_common(conn, tokens, limit, namespace, rank_window) if all(common) else None
    # How many rows hold every word, were the words independent: the common ones (counted only to half the rows)
    # are left out, so it errs high for them.
    guess = n * math.prod(k / n for k, c in zip(counts, common, strict=True) if not c) if n else 0.0
    if hits is None and averages is not None and _fts5_walk(n, counts, common, guess, rank_window) >= IDF_PASS_ROWS:
        hits = _rank_window(conn, tokens, " AND ", _idfs(averages[0], counts, common), limit, namespace,
                            rank_window, averages, common, guess <= rank_window)
    if hits is None:
        hits = _search(conn, tokens, " AND ", ranked, limit, namespace, rank_window, guess <= rank_window)
    if not hits and len(tokens) > 1:
        # OR: a row may hold only common words, so all words rank (the cost of the rarer fallback).
        hits = None
        if averages is not None and sum(counts) >= IDF_PASS_ROWS:
            hits = _rank_window(conn, tokens, " OR ", _idfs(averages[0], counts, common), limit, namespace,
                                rank_window, averages, [False] * len(tokens), sum(counts) <= rank_window)
        if hits is None:
            hits = _search(conn, tokens, " OR ", tokens, limit, namespace, rank_window, sum(counts) <= rank_window)
    return hits


def _search(conn: sqlite3.Connection, tokens: list[str], op: str, ranked: list[str], limit: int,
            namespace: str | None, rank_window: int, oldest_first: bool = False) -> list[tuple[MemoryRow, float]]:
    """The window (the ``rank_window`` most recent rows matching ``op``-joined ``tokens``, in ``namespace``)
    ranked by bm25 over ``ranked``, in one statement. Equal scores: the older memory first.

    ``oldest_first`` is a guess that at most ``rank_window`` rows match: the window is then all of them, and
    FTS5 walks a posting list oldest first at about 60% of the cost of newest first (it reads a leaf page
    forward once, rather than indexing it to step back). The walk stops at ``rank_window + 1`` rows; if it
    got that far the guess was wrong, and the window is walked newest first as without it: the same rows,
    the same scores either way."""
    if oldest_first:
        hits = _search_all(conn, tokens, op, ranked, limit, namespace, rank_window)
        if hits is not None:
            return hits
    ns_join, ns_where, ns_args = _ns_filter(namespace)
    window = (f"SELECT f.rowid{{score}} FROM memories_fts AS f {ns_join} WHERE memories_fts MATCH ? {ns_where} "
              "ORDER BY f.rowid DESC LIMIT ?")
    # bm25() in the select list with SQLite's own top-k sort: about twice as fast as FTS5's ORDER BY rank
    # sorter, with the same scores.
    if ranked == tokens:
        # Scored as the window is walked: FTS5 stops after rank_window rows, and bm25 sees only those.
        with_ = ""
        top = (f"SELECT rowid, score FROM ({window.format(score=f', {_BM25} AS score')}) "
               "ORDER BY score, rowid LIMIT ?")
        args: tuple[Any, ...] = (op.join(tokens), *ns_args, rank_window, limit)
    else:
        # The window walked unscored, its rows ranked by the other words: ``+`` keeps the window a filter,
        # not one FTS5 lookup (and idf pass) per rowid; the floor lets FTS5 skip the older matches.
        with_ = f"WITH w AS MATERIALIZED ({window.format(score='')}) "
        top = (f"SELECT f.rowid, {_BM25} AS score FROM memories_fts AS f WHERE memories_fts MATCH ? "
               "AND f.rowid >= (SELECT min(rowid) FROM w) AND +f.rowid IN w ORDER BY score, f.rowid LIMIT ?")
        args = (op.join(tokens), *ns_args, rank_window, op.join(ranked), limit)
    sql = (f"{with_}SELECT {_M_COLS}, s.score FROM ({top}) AS s JOIN memories AS m ON m.rowid = s.rowid "
           "ORDER BY s.score, s.rowid")
    return [(_row(r[:-1]), -r[-1]) for r in conn.execute(sql, args)]


def _search_all(conn: sqlite3.Connection, tokens: list[str], op: str, ranked: list[str], limit: int,
                namespace: str | None, rank_window: int) -> list[tuple[MemoryRow, float]] | None:
    """``_search`` when at most ``rank_window`` rows match (the window is every match), walked oldest first in
    one statement; None when more match (the walk stops at ``rank_window + 1``, and nothing is ranked then)."""
    ns_join, ns_where, ns_args = _ns_filter(namespace)
    # No ORDER BY: FTS5 walks oldest first. When every match fits, the window is all of them in any order.
    window = f"SELECT f.rowid{{score}} FROM memories_fts AS f {ns_join} WHERE memories_fts MATCH ? {ns_where} LIMIT ?"
    if ranked == tokens:
        w = window.format(score=f", {_BM25} AS score")
        top = "SELECT rowid, score FROM w WHERE (SELECT count(*) FROM w) <= ? ORDER BY score, rowid LIMIT ?"
        args: tuple[Any, ...] = (op.join(tokens), *ns_args, rank_window + 1, rank_window, limit)
    else:
        # The count test does not depend on a row, so SQLite makes it once, before FTS5 starts (no idf pass
        # when the window overflowed).
        w = window.format(score="")
        top = (f"SELECT f.rowid, {_BM25} AS score FROM memories_fts AS f WHERE memories_fts MATCH ? "
               "AND (SELECT count(*) FROM w) <= ? AND f.rowid >= (SELECT min(rowid) FROM w) AND +f.rowid IN w "
               "ORDER BY score, f.rowid LIMIT ?")
        args = (op.join(tokens), *ns_args, rank_window + 1, op.join(ranked), rank_window, limit)
    # One row at least, carrying the window's size: no row of the top means no match or an overflow.
    sql = (f"WITH w AS MATERIALIZED ({w}) SELECT c.n, t.* FROM (SELECT count(*) AS n FROM w) AS c LEFT JOIN "
           f"(SELECT {_M_COLS}, s.score, s.rowid AS r FROM ({top}) AS s JOIN memories AS m ON m.rowid = s.rowid) "
           "AS t ON c.n <= ? ORDER BY t.score, t.r")
    rows = conn.execute(sql, (*args, rank_window)).fetchall()
    if rows[0][0] > rank_window:
        return None
    return [(_row(r[1:-2]), -r[-2]) for r in rows if r[-1] is not None]


def _ns_filter(namespace: str | None) -> tuple[str, str, tuple[str, ...]]:
    """The join, condition and argument that keep a window's rows in ``namespace`` (none for None)."""
    if namespace is None:
        return "", "", ()
    return "JOIN memories AS m ON m.rowid = f.rowid", "AND m.namespace = ?", (namespace,)


def _rank_common(conn: sqlite3.Connection, tokens: list[str], limit: int, namespace: str | None,
                 rank_window: int) -> list[tuple[MemoryRow, float]] | None:
    """bm25 over the window when every word is in at least half the rows, computed here from the window's text.

    Each word's idf is then the same clamped constant, so a row's score needs only its weighted count of each
    word (title 2.0, content 1.0, tags 1.5) and its length in tokens, with the table's row and token counts
    (FTS5's averages record): FTS5's idf pass, a walk of every word's whole posting list, is skipped. A row's
    counts and length come from its text (_term_vector; TermVectors keeps those of the rows counted last).
    The scores are bm25's, to the bit: the same formula, in the same order of float operations. Words are counted
    as unicode61 tokenizes ASCII text (runs of letters and digits, case-folded), so this path serves only ASCII
    words over an all-ASCII window; None tells the caller to rank with bm25 instead.
    Equal scores: the older memory first. [] when no memory holds every word.
    """
    words = [t[1:-1].replace('""', '"').lower() for t in tokens]
    averages = _averages(conn)
    if not all(w.isascii() for w in words) or averages is None:
        return None
    avgdl = averages[1]
    ns_where, ns_args = ("", ()) if namespace is None else ("AND m.namespace = ?", (namespace,))
    # The window (the rank_window most recent rows holding every word), with each row's cells.
    window = conn.execute(
        "SELECT f.rowid, m.title || char(1) || m.content || char(1) || m.tags FROM memories_fts AS f "
        f"JOIN memories AS m ON m.rowid = f.rowid WHERE memories_fts MATCH ? {ns_where} ORDER BY f.rowid DESC LIMIT ?",
        (" AND ".join(tokens), *ns_args, rank_window)).fetchall()
    if not window:
        return []
    vectors = TERM_VECTORS.of([r[1] for r in window])
    if vectors is None:
        return None
    norms = [_K1 * (1 - _B + _B * length / avgdl) for length, _ in vectors]
    # The words' terms are added in the query's order, from 0.0, as bm25 adds them.
    scores = [0.0] * len(window)
    for word in [w.encode("ascii") for w in words]:
        freqs = [v.get(word, 0.0) for _, v in vectors]
        scores = [s + _CLAMPED_IDF * ((x * _K1_PLUS_1) / (x + d)) for s, x, d in zip(scores, freqs, norms, strict=True)]
    # The best first, equal scores older (lower rowid) first: the smallest (-score, rowid).
    best = heapq.nsmallest(limit, zip([-x for x in scores], [r[0] for r in window], strict=True))
    marks_sql = ",".join("?" * len(best))
    found = {r[-1]: _row(r[:-1]) for r in conn.execute(
        f"SELECT {_M_COLS}, m.rowid FROM memories AS m WHERE m.rowid IN ({marks_sql})", [r for _, r in best])}
    # A row deleted between the two statements (outside a read transaction) is left out, not a KeyError.
    return [(found[rowid], -score) for score, rowid in best if rowid in found]


def _averages(conn: sqlite3.Connection) -> tuple[int, float] | None:
    """FTS5's row count and mean row length in tokens (its averages record, what bm25 reads); None if no rows."""
    block = conn.execute("SELECT block FROM memories_fts_data WHERE id = 1").fetchone()
    if block is None:
        return None
    values = _varints(block[0])  # empty while the index has never held a row
    return (values[0], sum(values[1:]) / values[0]) if values and values[0] > 0 else None


def _fts5_walk(n: int, counts: list[int], common: list[bool], guess: float, rank_window: int) -> float:
    """About how many posting-list entries FTS5 walks to rank an AND of some common words: bm25's idf pass over the
    ranked words' whole lists, and the AND's steps through the common words' lists over the window's span (the
    rows back to the ``rank_window``-th match, from ``guess`` matches of the others)."""
    span = n if guess <= rank_window else n * rank_window / guess
    return sum(k for k, c in zip(counts, common, strict=True) if not c) + \
        (span / n * sum(k for k, c in zip(counts, common, strict=True) if c) if n and not all(common) else 0.0)


def _idfs(n_rows: int, counts: list[int], common: list[bool]) -> list[float]:
    """Each word's bm25 idf over FTS5's ``n_rows``, from its DocFreqs count (clamped where it is common)."""
    return [_CLAMPED_IDF if c else _idf(n_rows, k) for k, c in zip(counts, common, strict=True)]


def _window_chunks(conn: sqlite3.Connection, match: str, namespace: str | None, rank_window: int,
                   oldest_first: bool, checked: bool) -> Iterator[list[Row] | None]:
    """The rows matching ``match`` (rowid, title, content and tags joined by _CELL), newest first, a chunk at a
    time; None after WINDOW_READS chunks (the caller gives up). ``oldest_first``, a guess that at most
    ``rank_window`` rows match (as _search takes it): they are walked oldest first, the cheaper way, and read by
    rowid when they all fit. ``checked``: the caller drops the rows lacking a common word (left out of ``match``),
    so chunks of twice the window are read until it has its window."""
    ns_join, ns_where, ns_args = _ns_filter(namespace)
    cells = "m.title || char(1) || m.content || char(1) || m.tags"
    if oldest_first and not checked:
        found = [r[0] for r in conn.execute(f"SELECT f.rowid FROM memories_fts AS f {ns_join} WHERE memories_fts "
                                            f"MATCH ? {ns_where} LIMIT ?", (match, *ns_args, rank_window + 1))]
        if len(found) <= rank_window:
            rows: list[Row] = []
            for i in range(0, len(found), _CHUNK):
                chunk = found[i:i + _CHUNK]
                rows += conn.execute(f"SELECT m.rowid, {cells} FROM memories AS m WHERE m.rowid IN "
                                     f"({','.join('?' * len(chunk))})", chunk).fetchall()
            yield sorted(rows, reverse=True)
            return
    size, below = (2 if checked else 1) * rank_window, ""
    args: tuple[Any, ...] = ()
    for _ in range(WINDOW_READS):
        chunk = conn.execute(f"SELECT f.rowid, {cells} FROM memories_fts AS f JOIN memories AS m ON m.rowid = f.rowid "
                             f"WHERE memories_fts MATCH ? {ns_where} {below} ORDER BY f.rowid DESC LIMIT ?",
                             (match, *ns_args, *args, size)).fetchall()
        yield chunk
        if len(chunk) < size:
            return
        below, args = "AND f.rowid < ?", (chunk[-1][0],)
    yield None


def _rank_window(conn: sqlite3.Connection, tokens: list[str], op: str, idfs: list[float], limit: int,
                 namespace: str | None, rank_window: int, averages: tuple[int, float], checked: list[bool],
                 oldest_first: bool = False) -> list[tuple[MemoryRow, float]] | None:
    """bm25 over the window (the ``rank_window`` most recent rows matching the ``op``-joined words), computed here:
    each word's ``idfs`` given (DocFreqs' counts: FTS5's idf pass, a walk of every word's whole posting list, is
    skipped), each row's weighted count of each word (title 2.0, content 1.0, tags 1.5) and length in tokens
    counted from its text, as _rank_common counts them (ASCII only: None tells the caller to rank with bm25).
    The words ``checked`` (common ones, ANDed) are left out of FTS5's match and checked in the text here: FTS5's
    AND steps through their long posting lists over the whole span of the window (~10 ms at 1M when the other
    words' matches are few). The same formula in bm25's order of float operations: with exact counts, bm25's
    scores. Equal scores: the older memory first. [] when nothing matches."""
    words = [t[1:-1].replace('""', '"').lower() for t in tokens]
    if not all(w.isascii() for w in words):
        return None
    keys = [w.encode("ascii") for w in words]
    checked = checked if not all(checked) else [False] * len(tokens)  # FTS5 matches one word at least
    must = [i for i, c in enumerate(checked) if c]
    match = op.join(t for t, c in zip(tokens, checked, strict=True) if not c)
    wt, wc, wg = _WEIGHTS
    scored: list[tuple[float, int]] = []
    for chunk in _window_chunks(conn, match, namespace, rank_window, oldest_first, bool(must)):
        if chunk is None:
            return None
        for rowid, cells in chunk:
            if not cells.isascii() or cells.count(_CELL) != 2:
                return None
            title, content, tags = (c.split() for c in cells.encode("ascii").translate(_TOKEN_BYTES).split(b"\x01"))
            xs = [wt * title.count(k) + wc * content.count(k) + wg * tags.count(k) for k in keys]
            if any(xs[i] == 0.0 for i in must):
                continue
            d = _K1 * (1 - _B + _B * (len(title) + len(content) + len(tags)) / averages[1])
            score = 0.0
            # The words' terms are added in the query's order, from 0.0, as bm25 adds them.
            for x, idf in zip(xs, idfs, strict=True):
                score += idf * ((x * _K1_PLUS_1) / (x + d))
            scored.append((-score, rowid))
            if len(scored) >= rank_window:
                break
        if len(scored) >= rank_window:
            break
    best = heapq.nsmallest(limit, scored)
    marks_sql = ",".join("?" * len(best))
    found = {r[-1]: _row(r[:-1]) for r in conn.execute(
        f"SELECT {_M_COLS}, m.rowid FROM memories AS m WHERE m.rowid IN ({marks_sql})", [r for _, r in best])}
    return [(found[rowid], -score) for score, rowid in best if rowid in found]


TermVector = tuple[int, dict[bytes, float]]  # a row's length in tokens, each token's weighted count


def _term_vector(cells: str) -> TermVector | None:
    """A row's length in tokens and each token's frequency in it as bm25 weighs it (title 2.0, content 1.0,
    tags 1.5), from its title, content and tags joined by _CELL; None unless the text is ASCII without _CELL.

    Tokens are runs of ASCII letters and digits, case-folded, as unicode61 tokenizes ASCII text, so the length
    is FTS5's %_docsize sum and the weighted count the one bm25 computes."""
    if not cells.isascii() or cells.count(_CELL) != 2:
        return None
    spaced = cells.encode("ascii").translate(_TOKEN_BYTES)
    title, content, tags = (Counter(cell.split()) for cell in spaced.split(b"\x01"))
    wt, wc, wg = _WEIGHTS
    freqs = {tok: wt * title[tok] + wc * content[tok] + wg * tags[tok]
             for tok in title.keys() | content.keys() | tags.keys()}
    return title.total() + content.total() + tags.total(), freqs


class TermVectors:
    """The term vectors (_term_vector) of the rows counted most recently, within an estimate of ``max_bytes``;
    the first counted go first when room is needed (an every-word-common window is the newest rows, so the rows
    counted longest ago are the likeliest to have left it, and a hit costs one dict lookup, nothing more).

    A vector is a pure function of the row's text, and the text is its key: an updated, deleted or renumbered
    row can never be given another text's counts, and one cache serves every database of the process. Thread-
    safe: a database's readers share it (lookups are single dict reads; changes hold the lock)."""

    # Per entry kept (its OrderedDict node, tuples, the empty dict and the int), and per distinct token (the dict
    # slot, the token's bytes object and its float), roughly; the text is counted by sys.getsizeof.
    _ENTRY_BYTES_EST = 400
    _TOKEN_BYTES_EST = 100

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[TermVector, int]] = OrderedDict()

    def of(self, texts: list[str]) -> list[TermVector] | None:
        """The vector of each text, counted now for those not kept (and then kept); None as soon as one text
        cannot be counted (the caller ranks with bm25 then, so the others are not counted for nothing)."""
        kept = list(map(self._kept.get, texts))
        if None not in kept:
            return [k[0] for k in kept]  # type: ignore[index]
        out: list[TermVector] = []
        fresh: dict[str, tuple[TermVector, int]] = {}
        for t, k in zip(texts, kept, strict=True):
            if k is None:
                k = fresh.get(t)
            if k is None:
                v = _term_vector(t)
                if v is None:
                    return None  # nothing kept: what was counted is cheap to count again
                k = fresh[t] = (v, sys.getsizeof(t) + self._ENTRY_BYTES_EST + self._TOKEN_BYTES_EST * len(v[1]))
            out.append(k[0])
        with self._lock:
            for t, k in fresh.items():
                if t in self._kept or k[1] > self.max_bytes:
                    continue
                self._kept[t] = k
                self.bytes += k[1]
            while self.bytes > self.max_bytes:
                self.bytes -= self._kept.popitem(last=False)[1][1]
        return out

    def __len__(self) -> int:
        return len(self._kept)


TERM_VECTORS = TermVectors(TERM_VECTOR_BYTES)


def _varints(blob: bytes) -> list[int]:
    """The SQLite varints in ``blob`` (FTS5's averages and %_docsize records)."""
    out, i = [], 0
    while i < len(blob):
        v = 0
        for j in range(9):
            c = blob[i]
            i += 1
            if j == 8:
                v = (v << 8) | c
                break
            v = (v << 7) | (c & 0x7F)
            if c < 0x80:
                break
        out.append(v)
    return out


def rebuild_fts(conn: sqlite3.Connection) -> None:
    """Rebuild the FTS index from the memories table (needed after a VACUUM, which may renumber rowids).
    On Postgres the tsvector is a generated column, always in step: nothing to do."""
    if getattr(conn, "dialect", "sqlite") == "postgres":
        return
    conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")


def recall_pg(conn: Any, tokens: list[str], limit: int, namespace: str | None, doc_freqs: DocFreqs | None,
              rank_window: int = RANK_WINDOW) -> list[tuple[MemoryRow, float]]:
    """Postgres recall, ranked as SQLite's: the words ANDed (then ORed); the window (the ``rank_window`` most
    recent matches) found through the tsvector's GIN index or the rowid index, whichever the planner's statistics
    say is cheaper; ranked by FTS5's bm25 (title 2.0, content 1.0, tags 1.5), each row's word counts and length
    read from its tsvector by ts_rank_cd (pg_window), each word's idf from its row count (DocFreqs) and the mean
    row length from a sample of the table (DocFreqs.avgdl). Equal scores: the older memory first."""
    freqs = doc_freqs or DocFreqs()
    n, counts = freqs.counts(conn, tokens)
    common = common_flags(n, counts)
    for op in (" & ", " | ") if len(tokens) > 1 else (" & ",):
        # As on SQLite: ANDed, the common words only filter (bm25 clamps their idf to ~0); ORed, every word ranks.
        ranked = [i for i, c in enumerate(common) if not c or op == " | "] or list(range(len(tokens)))
        # How many rows match, were the words independent (the common ones counted only to half the rows).
        guess = min(n, sum(counts)) if op == " | " else n * math.prod(k / n for k in counts) if n else 0.0
        sql, args = pg_window(tokens, op, namespace, rank_window, [tokens[i] for i in ranked],
                              by_index=guess <= math.sqrt(rank_window * max(n, 1)))
        window = conn.execute(sql, args).fetchall()
        if not window:
            continue
        idfs = [_idf(n, counts[i]) for i in ranked]
        best = _bm25_window(window, idfs, freqs.avgdl(conn), limit, ored=op == " | ")
        marks_sql = ",".join("?" * len(best))
        found = {r[-1]: _row(r[:-1]) for r in conn.execute(
            f"SELECT {_M_COLS}, m.rowid FROM memories AS m WHERE m.rowid IN ({marks_sql})", [r for _, r in best])}
        return [(found[rowid], -score) for score, rowid in best if rowid in found]
    return []


def pg_window(tokens: list[str], op: str, namespace: str | None, rank_window: int, ranked: list[str], *,
              by_index: bool) -> tuple[str, tuple[Any, ...]]:
    """The statement of the window and its arguments: per row its rowid, ts_rank_cd with normalization 2 (which
    divides by the row's length in tokens) and without it, and each of the ``ranked`` words' ts_rank_cd, which for
    one word is its weighted count in the row (_PG_RANK_WEIGHTS: title 1.0, tags 0.75, content 0.5, half bm25's).
    The length pair is of the first ranked word ANDed (every row holds it: its count is the pair's second), of
    the window's query ORed. The tsquery is a literal of the statement, never a parameter: the planner sees how
    many rows it matches (a prepared statement's generic plan would not).

    ``by_index``: the matches are few, so all of them are read through the GIN index and the newest kept (a
    bitmap scan and a top-N sort); else the newest rows are walked through the rowid index until the window is
    full, which reads about rank_window * rows / matches of them. The two cost the same at about
    sqrt(rank_window * rows) matches (the caller's guess, from DocFreqs' exact counts), where the planner puts
    the line far too low (a word in 2% of 100k rows was walked through 24k rows in 9 ms rather than read in 2).
    Few matches: the sort key ``rowid + 0``, which no index gives, leaves the planner the GIN index. Many: the
    planner's choice, which is the walk."""
    query = f"to_tsquery('simple', {_sql_text(op.join(pg_word(t) for t in tokens))})"
    ns_where, ns_args = ("", ()) if namespace is None else ("AND m.namespace = ?", (namespace,))
    words = [f"to_tsquery('simple', {_sql_text(pg_word(t))})" for t in ranked]
    length_q = query if op == " | " else words[0]
    ranks = [f"ts_rank_cd({_PG_RANK_WEIGHTS}, w.fts, {q}, {norm})"
             for q, norm in [(length_q, 2), *([(query, 0)] if op == " | " else []), *((q, 0) for q in words)]]
    order = "m.rowid + 0" if by_index else "m.rowid"
    sql = (f"SELECT w.rowid, {', '.join(ranks)} FROM (SELECT m.rowid, m.fts FROM memories "
           f"AS m WHERE m.fts @@ {query} {ns_where} ORDER BY {order} DESC LIMIT ?) AS w")
    return sql, (*ns_args, rank_window)


def _sql_text(text: str) -> str:
    """``text`` as an SQL string literal (standard_conforming_strings: only the quote is doubled)."""
    return "'" + text.replace("'", "''") + "'"


def _idf(n: int, k: int) -> float:
    """FTS5's idf of a word in ``k`` of ``n`` rows: one in at least half of them is clamped to ~0."""
    idf = math.log((n - k + 0.5) / (k + 0.5)) if n else 0.0
    return idf if idf > 0.0 else _CLAMPED_IDF


# ts_rank_cd's weights of the tsvector's D, C (content), B (tags), A (title): bm25's 1.0, 1.5, 2.0 halved (a weight
# is at most 1), D unused. For a one-word query ts_rank_cd without normalization is the sum of the weights of the
# word's positions: its weighted count, halved.
_PG_RANK_WEIGHTS = "'{0.05, 0.5, 0.75, 1.0}'"


def _bm25_window(window: list[Row], idfs: list[float], avgdl: float, limit: int, *,
                 ored: bool) -> list[tuple[float, int]]:
    """The best ``limit`` of the window's rows (pg_window's, of an ``ored`` query or not) by FTS5's bm25 over the
    ranked words whose ``idfs`` are given, as (-score, rowid), equal scores older first."""
    avgdl = avgdl if avgdl > 0 else 1.0
    scored = []
    for rowid, normed, *rest in window:
        halves = rest[1:] if ored else rest
        length = rest[0] / normed if normed else avgdl
        d = _K1 * (1 - _B + _B * round(length) / avgdl)
        score = 0.0
        # The words' terms are added in the query's order, from 0.0, as bm25 adds them.
        for half, idf in zip(halves, idfs, strict=True):
            x = 2.0 * half
            score += idf * ((x * _K1_PLUS_1) / (x + d))
        scored.append((-score, int(rowid)))
    return heapq.nsmallest(limit, scored)
