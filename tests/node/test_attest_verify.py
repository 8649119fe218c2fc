"""attest.verify (libsodium) against OpenSSL's Ed25519 check (cryptography): the same answer for every
signature an Ed25519 key can make or a sender can corrupt, and a refusal where OpenSSL would accept a
signature under a small-order key."""

import os

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.bindings import crypto_core_ed25519_scalar_reduce, crypto_scalarmult_ed25519_base_noclamp

from node.attest import LinkPayload, sign, verify, verify_many

KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()


def openssl_says(public_key: Ed25519PublicKey, payload: LinkPayload, signature: bytes) -> bool:
    try:
        public_key.verify(signature, payload.canonical_bytes())
    except InvalidSignature:
        return False
    return True


def link(relation: str, valid_from: int) -> LinkPayload:
    return LinkPayload("mem_a", "mem_b", relation, "ai:signer@host", valid_from, None)


payloads = st.builds(link, st.text(min_size=1, max_size=40), st.integers(0, 2**62))


@settings(max_examples=200, deadline=None)
@given(payloads, st.integers(0, 64 * 8 - 1))
def test_agrees_with_openssl_on_made_and_corrupted_signatures(payload: LinkPayload, bit: int) -> None:
    good = sign(KEY, payload)
    flipped = bytearray(good)
    flipped[bit // 8] ^= 1 << (bit % 8)
    for key, sig in ((KEY.public_key(), good), (KEY.public_key(), bytes(flipped)), (OTHER.public_key(), good)):
        assert verify(key, payload, sig) == openssl_says(key, payload, sig)
    assert verify(KEY.public_key(), payload, good)
    assert not verify(KEY.public_key(), payload, bytes(flipped))


def test_another_payload_does_not_verify() -> None:
    sig = sign(KEY, link("related_to", 1))
    assert not verify(KEY.public_key(), link("related_to", 2), sig)
    assert verify_many([((OTHER.public_key(), KEY.public_key()), link("related_to", 1), sig),
                        ((OTHER.public_key(),), link("related_to", 1), sig)]) == [True, False]


def test_wrong_length_or_no_signature_is_false() -> None:
    sig = sign(KEY, link("x", 1))
    for bad in (None, b"", sig[:63], sig + b"\0", "not bytes"):
        assert not verify(KEY.public_key(), link("x", 1), bad)  # type: ignore[arg-type]


def test_a_small_order_key_verifies_nothing_where_openssl_verifies_anything() -> None:
    # The identity point as a public key: [S]B = R + [k]A holds for R = [S]B and any message, so OpenSSL
    # takes (R, S) as a signature of everything; libsodium refuses small-order keys.
    identity = Ed25519PublicKey.from_public_bytes(bytes([1]) + bytes(31))
    s = crypto_core_ed25519_scalar_reduce(os.urandom(64))
    forged = crypto_scalarmult_ed25519_base_noclamp(s) + s
    payload = link("related_to", 1)
    assert openssl_says(identity, payload, forged)
    assert not verify(identity, payload, forged)
