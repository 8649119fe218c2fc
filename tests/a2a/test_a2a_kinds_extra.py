"""Payload integers must fit SQLite's signed 64-bit INTEGER, or a peer could make our insert overflow."""

import pytest

from a2a import ProtocolError, validate_payload


@pytest.mark.parametrize("value", [2**63, 2**64 - 1])
def test_integer_beyond_int64_is_a_bad_payload(value: int) -> None:
    memory = {"id": "11111111-1111-4111-8111-111111111111", "namespace": "n", "title": "", "content": "c",
              "tags": [], "priority": 5, "confidence": 1.0, "source": "", "origin": "ai:a", "writer": "ai:a",
              "version": value, "created_at": 1, "updated_at": 1}
    with pytest.raises(ProtocolError) as err:
        validate_payload({"kind": "memory.put", "memory": memory, "signature": None, "signed_by": None})
    assert err.value.code == "bad_payload"
