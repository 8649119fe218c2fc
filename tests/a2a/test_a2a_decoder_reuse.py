"""The CBOR decoder each thread keeps and points at every frame must answer exactly as a fresh decoder per
frame (the code before it) does: the same value, or the same ``malformed`` error, whatever came before."""

from __future__ import annotations

import io
import threading

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from a2a import ProtocolError, new_envelope
from a2a.envelope import _loads_one, _new_decoder, _short

NOW = 1_000_000
GOOD = [new_envelope("ai:a@lab", [f"ai:b{i}@lab" for i in range(n)], {"kind": "ping", "sent_at": NOW}, NOW,
                     60_000).to_wire() for n in (1, 3, 9)]


def fresh(data: bytes) -> object:
    """A fresh decoder per frame: what ``_loads_one`` did before it kept one per thread."""
    fp = io.BytesIO(data)
    try:
        obj = _new_decoder(fp).decode()
        trailing = len(data) - fp.tell()
    except Exception as exc:
        return ("malformed", f"frame is not valid CBOR: {_short(str(exc))}"[:120])
    return ("trailing", trailing) if trailing else ("ok", obj)


def kept(data: bytes) -> object:
    try:
        return ("ok", _loads_one(data))
    except ProtocolError as e:
        assert e.code == "malformed"
        if "trailing bytes" in e.message:
            return ("trailing", int(e.message.split()[2]))
        return ("malformed", e.message[:120])


def mutations(frame: bytes) -> st.SearchStrategy[bytes]:
    at = st.integers(0, len(frame) - 1)
    return st.one_of(
        st.just(frame),
        st.builds(lambda i, b: frame[:i] + bytes([b]) + frame[i + 1:], at, st.integers(0, 255)),
        st.builds(lambda i: frame[:i], at),  # cut
        st.builds(lambda i, b: frame[:i] + bytes([b]) + frame[i:], at, st.integers(0, 255)),  # insert
        st.builds(lambda tail: frame + tail, st.binary(min_size=1, max_size=8)),  # trailing bytes
        st.builds(lambda tag: cbor2.dumps(cbor2.CBORTag(tag, 1)), st.integers(0, 2**16)),  # tags are refused
        st.binary(max_size=64),
    )


frames = st.sampled_from(GOOD).flatmap(mutations)


@settings(max_examples=400, deadline=None)
@given(st.lists(frames, min_size=1, max_size=8))
def test_the_kept_decoder_answers_every_frame_as_a_fresh_one_does(sequence: list[bytes]) -> None:
    for data in sequence:  # in sequence: a bad frame must leave nothing behind for the next one
        assert kept(data) == fresh(data)


def test_deep_nesting_and_indefinite_items_stay_refused_after_good_frames() -> None:
    deep = b"\x81" * 64 + b"\x00"
    indefinite = b"\x9f\x01\xff"
    duplicate_keys = b"\xa2\x61a\x01\x61a\x02"
    for data in (GOOD[0], deep, GOOD[1], indefinite, GOOD[2], duplicate_keys, GOOD[0]):
        assert kept(data) == fresh(data)
    assert kept(deep)[0] == kept(indefinite)[0] == kept(duplicate_keys)[0] == "malformed"


def test_each_thread_decodes_with_its_own_decoder() -> None:
    wrong: list[object] = []

    def worker(frame: bytes) -> None:
        expected = fresh(frame)
        for _ in range(2000):
            if kept(frame) != expected:
                wrong.append(frame)
                return

    threads = [threading.Thread(target=worker, args=(f,)) for f in (*GOOD, b"\xa1\x61a")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not wrong
