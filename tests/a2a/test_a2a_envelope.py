from __future__ import annotations

import dataclasses

import cbor2
import pytest
from a2a_strategies import agent_ids, correlation_ids, envelope_fields
from hypothesis import given, settings
from hypothesis import strategies as st

from a2a import Ack, Envelope, ProtocolError, decode_frame, new_envelope

MAX = 1024 * 1024
CID = "0b7e2d4c-5f6a-4b8c-9d0e-1f2a3b4c5d6e"


def wire(**overrides: object) -> dict:
    base = {
        "v": 1,
        "type": "msg",
        "correlation_id": CID,
        "sender": "ai:a",
        "recipients": ["ai:b"],
        "payload": {"kind": "ping"},
        "expires_at": 1000,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def code_of(data: bytes, max_bytes: int = MAX) -> str:
    with pytest.raises(ProtocolError) as info:
        decode_frame(data, max_bytes)
    assert info.value.message
    return info.value.code


def test_envelope_wire_is_the_design_map() -> None:
    env = Envelope(CID, "ai:a", ("ai:b", "ai:c"), {"kind": "ping", "sent_at": 5}, 1000)
    assert cbor2.loads(env.to_wire()) == {
        "v": 1,
        "type": "msg",
        "correlation_id": CID,
        "sender": "ai:a",
        "recipients": ["ai:b", "ai:c"],
        "payload": {"kind": "ping", "sent_at": 5},
        "expires_at": 1000,
    }
    assert env.kind == "ping"


def test_wire_is_canonical_cbor() -> None:
    env = Envelope(CID, "ai:a", ("ai:b",), {"kind": "ping", "zz": 1, "a": 2}, 1000)
    assert env.to_wire() == cbor2.dumps(env.to_map(), canonical=True)


def test_ack_wire_is_the_design_map() -> None:
    assert cbor2.loads(Ack.duplicate(CID, "ai:b").to_wire()) == {
        "v": 1,
        "type": "ack",
        "correlation_id": CID,
        "recipient": "ai:b",
        "accepted": False,
        "reason": "duplicate",
    }


@pytest.mark.parametrize("ack", [Ack.ok(CID, "ai:b"), Ack.duplicate(CID, "ai:b"),
                                 Ack.rejected(CID, "ai:b", "bad_signature")])
def test_acks_round_trip(ack: Ack) -> None:
    assert decode_frame(ack.to_wire(), MAX) == ack


def test_rejected_ack_is_permanent_and_names_its_code() -> None:
    ack = Ack.rejected(CID, "ai:b", "sender_mismatch")
    assert ack.reason == "rejected:sender_mismatch"
    assert ack.permanent and not ack.accepted and ack.reject_code == "sender_mismatch"
    assert not Ack.duplicate(CID, "ai:b").permanent
    assert not Ack.ok(CID, "ai:b").permanent


def test_ack_reason_must_match_accepted() -> None:
    with pytest.raises(ProtocolError):
        Ack(CID, "ai:b", True, "duplicate")
    with pytest.raises(ProtocolError):
        Ack(CID, "ai:b", False, None)
    with pytest.raises(ProtocolError):
        Ack(CID, "ai:b", False, "rejected:Not Snake")


def test_new_envelope_mints_uuid4_and_expiry() -> None:
    a = new_envelope("ai:a", ["ai:b"], {"kind": "ping"}, now_ms=1_000, ttl_ms=60_000)
    b = new_envelope("ai:a", ["ai:b"], {"kind": "ping"}, now_ms=1_000, ttl_ms=60_000)
    assert a.expires_at == 61_000
    assert a.correlation_id != b.correlation_id
    assert a.recipients == ("ai:b",)


def test_envelope_payload_is_copied_from_the_caller() -> None:
    payload = {"kind": "ping", "xs": [1]}
    env = Envelope(CID, "ai:a", ("ai:b",), payload, 1)
    payload["xs"].append(2)
    assert env.payload == {"kind": "ping", "xs": [1]}


def test_oversize_frame_is_too_large_before_decoding() -> None:
    assert code_of(b"\xff" * 11, max_bytes=10) == "too_large"


@pytest.mark.parametrize(
    "data",
    [b"", b"\xff", b"\xa1", cbor2.dumps(wire())[:-1], cbor2.dumps(wire()) + b"\x00"],
    ids=["empty", "break", "truncated-map", "truncated-envelope", "trailing-bytes"],
)
def test_non_cbor_or_truncated_frame_is_malformed(data: bytes) -> None:
    assert code_of(data) == "malformed"


def test_non_map_frame_is_malformed() -> None:
    assert code_of(cbor2.dumps([1, 2])) == "malformed"


def test_cbor_tags_are_refused() -> None:
    assert code_of(b"\xc1\x01") == "malformed"  # epoch datetime
    assert code_of(cbor2.dumps(wire(payload={"kind": "ping", "big": 2**70}))) == "malformed"


@pytest.mark.parametrize("v", [2, 0, True, "1", None, 1.0])
def test_wrong_version_is_bad_version(v: object) -> None:
    assert code_of(cbor2.dumps(wire(v=v))) == "bad_version"


@pytest.mark.parametrize("t", ["nack", None, 1])
def test_unknown_type_is_bad_type(t: object) -> None:
    assert code_of(cbor2.dumps(wire(type=t))) == "bad_type"


@pytest.mark.parametrize(
    "cid",
    [
        "0B7E2D4C-5F6A-4B8C-9D0E-1F2A3B4C5D6E",  # upper case
        "0b7e2d4c-5f6a-1b8c-9d0e-1f2a3b4c5d6e",  # version 1
        "0b7e2d4c-5f6a-4b8c-7d0e-1f2a3b4c5d6e",  # wrong variant
        "0b7e2d4c5f6a4b8c9d0e1f2a3b4c5d6e",  # no hyphens
        CID + "\n",
        b"\x00" * 16,
        None,
        12,
    ],
)
def test_non_canonical_correlation_id_is_refused(cid: object) -> None:
    assert code_of(cbor2.dumps(wire(correlation_id=cid))) == "bad_correlation_id"


@pytest.mark.parametrize(
    "overrides",
    [
        {"sender": ""},
        {"sender": 5},
        {"sender": "x" * 129},
        {"sender": "ai:a\n"},
        {"recipients": []},
        {"recipients": "ai:b"},
        {"recipients": ["ai:b", ""]},
        {"recipients": ["ai:b", "ai:b"]},
        {"expires_at": -1},
        {"expires_at": True},
        {"expires_at": 1.5},
        {"expires_at": "1000"},
        {"extra": 1},
        {"sender": _DROP},
        {"expires_at": _DROP},
    ],
)
def test_bad_envelope_fields_are_bad_field(overrides: dict) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_frame(cbor2.dumps(wire(**overrides)), MAX)
    assert info.value.code == "bad_field"
    assert info.value.correlation_id == CID  # so the receiver can still answer rejected:bad_field


@pytest.mark.parametrize(
    "payload",
    [[], "ping", {}, {"kind": 1}, {"kind": ""}, {"kind": "ping", 1: 2},
     {"kind": "ping", "x": {"y": float("nan")}} | {"z": cbor2.CBORSimpleValue(99)}],
)
def test_payload_must_be_a_map_with_a_string_kind(payload: object) -> None:
    assert code_of(cbor2.dumps(wire(payload=payload))) in {"bad_payload", "malformed"}


def test_bool_is_not_an_int_on_the_wire() -> None:
    with pytest.raises(ProtocolError):
        Envelope(CID, "ai:a", ("ai:b",), {"kind": "ping"}, True)  # type: ignore[arg-type]


def test_deep_nesting_is_refused_not_crashing() -> None:
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    data = b"\x81" * 100_000 + b"\x01"
    assert code_of(data) == "malformed"
    with pytest.raises(ProtocolError):
        Envelope(CID, "ai:a", ("ai:b",), {"kind": "ping", "d": deep}, 1)


def test_non_bytes_input_is_malformed() -> None:
    assert code_of("not bytes") == "malformed"  # type: ignore[arg-type]


@settings(max_examples=300)
@given(envelope_fields)
def test_random_envelopes_round_trip_exactly(fields: dict) -> None:
    env = Envelope(**fields)
    back = decode_frame(env.to_wire(), len(env.to_wire()))
    assert back == env
    assert back.to_wire() == env.to_wire()


@settings(max_examples=300)
@given(envelope_fields, st.booleans(), st.sampled_from([None, "duplicate", "rejected:x_y"]))
def test_random_acks_round_trip_exactly(fields: dict, accepted: bool, reason: str | None) -> None:
    try:
        ack = Ack(fields["correlation_id"], fields["sender"], accepted, reason)
    except ProtocolError:
        return
    assert decode_frame(ack.to_wire(), MAX) == ack


@settings(max_examples=1000)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes) -> None:
    try:
        decode_frame(data, 200)
    except ProtocolError:
        pass


cbor_structures = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10) | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.booleans()), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=500)
@given(cbor_structures)
def test_arbitrary_cbor_structures_raise_only_protocol_error(obj: object) -> None:
    try:
        decode_frame(cbor2.dumps(obj), MAX)
    except ProtocolError:
        pass


@settings(max_examples=500)
@given(envelope_fields,
       st.sampled_from(["v", "type", "correlation_id", "sender", "recipients", "payload", "expires_at"]),
       cbor_structures)
def test_envelopes_with_one_field_corrupted_raise_only_protocol_error(fields: dict, key: str, value: object) -> None:
    m = Envelope(**fields).to_map()
    m[key] = value
    try:
        result = decode_frame(cbor2.dumps(m), MAX)
    except ProtocolError:
        return
    assert isinstance(result, Envelope)


@settings(max_examples=300)
@given(envelope_fields, st.integers(min_value=0, max_value=2000))
def test_bit_flipped_frames_raise_only_protocol_error(fields: dict, position: int) -> None:
    data = bytearray(Envelope(**fields).to_wire())
    data[position % len(data)] ^= 0xFF
    try:
        decode_frame(bytes(data), MAX)
    except ProtocolError:
        pass


def test_envelope_is_frozen() -> None:
    env = Envelope(CID, "ai:a", ("ai:b",), {"kind": "ping"}, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.sender = "ai:x"  # type: ignore[misc]


@pytest.mark.parametrize("ack", [
    Ack.ok("0b3f9a57-1d4c-4e8a-9b2f-5c6d7e8f9a0b", "ai:b"),
    Ack.duplicate("0b3f9a57-1d4c-4e8a-9b2f-5c6d7e8f9a0b", "ai:" + "x" * 125),
    Ack.rejected("0b3f9a57-1d4c-4e8a-9b2f-5c6d7e8f9a0b", "ai:b\u00e9", "sender_mismatch"),
])
def test_ack_to_wire_is_the_canonical_encoding(ack) -> None:
    assert ack.to_wire() == cbor2.dumps(ack.to_map(), canonical=True)


class _Str(str):
    pass


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("extra", [
    {"n": 2**64 - 1}, {"n": -(2**64)}, {"n": 2**64}, {"n": -(2**64) - 1}, {"t": (1, [2, (3,)])},
    {"d": _nested(30)}, {"d": _nested(31)}, {"d": {"k": _nested(30)}}, {"b": b"\x00", "f": 1.5, "z": None, "y": True},
    {"m": {1: 2}}, {"s": {1, 2}}, {"o": object()},
])
def test_payload_fast_path_agrees_with_the_full_check(extra: dict) -> None:
    from a2a.envelope import _check_plain, _thaw

    payload = {"kind": "ping", **extra}
    try:
        _check_plain("payload", payload, 1, CID)
        expected: object = _thaw(payload)
    except ProtocolError as e:
        expected = (e.code, e.message)
    try:
        got: object = Envelope(CID, "ai:a", ("ai:b",), payload, 1).payload
    except ProtocolError as e:
        got = (e.code, e.message)
    assert got == expected


@pytest.mark.parametrize("recipients, error", [
    (("ai:b", "ai:c\x7f"), "recipients[1] contains control characters"),
    (("ai:b\n",), "recipients[0] contains control characters"),
    (("ai:b", 5), "recipients[1] must be a non-empty string"),
    (("x" * 129,), "recipients[0] is 129 characters long"),
    (("ai:b", ""), "recipients[1] must be a non-empty string"),
    ((_Str("ai:b"), "ai:c"), None),
    (("x" * 128, "ai:c"), None),
])
def test_recipients_fast_path_agrees_with_the_per_item_check(recipients: tuple, error: str | None) -> None:
    if error is None:
        assert Envelope(CID, "ai:a", recipients, {"kind": "ping"}, 1).recipients == recipients
        return
    with pytest.raises(ProtocolError) as info:
        Envelope(CID, "ai:a", recipients, {"kind": "ping"}, 1)
    assert info.value.code == "bad_field" and info.value.message.startswith(error)


# The accepted ACK's fast paths: its bytes from a template, and a sender's byte-for-byte match of them.

def _full_decode(data: bytes, max_bytes: int = MAX) -> object:
    from a2a import decode_wire

    try:
        return decode_wire(data, max_bytes)
    except ProtocolError as e:
        return (e.code, e.message)


@settings(max_examples=300)
@given(agent_ids, correlation_ids)
def test_accepted_ack_template_is_the_canonical_encoding(recipient: str, cid: str) -> None:
    try:
        ack = Ack.ok(cid, recipient)
    except ProtocolError:
        return
    assert ack.to_wire() == cbor2.dumps(ack.to_map(), canonical=True)


def test_accepted_ack_template_takes_a_str_subclass_and_the_longest_recipient() -> None:
    for recipient in (_Str("ai:b"), "ai:" + "\u00e9" * 125, "\u00e9" * 128, "\U0001f600" * 128, "x" * 128):
        ack = Ack.ok(CID, recipient)
        assert ack.to_wire() == cbor2.dumps(ack.to_map(), canonical=True)


@settings(max_examples=300)
@given(agent_ids, correlation_ids)
def test_accepted_ack_match_is_what_the_full_decode_makes(recipient: str, cid: str) -> None:
    from a2a import accepted_ack

    try:
        data = Ack.ok(cid, recipient).to_wire()
    except ProtocolError:
        return
    got = accepted_ack(data, recipient, MAX)
    assert got is not None and got == _full_decode(data) and type(got) is Ack
    assert got.to_wire() == data


def _some_acks(recipient: str, cid: str) -> list[bytes]:
    return [Ack.ok(cid, recipient).to_wire(), Ack.duplicate(cid, recipient).to_wire(),
            Ack.rejected(cid, recipient, "rate_limited").to_wire(), Ack.ok(cid, recipient + "x").to_wire()]


@settings(max_examples=1000)
@given(agent_ids, correlation_ids, st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=400),
       st.sampled_from(["flip", "set", "cut", "add", "none"]), st.integers(min_value=0, max_value=255))
def test_accepted_ack_match_never_decides_other_than_the_full_decode(
        recipient: str, cid: str, which: int, position: int, how: str, byte: int) -> None:
    """Whatever the bytes, the match either declines (the full decode then decides) or gives what it gives."""
    from a2a import accepted_ack

    try:
        data = bytearray(_some_acks(recipient, cid)[which])
    except ProtocolError:
        return
    i = position % len(data)
    if how == "flip":
        data[i] ^= 0xFF
    elif how == "set":
        data[i] = byte
    elif how == "cut":
        del data[i:]
    elif how == "add":
        data.insert(i, byte)
    got = accepted_ack(bytes(data), recipient, MAX)
    assert got is None or got == _full_decode(bytes(data))


@pytest.mark.parametrize("cid", [
    CID.upper(),                                   # not lowercase
    "0b7e2d4c-5f6a-1b8c-9d0e-1f2a3b4c5d6e",        # version 1
    "0b7e2d4c-5f6a-4b8c-7d0e-1f2a3b4c5d6e",        # wrong variant
    "0b7e2d4c-5f6a-4b8c-9d0e-1f2a3b4c5d6\u00e9"[:36],  # a non-ASCII character (two bytes: one too many)
    "0b7e2d4c+5f6a-4b8c-9d0e-1f2a3b4c5d6e",        # not hyphenated
])
def test_accepted_ack_with_a_bad_correlation_id_takes_the_full_decode(cid: str) -> None:
    from a2a import accepted_ack

    m = Ack.ok(CID, "ai:b").to_map()
    m["correlation_id"] = cid
    data = cbor2.dumps(m, canonical=True)
    assert accepted_ack(data, "ai:b", MAX) is None
    assert _full_decode(data)[0] == "bad_correlation_id"  # type: ignore[index]


def test_accepted_ack_match_declines_other_shapes_and_sizes() -> None:
    from a2a import accepted_ack

    data = Ack.ok(CID, "ai:b").to_wire()
    assert accepted_ack(data, "ai:c", MAX) is None                      # another recipient
    assert accepted_ack(data, "ai:b", len(data) - 1) is None            # over the size limit
    assert _full_decode(data, len(data) - 1)[0] == "too_large"  # type: ignore[index]
    assert accepted_ack(bytearray(data), "ai:b", MAX) is None           # not bytes
    assert accepted_ack(data, "ai:b\n", MAX) is None                    # not an agent id
    non_canonical = cbor2.dumps(Ack.ok(CID, "ai:b").to_map())           # keys in another order
    assert accepted_ack(non_canonical, "ai:b", MAX) is None
    assert _full_decode(non_canonical) == Ack.ok(CID, "ai:b")


@settings(max_examples=500)
@given(envelope_fields, st.sampled_from(["sender", "recipients", "payload", "expires_at"]), cbor_structures)
def test_decoding_checks_an_envelope_as_its_constructor_does(fields: dict, key: str, value: object) -> None:
    """decode_frame builds the Envelope without its constructor (the correlation_id is checked once): same
    object, same error."""
    m = Envelope(**fields).to_map()
    m[key] = value
    try:
        decoded: object = decode_frame(cbor2.dumps(m), MAX)
    except ProtocolError as e:
        decoded = (e.code, e.message, e.correlation_id)
        if e.code == "malformed":  # refused by the CBOR decoder (a non-string key): no envelope check ran
            return
    fields = {**fields, key: tuple(value) if key == "recipients" and isinstance(value, list) else value}
    try:
        built: object = Envelope(**fields)
    except ProtocolError as e:
        built = (e.code, e.message, e.correlation_id)
    if key == "recipients" and not isinstance(value, list):
        assert decoded[0] == "bad_field"  # type: ignore[index]  # the wire wants an array
        return
    assert decoded == built


def test_a_decoded_envelope_is_the_constructed_one() -> None:
    env = Envelope(CID, "ai:a", ("ai:b", "ai:c"), {"kind": "ping", "n": [1, {"x": b"y"}]}, 1000)
    back = decode_frame(env.to_wire(), MAX)
    assert back == env and back.to_wire() == env.to_wire()
    assert type(back.recipients) is tuple and type(back.payload) is dict
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.sender = "ai:x"  # type: ignore[misc]


@settings(max_examples=300)
@given(agent_ids, st.one_of(correlation_ids, st.text(max_size=40)))
def test_ack_ok_checks_as_the_constructor_does(recipient: str, cid: str) -> None:
    def outcome(make):
        try:
            ack = make()
        except ProtocolError as e:
            return (e.code, e.message, e.correlation_id)
        return (ack, ack.to_wire(), type(ack))

    assert outcome(lambda: Ack.ok(cid, recipient)) == outcome(lambda: Ack(cid, recipient, True, None))
