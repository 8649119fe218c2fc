"""The normative link-signing vectors, loaded as they are, reproduced byte for byte."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key

from node.attest import SIGNED_SET_SHARED, AttestError, LinkPayload, MemoryPayload, TranscriptPayload, sign, verify

# A copy of the normative shared/vectors/link-signing.json, so a clone alone runs these tests;
# test_vectors_are_the_normative_copy guards the copy wherever shared/ sits beside the repository.
VECTORS_FILE = Path(__file__).resolve().parent / "vectors" / "link-signing.json"
NORMATIVE_FILE = Path(__file__).resolve().parents[3] / "shared" / "vectors" / "link-signing.json"
VECTORS = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))
SEED = bytes.fromhex(VECTORS["signer"]["ed25519_private_seed_hex"])
CASES = VECTORS["cases"]


def _ids(case: dict) -> str:
    return case["name"]


@pytest.mark.skipif(not NORMATIVE_FILE.exists(), reason=f"no normative vectors beside the repo ({NORMATIVE_FILE})")
def test_vectors_are_the_normative_copy() -> None:
    assert VECTORS_FILE.read_bytes() == NORMATIVE_FILE.read_bytes()


def test_signer_public_key_matches_the_vector_pem() -> None:
    pk = Ed25519PrivateKey.from_private_bytes(SEED).public_key()
    raw = pk.public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert raw.hex() == VECTORS["signer"]["ed25519_public_hex"]
    pem_key = load_pem_public_key(VECTORS["signer"]["public_pem"].encode())
    assert pem_key.public_bytes(Encoding.Raw, PublicFormat.Raw) == raw


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_canonical_cbor_matches_vector(case: dict) -> None:
    assert LinkPayload.from_mapping(case["link"]).canonical_bytes().hex() == case["canonical_cbor_hex"]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_link_id_matches_vector(case: dict) -> None:
    assert LinkPayload.from_mapping(case["link"]).link_id == case["link_id_sha256_hex"]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_signature_matches_vector_and_verifies(case: dict) -> None:
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    payload = LinkPayload.from_mapping(case["link"])
    sig = sign(key, payload)
    assert sig.hex() == case["ed25519_signature_hex"]
    assert verify(key.public_key(), payload, sig)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_tampered_field_fails_verification(case: dict) -> None:
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    sig = bytes.fromhex(case["ed25519_signature_hex"])
    tampered = LinkPayload.from_mapping({**case["link"], "relation": case["link"]["relation"] + "x"})
    assert not verify(key.public_key(), tampered, sig)


def test_signature_by_another_key_fails_verification() -> None:
    payload = LinkPayload.from_mapping(CASES[0]["link"])
    forged = sign(Ed25519PrivateKey.generate(), payload)
    assert not verify(Ed25519PrivateKey.from_private_bytes(SEED).public_key(), payload, forged)


@pytest.mark.parametrize("sig", [None, b"", b"\x00" * 63, "not bytes"])
def test_malformed_signature_is_not_valid(sig: object) -> None:
    pk = Ed25519PrivateKey.from_private_bytes(SEED).public_key()
    assert not verify(pk, LinkPayload.from_mapping(CASES[0]["link"]), sig)  # type: ignore[arg-type]


@pytest.mark.parametrize("field,value", [
    ("valid_from", True), ("valid_from", -1), ("valid_from", 1.5), ("valid_until", "soon"),
    ("src_id", ""), ("relation", 3),
])
def test_bad_link_field_is_refused(field: str, value: object) -> None:
    with pytest.raises(AttestError) as err:
        LinkPayload.from_mapping({**CASES[1]["link"], field: value})
    assert err.value.code == "bad_link_field"


MEMORY_VECTORS = json.loads((Path(__file__).parent / "vectors" / "memory-version.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", MEMORY_VECTORS["cases"], ids=_ids)
def test_memory_version_payload_signature_and_hash_match_vector(case: dict) -> None:
    payload = MemoryPayload.from_mapping(case["memory"])
    data = payload.canonical_bytes()
    assert data.hex() == case["canonical_cbor_hex"]
    # A canonical map of 14 entries whose first key, by encoded bytes, is "id".
    assert data[:4] == bytes([0xAE, 0x62]) + b"id"
    assert payload.version_hash == case["version_hash_sha256_hex"]
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    assert sign(key, payload).hex() == case["signature_hex"]  # Ed25519 is deterministic
    assert verify(key.public_key(), payload, bytes.fromhex(case["signature_hex"]))


def test_memory_signature_never_verifies_as_a_link_or_for_a_changed_field() -> None:
    case = MEMORY_VECTORS["cases"][0]
    sig = bytes.fromhex(case["signature_hex"])
    pk = Ed25519PrivateKey.from_private_bytes(SEED).public_key()
    for field, value in (("content", "changed"), ("writer", "ai:node-2@lab"), ("version", 2), ("namespace", "x")):
        assert not verify(pk, MemoryPayload.from_mapping({**case["memory"], field: value}), sig)


TRANSCRIPT_VECTORS = json.loads((Path(__file__).parent / "vectors" / "transcript-signing.json")
                                .read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", TRANSCRIPT_VECTORS["cases"], ids=_ids)
def test_transcript_payload_signature_and_hash_match_vector(case: dict) -> None:
    payload = TranscriptPayload.from_mapping(case["transcript"])
    assert payload.content_hash == hashlib.sha256(case["text"].encode("utf-8")).hexdigest()
    assert payload.raw_bytes == len(case["text"].encode("utf-8"))
    assert payload.canonical_bytes().hex() == case["canonical_cbor_hex"]
    assert payload.record_hash == case["record_hash_sha256_hex"]
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    assert sign(key, payload).hex() == case["signature_hex"]
    assert verify(key.public_key(), payload, bytes.fromhex(case["signature_hex"]))


def test_transcript_signature_never_verifies_for_a_changed_field_or_span() -> None:
    case = TRANSCRIPT_VECTORS["cases"][0]
    sig = bytes.fromhex(case["signature_hex"])
    pk = Ed25519PrivateKey.from_private_bytes(SEED).public_key()
    t = case["transcript"]
    for field, value in (("namespace", "default"), ("content_hash", "0" * 64), ("agent", "ai:node-2@lab"),
                         ("spans", [[t["spans"][0][0], 6, 24], t["spans"][1]])):
        assert not verify(pk, TranscriptPayload.from_mapping({**t, field: value}), sig)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_canonical_bytes_encoded_once_follow_every_field(case: dict) -> None:
    """The canonical bytes are kept with the payload: a payload built with one field changed (``replace`` or
    anew) has its own, so a tampered copy never verifies on the original's bytes."""
    payload = LinkPayload.from_mapping(case["link"])
    assert payload.to_dict() == {f: case["link"][f] for f in payload.to_dict()}
    changed = dataclasses.replace(payload, relation=payload.relation + "x")
    assert changed.canonical_bytes() == LinkPayload.from_mapping(changed.to_dict()).canonical_bytes()
    assert changed.canonical_bytes() != payload.canonical_bytes() and changed.link_id != payload.link_id
    assert changed == LinkPayload.from_mapping({**case["link"], "relation": payload.relation + "x"})
    sig = bytes.fromhex(case["ed25519_signature_hex"])
    assert not verify(Ed25519PrivateKey.from_private_bytes(SEED).public_key(), changed, sig)


MEMORY_V2_VECTORS = json.loads((Path(__file__).parent / "vectors" / "memory-version-v2.json")
                               .read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", MEMORY_V2_VECTORS["cases"], ids=_ids)
def test_memory_version_set_2_payload_signature_and_hash_match_vector(case: dict) -> None:
    payload = MemoryPayload.from_mapping(case["memory"], SIGNED_SET_SHARED)
    data = payload.canonical_bytes()
    assert data.hex() == case["canonical_cbor_hex"]
    # A canonical map of 15 entries: the 13 fields, the type and share_with, stated even when null.
    assert data[:4] == bytes([0xAF, 0x62]) + b"id" and b"\x6ashare_with" in data
    assert payload.version_hash == case["version_hash_sha256_hex"]
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    assert sign(key, payload).hex() == case["signature_hex"]
    assert verify(key.public_key(), payload, bytes.fromhex(case["signature_hex"]))


def test_a_set_2_signature_never_verifies_with_its_list_stripped_changed_or_as_set_1() -> None:
    pk = Ed25519PrivateKey.from_private_bytes(SEED).public_key()
    case = MEMORY_V2_VECTORS["cases"][1]
    m, sig = case["memory"], bytes.fromhex(case["signature_hex"])
    for share_with in (None, m["share_with"][:1], sorted([*m["share_with"], "ai:relay@lab"])):
        assert not verify(pk, MemoryPayload.from_mapping({**m, "share_with": share_with}, SIGNED_SET_SHARED), sig)
    assert not verify(pk, MemoryPayload.from_mapping(m), sig)  # the old field set: the list dropped
    # Nor does a set-1 signature verify as set 2 with a null list (the type entry differs).
    old = MEMORY_VECTORS["cases"][0]
    v2 = MemoryPayload.from_mapping({**old["memory"], "share_with": None}, SIGNED_SET_SHARED)
    assert not verify(pk, v2, bytes.fromhex(old["signature_hex"]))


@pytest.mark.parametrize("share_with", [[], ["b", "a"], ["a", "a"], [""], "a", [1]])
def test_a_list_not_in_its_one_canonical_form_is_not_signed(share_with: object) -> None:
    m = {**MEMORY_V2_VECTORS["cases"][0]["memory"], "share_with": share_with}
    with pytest.raises(AttestError) as err:
        MemoryPayload.from_mapping(m, SIGNED_SET_SHARED)
    assert err.value.code == "bad_memory_field"
    with pytest.raises(AttestError):
        MemoryPayload.from_mapping({k: v for k, v in m.items() if k != "share_with"}, SIGNED_SET_SHARED)
