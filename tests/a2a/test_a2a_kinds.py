from __future__ import annotations

import pytest
from a2a_strategies import link, memory, plain_values
from hypothesis import given, settings
from hypothesis import strategies as st

from a2a import KNOWN_KINDS, ProtocolError, validate_payload

# A memory.put without a signature; the cases below add the memory.
UNSIGNED_MEMORY = {"kind": "memory.put", "signature": None, "signed_by": None}


TRANSCRIPT_PUT: dict = {"kind": "transcript.put", "body": b"\x28\xb5\x2f\xfd", "signature": None, "signed_by": None,
                        "transcript": {"id": "8d0c6a4e-2f1b-4c3d-9e8f-7a6b5c4d3e2f", "namespace": "team",
                                       "agent": "ai:a@lab", "created_at": 1, "content_hash": "ab" * 32,
                                       "raw_bytes": 10, "spans": [["m", 0, 4]]}}


def test_transcript_put_passes_and_a_bad_span_is_named() -> None:
    assert validate_payload(TRANSCRIPT_PUT) is TRANSCRIPT_PUT
    bad = dict(TRANSCRIPT_PUT, transcript={**TRANSCRIPT_PUT["transcript"], "spans": [["m", 5, 4]]})
    assert code_of(bad) == ("bad_payload", "payload.transcript.spans[0] must be [memory_id, start, end] with "
                                           "0 <= start <= end, got ['m', 5, 4]")
    assert code_of(dict(TRANSCRIPT_PUT, body="text"))[0] == "bad_payload"


def code_of(payload: object) -> tuple[str, str]:
    with pytest.raises(ProtocolError) as info:
        validate_payload(payload)
    return info.value.code, info.value.message


def test_first_kinds_are_known() -> None:
    assert KNOWN_KINDS == {"ping", "memory.put", "memory.put.v2", "link.put", "links.put", "link.invalidate",
                           "transcript.put", "agent.delegate", "agent.revoke"}


def test_memory_put_v2_carries_its_sharing_list_inside_the_record_in_its_one_canonical_form() -> None:
    for share_with in (None, ["ai:a@lab"], ["ai:a@lab", "ai:b@lab", "ai:nœud@lab"]):
        ok = {"kind": "memory.put.v2", "memory": {**memory(), "share_with": share_with}, "signature": b"s" * 64,
              "signed_by": "ai:node-1@lab"}
        assert validate_payload(ok) is ok
    base = {"kind": "memory.put.v2", "signature": None, "signed_by": None}
    # Stated, never absent: a record without it is not a memory.put.v2.
    assert code_of({**base, "memory": memory()}) == ("bad_payload", "payload.memory.share_with is missing")
    for bad in ([], ["ai:b@lab", "ai:a@lab"], ["ai:a@lab", "ai:a@lab"], [""], "ai:a@lab"):
        code, message = code_of({**base, "memory": {**memory(), "share_with": bad}})
        assert code == "bad_payload" and "sorted and distinct" in message, (bad, message)
    # The list lives in the signed record only: none beside it.
    assert code_of({**base, "memory": {**memory(), "share_with": None}, "share_with": ["ai:a@lab"]})[0] == \
        "bad_payload"
    assert code_of({**base, "memory": {**memory(), "share_with": None}, "signed_by": "ai:a@lab"})[0] == "bad_payload"


def test_links_put_carries_1_to_100_links_each_checked_as_a_link_put() -> None:
    one = {"link": link(), "signature": b"s" * 64, "signed_by": "ai:node-1@lab"}
    ok = {"kind": "links.put", "links": [one, {"link": link(), "signature": None, "signed_by": None}]}
    assert validate_payload(ok) is ok
    assert validate_payload({"kind": "links.put", "links": [one] * 100})
    assert code_of({"kind": "links.put", "links": [one] * 101}) == (
        "bad_payload", "payload.links must be an array of 1 to 100 items, got '101 items'")
    assert code_of({"kind": "links.put", "links": []})[0] == "bad_payload"
    assert code_of({"kind": "links.put", "links": one})[0] == "bad_payload"
    # Each item is a whole link.put body: a bad field is named with its index, and the signature pairs per item.
    assert code_of({"kind": "links.put", "links": [one, {**one, "link": {**link(), "relation": ""}}]}) == (
        "bad_payload", "payload.links[1].link.relation must be a non-empty string, got ''")
    assert code_of({"kind": "links.put", "links": [one, {**one, "signed_by": None}]}) == (
        "bad_payload", "payload.links[1].signature and .signed_by must be both set or both null")
    assert code_of({"kind": "links.put", "links": [{**one, "kind": "link.put"}]})[0] == "bad_payload"


@pytest.mark.parametrize(
    "payload",
    [
        {"kind": "ping"},
        {"kind": "ping", "sent_at": 1_700_000_000_000},
        {"kind": "memory.put", "memory": memory(), "signature": None, "signed_by": None},
        {"kind": "memory.put", "memory": memory(confidence=1), "signature": None, "signed_by": None},
        {"kind": "link.put", "link": link(), "signature": None, "signed_by": None},
        {"kind": "link.put", "link": link(valid_until=2_000_000_000_000, confidence=0.5), "signature": b"s" * 64,
         "signed_by": "ai:node-1@lab"},
        {"kind": "link.put", "link": link(confidence=None), "signature": None, "signed_by": None},
    ],
)
def test_valid_payloads_pass_unchanged(payload: dict) -> None:
    assert validate_payload(payload) is payload


def test_unknown_kind_is_refused_by_name() -> None:
    code, message = code_of({"kind": "memory.delete"})
    assert code == "unknown_kind" and "memory.delete" in message


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"kind": "ping", "sent_at": True}, "payload.sent_at"),
        ({"kind": "ping", "sent_at": -1}, "payload.sent_at"),
        ({"kind": "ping", "extra": 1}, "extra"),
        ({"kind": "memory.put"}, "payload.memory"),
        ({**UNSIGNED_MEMORY, "memory": memory(id="not-a-uuid")}, "payload.memory.id"),
        ({**UNSIGNED_MEMORY, "memory": memory(tags=["a", 3])}, "payload.memory.tags[1]"),
        ({**UNSIGNED_MEMORY, "memory": memory(tags="a")}, "payload.memory.tags"),
        ({**UNSIGNED_MEMORY, "memory": memory(priority=True)}, "payload.memory.priority"),
        ({**UNSIGNED_MEMORY, "memory": memory(confidence=float("nan"))}, "payload.memory.confidence"),
        ({**UNSIGNED_MEMORY, "memory": memory(confidence="high")}, "payload.memory.confidence"),
        ({**UNSIGNED_MEMORY, "memory": memory(version=0)}, "payload.memory.version"),
        ({**UNSIGNED_MEMORY, "memory": memory(created_at=1.5)}, "payload.memory.created_at"),
        ({**UNSIGNED_MEMORY, "memory": {k: v for k, v in memory().items() if k != "origin"}}, "payload.memory.origin"),
        ({"kind": "link.put", "link": link(), "signature": b"s" * 63, "signed_by": "ai:x"}, "payload.signature"),
        ({"kind": "link.put", "link": link(), "signature": "s" * 64, "signed_by": "ai:x"}, "payload.signature"),
        ({"kind": "link.put", "link": link(), "signature": b"s" * 64, "signed_by": None}, "signed_by"),
        ({"kind": "link.put", "link": link(), "signature": None}, "payload.signed_by"),
        ({"kind": "link.put", "link": link(valid_until="never"), "signature": None, "signed_by": None},
         "payload.link.valid_until"),
        ({"kind": "link.put", "link": link(valid_from=None), "signature": None, "signed_by": None},
         "payload.link.valid_from"),
        ({"kind": "link.put", "link": link(relation=""), "signature": None, "signed_by": None},
         "payload.link.relation"),
    ],
)
def test_bad_payload_names_the_field(payload: dict, field: str) -> None:
    code, message = code_of(payload)
    assert code == "bad_payload"
    assert field in message


@pytest.mark.parametrize("payload", [None, [], "ping", {"kind": None}, {}])
def test_non_map_or_kindless_payload_is_bad_payload(payload: object) -> None:
    assert code_of(payload)[0] == "bad_payload"


@settings(max_examples=1000)
@given(st.one_of(plain_values,
                 st.dictionaries(st.text(max_size=10), plain_values, max_size=5).map(lambda d: d | {"kind": "ping"})))
def test_random_payloads_raise_only_protocol_error(payload: object) -> None:
    try:
        validate_payload(payload)
    except ProtocolError:
        pass


@settings(max_examples=1000)
@given(
    st.sampled_from(sorted(KNOWN_KINDS)),
    st.sampled_from(["memory", "link", "links", "invalidation", "signature", "signed_by", "sent_at", "delegation",
                     "revocation"]),
    st.sampled_from(list(memory()) + list(link()) + ["link_id", "share_with", "agent_id", "agent_key", "issuer",
                                                     "valid_from", "delegation_id", "revoked_at"]),
    plain_values,
)
def test_valid_payloads_with_one_field_corrupted_raise_only_protocol_error(kind: str, top: str, inner: str,
                                                                          value: object) -> None:
    payload: dict = {
        "ping": {"kind": "ping", "sent_at": 1},
        "memory.put": {"kind": "memory.put", "memory": memory(), "signature": None, "signed_by": None},
        "memory.put.v2": {"kind": "memory.put.v2", "memory": {**memory(), "share_with": ["ai:a@lab"]},
                          "signature": None, "signed_by": None},
        "link.put": {"kind": "link.put", "link": link(), "signature": None, "signed_by": None},
        "links.put": {"kind": "links.put", "links": [{"link": link(), "signature": None, "signed_by": None}]},
        "link.invalidate": {"kind": "link.invalidate", "signature": None, "signed_by": None,
                            "invalidation": {"link_id": "ab" * 32, "observed_by": "ai:a@lab", "valid_until": 5}},
        "transcript.put": dict(TRANSCRIPT_PUT, transcript=dict(TRANSCRIPT_PUT["transcript"])),
        "agent.delegate": {"kind": "agent.delegate", "signature": b"s" * 64, "signed_by": "ai:a@lab",
                           "delegation": {"agent_id": "ai:bot@a", "agent_key": b"k" * 32, "issuer": "ai:a@lab",
                                          "valid_from": 1, "valid_until": 2}},
        "agent.revoke": {"kind": "agent.revoke", "signature": b"s" * 64, "signed_by": "ai:a@lab",
                         "revocation": {"delegation_id": "ab" * 32, "agent_id": "ai:bot@a", "issuer": "ai:a@lab",
                                        "revoked_at": 5}},
    }[kind]
    target = payload.get(top)
    if isinstance(target, dict):
        target[inner] = value
    else:
        payload[top] = value
    try:
        validate_payload(payload)
    except ProtocolError:
        pass


def test_agent_kinds_and_the_delegation_hint_hold_their_shapes() -> None:
    delegate = {"kind": "agent.delegate", "signature": b"s" * 64, "signed_by": "ai:a@lab",
                "delegation": {"agent_id": "ai:bot@a", "agent_key": b"k" * 32, "issuer": "ai:a@lab", "valid_from": 1,
                               "valid_until": 2}}
    assert validate_payload(delegate) is delegate
    for bad in ({**delegate, "signature": None}, {**delegate, "delegation": {**delegate["delegation"],
                                                                            "agent_key": b"k" * 31}}):
        assert code_of(bad)[0] == "bad_payload"
    put = {"kind": "link.put", "link": link(), "signature": b"s" * 64, "signed_by": "ai:bot@a"}
    assert validate_payload({**put, "delegation": "ab" * 32})
    for hint in ("AB" * 32, "ab" * 31, 5):
        assert code_of({**put, "delegation": hint})[0] == "bad_payload"
