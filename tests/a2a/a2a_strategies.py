"""Hypothesis strategies shared by the a2a tests (unique module name: tests/ has no packages)."""

from __future__ import annotations

import uuid

from hypothesis import strategies as st

agent_ids = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40
)
correlation_ids = st.uuids(version=4).map(str)
cbor_ints = st.integers(min_value=-(2**64), max_value=2**64 - 1)
plain_leaves = (st.none() | st.booleans() | cbor_ints | st.floats(allow_nan=False) | st.text(max_size=20)
                | st.binary(max_size=20))
plain_values = st.recursive(
    plain_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
payloads = st.builds(
    lambda kind, extra: {**extra, "kind": kind},
    st.text(min_size=1, max_size=20),
    st.dictionaries(st.text(max_size=8), plain_values, max_size=5),
)
envelope_fields = st.fixed_dictionaries(
    {
        "correlation_id": correlation_ids,
        "sender": agent_ids,
        "recipients": st.lists(agent_ids, min_size=1, max_size=5, unique=True).map(tuple),
        "payload": payloads,
        "expires_at": st.integers(min_value=0, max_value=2**64 - 1),
    }
)


def memory(**overrides: object) -> dict:
    base = {
        "id": str(uuid.uuid4()),
        "namespace": "notes",
        "title": "t",
        "content": "c",
        "tags": ["a", "b"],
        "priority": 3,
        "confidence": 0.9,
        "source": "mcp",
        "origin": "ai:node-1@lab",
        "writer": "ai:node-1@lab",
        "version": 1,
        "created_at": 1_700_000_000_000,
        "updated_at": 1_700_000_000_000,
    }
    base.update(overrides)
    return base


def link(**overrides: object) -> dict:
    base = {
        "src_id": "m1",
        "dst_id": "m2",
        "relation": "supports",
        "observed_by": "ai:node-1@lab",
        "valid_from": 1_700_000_000_000,
        "valid_until": None,
    }
    base.update(overrides)
    return base
