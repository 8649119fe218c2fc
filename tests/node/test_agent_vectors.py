"""The agent delegation vector (tests/node/vectors/agent-delegation.json), reproduced byte for byte: the bytes as
docs/protocol.md states them (built here with cbor2, not the product's helper) and as node.attest makes them."""

import hashlib
import json
from pathlib import Path

import cbor2
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from node.attest import SIGNED_SET_SHARED, DelegationPayload, MemoryPayload, RevocationPayload, sign, verify

HERE = Path(__file__).resolve().parent / "vectors"
VECTOR = json.loads((HERE / "agent-delegation.json").read_text(encoding="utf-8"))
LINK = json.loads((HERE / "link-signing.json").read_text(encoding="utf-8"))
ISSUER = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(LINK["signer"]["ed25519_private_seed_hex"]))
AGENT = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(VECTOR["agent_seed_hex"]))


def test_the_agent_key_is_the_seeds() -> None:
    assert AGENT.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex() == VECTOR["agent_public_hex"]


def test_delegation_bytes_id_and_issuer_signature_match_the_vector() -> None:
    case = VECTOR["delegation"]
    record = {**case["record"], "agent_key": bytes.fromhex(case["record"]["agent_key"])}
    as_documented = cbor2.dumps({"type": "agent.delegation", **record}, canonical=True)
    assert as_documented.hex() == case["canonical_cbor_hex"]
    assert hashlib.sha256(as_documented).hexdigest() == case["delegation_id"]
    payload = DelegationPayload.from_mapping(record)
    assert payload.canonical_bytes() == as_documented and payload.delegation_id == case["delegation_id"]
    assert sign(ISSUER, payload).hex() == case["signature_hex"]
    assert record["agent_key"].hex() == VECTOR["agent_public_hex"]
    # The agent's own key signing its delegation vouches for nothing: only the issuer's verifies.
    assert not verify(AGENT.public_key(), payload, bytes.fromhex(case["signature_hex"]))


def test_revocation_bytes_id_and_signature_match_the_vector() -> None:
    case = VECTOR["revocation"]
    as_documented = cbor2.dumps({"type": "agent.revocation", **case["record"]}, canonical=True)
    assert as_documented.hex() == case["canonical_cbor_hex"]
    assert hashlib.sha256(as_documented).hexdigest() == case["revocation_id"]
    assert case["record"]["delegation_id"] == VECTOR["delegation"]["delegation_id"]
    payload = RevocationPayload.from_mapping(case["record"])
    assert sign(ISSUER, payload).hex() == case["signature_hex"]


def test_an_agents_memory_version_is_set_2_signed_by_the_agent_key() -> None:
    case = VECTOR["agent_memory"]
    m = case["memory"]
    assert m["writer"] == m["origin"] == VECTOR["delegation"]["record"]["agent_id"]
    payload = MemoryPayload.from_mapping(m, SIGNED_SET_SHARED)
    assert payload.canonical_bytes().hex() == case["canonical_cbor_hex"]
    assert payload.version_hash == case["version_hash_sha256_hex"]
    assert sign(AGENT, payload).hex() == case["signature_hex"]
    assert not verify(ISSUER.public_key(), payload, bytes.fromhex(case["signature_hex"]))
    # Signed inside the delegation's window and before its revocation: it verifies as of its time.
    d, r = VECTOR["delegation"]["record"], VECTOR["revocation"]["record"]
    assert d["valid_from"] <= m["updated_at"] < min(d["valid_until"], r["revoked_at"])
