"""A fixed knowledge-graph corpus: 200 memories and 800 links, generated deterministically.

Memories 0-99 form the acyclic part (every link goes from a lower to a higher index); memories
100-199 the cyclic part (a ring plus chords, so every memory lies on cycles of many lengths).
A few links cross from the acyclic to the cyclic part. Relations come from a small set; some
links end (valid_until) or start late, so ``as_of`` matters.
"""

from __future__ import annotations

import random
import uuid

from storage import changelog, graph, links, memories
from storage.graph import InvalidationRow
from storage.links import LinkRow
from storage.memories import MemoryRow

N_MEMORIES = 200
N_LINKS = 800
T0 = 1_700_000_000_000
RELATIONS = ("related_to", "derived_from", "contradicts", "supports")


def memory_ids() -> list[str]:
    rnd = random.Random(14)
    return [str(uuid.UUID(int=rnd.getrandbits(128), version=4)) for _ in range(N_MEMORIES)]


def link_rows() -> list[LinkRow]:
    rnd = random.Random(1414)
    ids = memory_ids()
    pairs: set[tuple[int, int]] = set()
    for i in range(100, 200):  # the ring
        pairs.add((i, 100 + (i - 99) % 100))
    while len(pairs) < N_LINKS:
        kind = rnd.random()
        if kind < 0.45:
            a, b = sorted(rnd.sample(range(100), 2))
        elif kind < 0.95:
            a, b = rnd.sample(range(100, 200), 2)
        else:
            a, b = rnd.randrange(100), rnd.randrange(100, 200)
        pairs.add((a, b))
    rows = []
    for n, (a, b) in enumerate(sorted(pairs)):
        valid_from = T0 + n
        valid_until = T0 + 5_000 + n if n % 17 == 0 else None
        if n % 23 == 0:
            valid_from = T0 + 10_000
        rel = RELATIONS[rnd.randrange(len(RELATIONS))]
        lid = uuid.UUID(int=rnd.getrandbits(128)).hex + uuid.UUID(int=rnd.getrandbits(128)).hex
        rows.append(LinkRow(link_id=lid, src_id=ids[a], dst_id=ids[b], relation=rel, observed_by="ai:corpus@lab",
                            valid_from=valid_from, valid_until=valid_until, attest_level="unsigned",
                            created_at=valid_from))
    return rows


def invalidations() -> list[InvalidationRow]:
    """Every 29th link ends at T0 + 8000 ms by an invalidation."""
    return [InvalidationRow(inval_id=f"{n:064x}", link_id=row.link_id, observed_by="ai:corpus@lab",
                            valid_until=T0 + 8_000, attest_level="unsigned", created_at=T0 + 8_000)
            for n, row in enumerate(link_rows()) if n % 29 == 0]


def load(conn) -> None:
    """Insert the corpus with its change-log entries, as the service would (run it as one db.write job)."""
    for i, mid in enumerate(memory_ids()):
        memories.insert(conn, MemoryRow(id=mid, namespace="default", title=f"m{i}", content=f"corpus memory {i}",
                                        origin="ai:corpus@lab", created_at=T0 + i, updated_at=T0 + i))
    for row in link_rows():
        links.insert(conn, row)
        changelog.append(conn, "link", row.link_id, 1, row.created_at)
    for inv in invalidations():
        graph.insert_invalidation(conn, inv)
        changelog.append(conn, "link", inv.inval_id, 1, inv.created_at)
