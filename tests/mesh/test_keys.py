"""Identity key files (mesh/keys.py, mesh/peerkeys.py): layout, modes, refusal rules, peers."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from a2a import ProtocolError
from a2a.envelope import MAX_AGENT_ID_CHARS, new_envelope
from mesh import keys, peerkeys
from mesh.errors import MeshError
from tests.needs import needs

A = "ai:node-1@lab"
B = "ai:node-2@lab"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def code_of(excinfo: pytest.ExceptionInfo[MeshError]) -> str:
    return excinfo.value.code


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


# ---------------------------------------------------------------- generate


def test_generate_writes_pkcs8_priv_0600_and_spki_pub_0644(home: Path) -> None:
    ident = keys.generate_identity(home / "keys", A)

    assert ident.priv_path == home / "keys" / f"{A}.priv"
    assert ident.pub_path == home / "keys" / f"{A}.pub"
    assert mode_of(ident.priv_path) == 0o600
    assert mode_of(ident.pub_path) == 0o644
    assert ident.priv_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert ident.pub_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    assert ident.fingerprint == keys.fingerprint(ident.public_key)
    assert len(ident.fingerprint) == 16
    # no temp files left behind
    assert sorted(p.name for p in (home / "keys").iterdir()) == [f"{A}.priv", f"{A}.pub"]


def test_modes_hold_under_a_strict_umask(home: Path) -> None:
    old = os.umask(0o077)
    try:
        ident = keys.generate_identity(home / "keys", A)
    finally:
        os.umask(old)
    assert mode_of(ident.priv_path) == 0o600
    assert mode_of(ident.pub_path) == 0o644


def test_fingerprint_is_first_16_hex_of_sha256_of_raw_key() -> None:
    import hashlib

    pk = Ed25519PrivateKey.generate().public_key()
    raw = keys.raw_public_bytes(pk)
    assert len(raw) == 32
    assert keys.fingerprint(pk) == hashlib.sha256(raw).hexdigest()[:16]


def test_generate_refuses_to_overwrite_without_force(home: Path) -> None:
    first = keys.generate_identity(home / "keys", A)
    before = first.priv_path.read_bytes()

    with pytest.raises(MeshError) as excinfo:
        keys.generate_identity(home / "keys", A)
    assert code_of(excinfo) == "identity_exists"
    assert first.priv_path.read_bytes() == before

    second = keys.generate_identity(home / "keys", A, force=True)
    assert second.fingerprint != first.fingerprint
    assert keys.load_identity(home / "keys", A).fingerprint == second.fingerprint
    assert mode_of(second.priv_path) == 0o600


def test_generate_refuses_when_only_the_pub_exists(home: Path) -> None:
    ident = keys.generate_identity(home / "keys", A)
    ident.priv_path.unlink()
    with pytest.raises(MeshError) as excinfo:
        keys.generate_identity(home / "keys", A)
    assert code_of(excinfo) == "identity_exists"


# ------------------------------------------------------------------ loading


@pytest.mark.parametrize("loose", [0o644, 0o640, 0o604, 0o660])
def test_group_or_world_readable_private_key_is_refused(home: Path, loose: int) -> None:
    ident = keys.generate_identity(home / "keys", A)
    os.chmod(ident.priv_path, loose)

    with pytest.raises(MeshError) as excinfo:
        keys.load_private_key(ident.priv_path)
    assert code_of(excinfo) == "key_file_mode"
    assert f"chmod 600 {ident.priv_path}" in excinfo.value.message

    with pytest.raises(MeshError) as excinfo:
        keys.load_identity(home / "keys")
    assert code_of(excinfo) == "key_file_mode"


def test_missing_private_key_is_key_missing(tmp_path: Path) -> None:
    with pytest.raises(MeshError) as excinfo:
        keys.load_private_key(tmp_path / "nope.priv")
    assert code_of(excinfo) == "key_missing"


def test_garbage_private_key_is_key_invalid(tmp_path: Path) -> None:
    path = tmp_path / "x.priv"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"not a key at all\n")
    os.close(fd)
    with pytest.raises(MeshError) as excinfo:
        keys.load_private_key(path)
    assert code_of(excinfo) == "key_invalid"


def test_non_ed25519_private_key_is_key_invalid(tmp_path: Path) -> None:
    path = tmp_path / "ec.priv"
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, pem)
    os.close(fd)
    with pytest.raises(MeshError) as excinfo:
        keys.load_private_key(path)
    assert code_of(excinfo) == "key_invalid"
    assert "Ed25519" in excinfo.value.message


def test_non_ed25519_public_key_is_key_invalid() -> None:
    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(MeshError) as excinfo:
        keys.public_key_from_pem(pem)
    assert code_of(excinfo) == "key_invalid"


def test_small_order_public_key_is_key_invalid() -> None:
    pem = Ed25519PublicKey.from_public_bytes(bytes([1]) + bytes(31)).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(MeshError) as excinfo:
        keys.public_key_from_pem(pem, source="peer.pub")
    assert code_of(excinfo) == "key_invalid"
    assert "small order" in excinfo.value.message


def test_load_identity_picks_the_only_identity(home: Path) -> None:
    made = keys.generate_identity(home / "keys", A)
    loaded = keys.load_identity(home / "keys")
    assert loaded.agent_id == A
    assert loaded.fingerprint == made.fingerprint
    assert keys.raw_public_bytes(loaded.public_key) == keys.raw_public_bytes(made.public_key)


def test_load_identity_with_none_or_several(home: Path) -> None:
    with pytest.raises(MeshError) as excinfo:
        keys.load_identity(home / "keys")
    assert code_of(excinfo) == "no_identity"

    keys.generate_identity(home / "keys", A)
    keys.generate_identity(home / "keys", B)
    with pytest.raises(MeshError) as excinfo:
        keys.load_identity(home / "keys")
    assert code_of(excinfo) == "ambiguous_identity"
    assert keys.load_identity(home / "keys", B).agent_id == B


def test_load_identity_refuses_a_pub_that_does_not_match_the_priv(home: Path) -> None:
    ident = keys.generate_identity(home / "keys", A)
    other = keys.generate_identity(home / "other", A)
    shutil.copyfile(other.pub_path, ident.pub_path)
    with pytest.raises(MeshError) as excinfo:
        keys.load_identity(home / "keys", A)
    assert code_of(excinfo) == "key_pair_mismatch"


# -------------------------------------------------------------- agent ids


@pytest.mark.parametrize(
    "bad",
    ["", "a/b", "a\\b", ".", "..", ".hidden", "x\n", "a\x00b", "a b", "a\tb", "x" * 129],
)
def test_bad_agent_ids_are_refused(home: Path, bad: str) -> None:
    with pytest.raises(MeshError) as excinfo:
        keys.validate_agent_id(bad)
    assert code_of(excinfo) == "bad_agent_id"
    with pytest.raises(MeshError) as excinfo:
        keys.generate_identity(home / "keys", bad)
    assert code_of(excinfo) == "bad_agent_id"
    assert not (home / "keys").exists() or not any((home / "keys").iterdir())


@pytest.mark.parametrize("good", [A, "node1", "ai:n.o-d_e+1@lab.example", "x" * 128])
def test_good_agent_ids_are_accepted(good: str) -> None:
    assert keys.validate_agent_id(good) == good


def test_the_longest_agent_id_a_key_file_takes_is_the_longest_an_envelope_carries() -> None:
    longest, over = "x" * MAX_AGENT_ID_CHARS, "x" * (MAX_AGENT_ID_CHARS + 1)
    assert keys.validate_agent_id(longest) == longest
    new_envelope(longest, (longest,), {"kind": "ping"}, now_ms=0, ttl_ms=1000)
    with pytest.raises(MeshError):
        keys.validate_agent_id(over)
    with pytest.raises(ProtocolError):
        new_envelope(over, ("ai:b",), {"kind": "ping"}, now_ms=0, ttl_ms=1000)


# ------------------------------------------------------------------- peers


def test_import_list_export_round_trip(tmp_path: Path) -> None:
    home_a = tmp_path / "a"
    home_b = tmp_path / "b"
    a = keys.generate_identity(home_a / "keys", A)
    b = keys.generate_identity(home_b / "keys", B)

    exported = keys.export_pub(home_b / "keys", B, tmp_path / "outbox")
    assert exported == tmp_path / "outbox" / f"{B}.pub"
    assert mode_of(exported) == 0o644

    peer = peerkeys.import_peer(home_a / "peers", exported)
    assert peer.agent_id == B
    assert peer.path == home_a / "peers" / f"{B}.pub"
    assert peer.fingerprint == b.fingerprint
    assert mode_of(peer.path) == 0o644

    listed = peerkeys.list_keys(home_a / "keys", home_a / "peers")
    assert [(k.agent_id, k.fingerprint, k.trust) for k in listed] == [
        (A, a.fingerprint, "self"),
        (B, b.fingerprint, "peer"),
    ]

    loaded, bad = peerkeys.load_peer_keys(home_a / "peers")
    assert bad == []
    assert list(loaded) == [B]
    assert keys.raw_public_bytes(loaded[B]) == keys.raw_public_bytes(b.public_key)


def test_import_with_explicit_agent_id(tmp_path: Path) -> None:
    b = keys.generate_identity(tmp_path / "b", B)
    odd = tmp_path / "whatever.pem"
    shutil.copyfile(b.pub_path, odd)
    peer = peerkeys.import_peer(tmp_path / "peers", odd, agent_id=B)
    assert peer.path.name == f"{B}.pub"


def test_import_same_key_twice_is_a_no_op(tmp_path: Path) -> None:
    b = keys.generate_identity(tmp_path / "b", B)
    first = peerkeys.import_peer(tmp_path / "peers", b.pub_path)
    again = peerkeys.import_peer(tmp_path / "peers", b.pub_path)
    assert (again.path, again.fingerprint) == (first.path, first.fingerprint)


def test_import_of_a_rotated_peer_key_keeps_the_old_one_in_the_keyring(tmp_path: Path) -> None:
    before = keys.generate_identity(tmp_path / "before", B)
    after = keys.generate_identity(tmp_path / "after", B)
    peers = tmp_path / "peers"
    peerkeys.import_peer(peers, before.pub_path)

    peer = peerkeys.import_peer(peers, after.pub_path)

    assert (peer.fingerprint, peer.retired_fingerprint) == (after.fingerprint, before.fingerprint)
    assert peer.retired_path == peers / "retired" / f"{B}.{before.fingerprint}.pub"
    assert mode_of(peer.retired_path) == 0o644
    assert keys.fingerprint(peerkeys.load_peer_keys(peers).keys[B]) == after.fingerprint
    ring = peerkeys.load_peer_keyrings(peers)[B]
    assert [keys.fingerprint(k) for k in ring] == [after.fingerprint, before.fingerprint]


def test_import_refuses_to_replace_an_unreadable_trusted_key_without_force(tmp_path: Path) -> None:
    b = keys.generate_identity(tmp_path / "b", B)
    peers = tmp_path / "peers"
    peers.mkdir()
    (peers / f"{B}.pub").write_bytes(b"-----BEGIN PUBLIC KEY-----\nnope\n")

    with pytest.raises(MeshError) as excinfo:
        peerkeys.import_peer(peers, b.pub_path)
    assert code_of(excinfo) == "peer_key_conflict"

    replaced = peerkeys.import_peer(peers, b.pub_path, force=True)
    assert (replaced.fingerprint, replaced.retired_fingerprint) == (b.fingerprint, None)


def test_import_refuses_garbage_and_private_keys(tmp_path: Path) -> None:
    garbage = tmp_path / f"{B}.pub"
    garbage.write_bytes(b"hello\n")
    with pytest.raises(MeshError) as excinfo:
        peerkeys.import_peer(tmp_path / "peers", garbage)
    assert code_of(excinfo) == "key_invalid"

    a = keys.generate_identity(tmp_path / "keys", A)
    with pytest.raises(MeshError) as excinfo:
        peerkeys.import_peer(tmp_path / "peers", a.priv_path, agent_id=A)
    assert code_of(excinfo) == "key_invalid"
    assert not (tmp_path / "peers").exists() or not any((tmp_path / "peers").iterdir())


def test_import_refuses_a_bad_agent_id_from_the_file_name(tmp_path: Path) -> None:
    b = keys.generate_identity(tmp_path / "b", B)
    with pytest.raises(MeshError) as excinfo:
        peerkeys.import_peer(tmp_path / "peers", b.pub_path, agent_id="../escape")
    assert code_of(excinfo) == "bad_agent_id"


def test_load_peer_keys_skips_and_reports_bad_files(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    b = keys.generate_identity(tmp_path / "b", B)
    peerkeys.import_peer(peers, b.pub_path)
    (peers / "ai:broken@lab.pub").write_bytes(b"-----BEGIN PUBLIC KEY-----\nnope\n")
    (peers / "README.txt").write_text("not a key file, ignored\n")

    loaded = peerkeys.load_peer_keys(peers)
    assert list(loaded.keys) == [B]
    assert [(bad.path.name, bad.error.code) for bad in loaded.bad] == [
        ("ai:broken@lab.pub", "key_invalid")
    ]


def test_load_peer_keys_of_a_missing_dir_is_empty(tmp_path: Path) -> None:
    assert peerkeys.load_peer_keys(tmp_path / "nope") == ({}, [])


@needs("openssl")
def test_openssl_reads_our_pub_file(home: Path) -> None:
    ident = keys.generate_identity(home / "keys", A)
    out = subprocess.run(
        ["openssl", "pkey", "-pubin", "-in", str(ident.pub_path), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "ED25519 Public-Key" in out.stdout
    # and its private key too, as PKCS#8
    out = subprocess.run(
        ["openssl", "pkey", "-in", str(ident.priv_path), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "ED25519 Private-Key" in out.stdout


def test_group_writable_peer_key_is_not_trusted(tmp_path: Path) -> None:
    ident = keys.generate_identity(tmp_path / "other", "ai:peer@lab")
    peers = tmp_path / "peers"
    peerkeys.import_peer(peers, ident.pub_path)
    assert "ai:peer@lab" in peerkeys.load_peer_keys(peers).keys
    (peers / "ai:peer@lab.pub").chmod(0o666)
    loaded = peerkeys.load_peer_keys(peers)
    assert "ai:peer@lab" not in loaded.keys and loaded.bad[0].error.code == "key_file_mode"
