"""The memory shape tools and the CLI show: every field of the row, JSON-friendly."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from a2a import ProtocolError
from a2a.envelope import Envelope, decode_frame
from node.wire import envelope_wires, memory_dict
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


def _link_put(i: int) -> dict:
    return {"kind": "link.put", "link": {"src_id": f"m{i}", "dst_id": "m2", "relation": "cites " + "é" * i,
                                         "observed_by": "ai:a@lab", "valid_from": 10**12 + i,
                                         "valid_until": None, "confidence": 0.25},
            "signature": bytes(range(64)), "signed_by": "ai:a@lab"}


def test_envelope_wires_are_each_what_envelope_to_wire_encodes():
    peers = ["ai:b@lab", "ai:c@lab", "ai:d-long-name@lab"]
    for i in (0, 1, 30):
        wires = envelope_wires("ai:a@lab", peers, _link_put(i), 1_000, 60_000)
        assert len({cid for cid, _ in wires}) == len(peers)  # each copy its own correlation id
        for peer, (cid, wire) in zip(peers, wires, strict=True):
            env = Envelope(correlation_id=cid, sender="ai:a@lab", recipients=(peer,), payload=_link_put(i),
                           expires_at=61_000)
            assert wire == env.to_wire()
            decoded = decode_frame(wire, 1 << 20)
            assert decoded == env and decoded.recipients == (peer,)


def test_envelope_wires_validate_the_payload_once_for_all():
    assert envelope_wires("ai:a@lab", [], _link_put(0), 1, 1) == []
    with pytest.raises(ProtocolError):
        envelope_wires("ai:a@lab", ["ai:b@lab"], {"kind": "link.put", "bad": {1, 2}}, 1, 1_000)
