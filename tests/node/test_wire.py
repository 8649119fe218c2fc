"""The memory shape tools and the CLI show: every field of the row, JSON-friendly."""

from __future__ import annotations

import json
from dataclasses import asdict

from node.wire import memory_dict
from storage.memories import MemoryRow


def test_memory_dict_has_every_field_with_lists_and_hex():
    row = MemoryRow(id="m1", namespace="work", title="t", content="c", tags=("a", "b"), origin="ai:a@lab",
                    created_at=1, updated_at=2, signature=b"\x01\xff", signed_by="ai:a@lab",
                    attest_level="self_signed", share_with=("ai:b@lab",), received_from="ai:c@lab")
    d = memory_dict(row)
    assert d == {**asdict(row), "tags": ["a", "b"], "signature": "01ff", "share_with": ["ai:b@lab"]}
    assert json.loads(json.dumps(d)) == d


def test_memory_dict_of_an_unsigned_row_shared_with_all():
    row = MemoryRow(id="m2", namespace="n", content="c", origin="ai:a@lab", created_at=1, updated_at=1)
    d = memory_dict(row)
    assert d["signature"] is None and d["share_with"] is None and d["tags"] == []
    assert d["writer"] == "ai:a@lab"
