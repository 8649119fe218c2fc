"""Key rotation that keeps history: the node's and its peers' retired public keys (issue 10, item 7)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mesh import keys, peerkeys
from mesh.errors import MeshError
from node import attest

A = "ai:node-1@lab"
B = "ai:node-2@lab"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def a_link(observed_by: str) -> attest.LinkPayload:
    return attest.LinkPayload(src_id="11111111-1111-4111-8111-111111111111",
                              dst_id="22222222-2222-4222-8222-222222222222", relation="related_to",
                              observed_by=observed_by, valid_from=1_700_000_000_000, valid_until=None)


def verifies_with_some(ring: tuple, payload: attest.LinkPayload, signature: bytes) -> bool:
    return any(attest.verify(k, payload, signature) for k in ring)


def test_rotate_keeps_the_old_pub_in_the_keyring_with_the_right_modes(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    old = keys.generate_identity(keys_dir, A)

    new, retired_fp = keys.rotate_identity(keys_dir, A)

    assert retired_fp == old.fingerprint and new.fingerprint != old.fingerprint
    assert (new.priv_path, new.pub_path) == (old.priv_path, old.pub_path)
    assert mode_of(new.priv_path) == 0o600 and mode_of(new.pub_path) == 0o644
    kept = keys_dir / "retired" / f"{A}.{old.fingerprint}.pub"
    assert mode_of(kept) == 0o644 and mode_of(kept.parent) == 0o700
    # the old private key is destroyed, and no temp or backup file is left anywhere
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name]
    assert sorted(p.name for p in keys_dir.iterdir()) == [f"{A}.priv", f"{A}.pub", "retired"]
    assert keys.load_identity(keys_dir, A).fingerprint == new.fingerprint
    assert [keys.fingerprint(k) for k in keys.retired_public_keys(keys_dir, A)] == [old.fingerprint]


def test_rotating_twice_keeps_both_old_keys(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    first = keys.generate_identity(keys_dir, A)
    second, _ = keys.rotate_identity(keys_dir, A)
    third, retired = keys.rotate_identity(keys_dir, A)

    assert retired == second.fingerprint
    assert sorted(keys.fingerprint(k) for k in keys.retired_public_keys(keys_dir, A)) == \
        sorted([first.fingerprint, second.fingerprint])
    listed = [(k.fingerprint, k.trust, k.retired) for k in peerkeys.list_keys(keys_dir, tmp_path / "peers")]
    assert listed[0] == (third.fingerprint, "self", False)
    assert sorted(listed[1:]) == sorted([(first.fingerprint, "self", True), (second.fingerprint, "self", True)])


def test_rotate_without_an_identity_is_no_identity(tmp_path: Path) -> None:
    with pytest.raises(MeshError) as excinfo:
        keys.rotate_identity(tmp_path / "keys", A)
    assert excinfo.value.code == "no_identity"


@pytest.mark.parametrize("failing_write", ["priv", "pub", "keyring", "backup"])
def test_a_failed_rotation_puts_the_old_pair_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  failing_write: str) -> None:
    keys_dir = tmp_path / "keys"
    old = keys.generate_identity(keys_dir, A)
    real_write = keys.write_file_atomic
    calls = {"n": 0}

    names = {"priv": f"{A}.priv", "pub": f"{A}.pub", "keyring": f"{A}.{old.fingerprint}.pub",
             "backup": f"{A}.{old.fingerprint}.priv"}

    def disk_full_once(path: Path, data: bytes, mode: int, *, replace: bool) -> None:
        # The first write to that path during the rotation fails, as on a full disk.
        if Path(path).name == names[failing_write] and calls["n"] == 0:
            calls["n"] += 1
            raise OSError(28, "No space left on device")
        real_write(path, data, mode, replace=replace)

    monkeypatch.setattr(keys, "write_file_atomic", disk_full_once)
    with pytest.raises(OSError):
        keys.rotate_identity(keys_dir, A)
    monkeypatch.undo()

    assert keys.load_identity(keys_dir, A).fingerprint == old.fingerprint
    assert keys.load_public_key(old.pub_path) is not None
    assert keys.retired_public_keys(keys_dir, A) == ()
    assert list((keys_dir / "retired").iterdir()) == []


def test_an_interrupted_rotation_leaves_a_loadable_identity_and_is_cleaned_up(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    old = keys.generate_identity(keys_dir, A)
    # The state a crash after "old .pub removed, new .priv in place" leaves behind.
    retired = keys_dir / "retired"
    retired.mkdir(mode=0o700)
    keys.write_file_atomic(retired / f"{A}.{old.fingerprint}.pub", keys.public_pem(old.public_key), 0o644,
                           replace=False)
    backup = retired / f"{A}.{old.fingerprint}.priv"
    keys.write_file_atomic(backup, keys.private_pem(old.private_key), 0o600, replace=False)
    old.pub_path.unlink()
    keys.write_file_atomic(old.priv_path, keys.private_pem(keys.Ed25519PrivateKey.generate()), 0o600, replace=True)

    current = keys.load_identity(keys_dir, A)  # a lone .priv loads, its .pub derived
    assert current.fingerprint != old.fingerprint
    assert [keys.fingerprint(k) for k in keys.retired_public_keys(keys_dir, A)] == [old.fingerprint]

    newer, retired_fp = keys.rotate_identity(keys_dir, A)
    assert retired_fp == current.fingerprint and not backup.exists()
    assert sorted(keys.fingerprint(k) for k in keys.retired_public_keys(keys_dir, A)) == \
        sorted([old.fingerprint, current.fingerprint])


def test_a_link_signed_before_rotation_still_verifies_with_the_keyring(tmp_path: Path) -> None:
    b_keys = tmp_path / "b" / "keys"
    peers = tmp_path / "a" / "peers"
    before = keys.generate_identity(b_keys, B)
    peerkeys.import_peer(peers, before.pub_path)
    old_link = a_link(B)
    old_sig = attest.sign(before.private_key, old_link)

    after, _ = keys.rotate_identity(b_keys, B)
    peerkeys.import_peer(peers, after.pub_path)
    new_link = a_link(B)
    new_sig = attest.sign(after.private_key, new_link)

    ring = peerkeys.load_peer_keyrings(peers)[B]
    assert keys.fingerprint(ring[0]) == after.fingerprint  # the current key first
    assert verifies_with_some(ring, old_link, old_sig)
    assert verifies_with_some(ring, new_link, new_sig)
    # the current key alone (what load_peer_keys gives, and what TLS pins) no longer verifies the old link
    assert not attest.verify(peerkeys.load_peer_keys(peers).keys[B], old_link, old_sig)
    # and the rotated node itself verifies its own old link with its retired keys
    assert verifies_with_some(keys.retired_public_keys(b_keys, B), old_link, old_sig)
    # a forgery by a stranger verifies with no key of the ring
    stranger = keys.Ed25519PrivateKey.generate()
    assert not verifies_with_some(ring, old_link, attest.sign(stranger, old_link))


def test_a_mode_loosened_keyring_file_is_not_trusted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    peers = tmp_path / "peers"
    before = keys.generate_identity(tmp_path / "before", B)
    after = keys.generate_identity(tmp_path / "after", B)
    peerkeys.import_peer(peers, before.pub_path)
    retired = peerkeys.import_peer(peers, after.pub_path).retired_path
    assert retired is not None

    os.chmod(retired, 0o666)
    with caplog.at_level("WARNING", logger="mesh.keys"):
        ring = peerkeys.load_peer_keyrings(peers)[B]
    assert [keys.fingerprint(k) for k in ring] == [after.fingerprint]
    assert any("writable by group or others" in r.getMessage() and str(retired) in r.getMessage()
               for r in caplog.records)

    os.chmod(retired, 0o644)
    os.chmod(retired.parent, 0o777)
    assert [keys.fingerprint(k) for k in peerkeys.load_peer_keyrings(peers)[B]] == [after.fingerprint]
    os.chmod(retired.parent, 0o755)
    assert len(peerkeys.load_peer_keyrings(peers)[B]) == 2


def test_own_keyring_file_writable_by_others_is_not_trusted(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    keys.generate_identity(keys_dir, A)
    keys.rotate_identity(keys_dir, A)
    (kept,) = (keys_dir / "retired").iterdir()
    os.chmod(kept, 0o646)
    assert keys.retired_public_keys(keys_dir, A) == ()


def test_keyring_files_that_lie_or_are_misnamed_are_skipped(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    b = keys.generate_identity(tmp_path / "b", B)
    other = keys.generate_identity(tmp_path / "other", B)
    peerkeys.import_peer(peers, b.pub_path)
    retired = peers / "retired"
    retired.mkdir()
    # a name that claims another fingerprint than the key it holds
    (retired / f"{B}.{b.fingerprint}.pub").write_bytes(other.pub_path.read_bytes())
    (retired / f"{B}.pub").write_bytes(other.pub_path.read_bytes())  # no fingerprint in the name
    (retired / f"{B}.NOTHEX0123456789.pub").write_bytes(other.pub_path.read_bytes())
    assert [keys.fingerprint(k) for k in peerkeys.load_peer_keyrings(peers)[B]] == [b.fingerprint]


def test_retired_keys_of_a_peer_without_a_current_pub_are_not_trusted(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    before = keys.generate_identity(tmp_path / "before", B)
    after = keys.generate_identity(tmp_path / "after", B)
    peerkeys.import_peer(peers, before.pub_path)
    peerkeys.import_peer(peers, after.pub_path)
    (peers / f"{B}.pub").unlink()
    assert peerkeys.load_peer_keyrings(peers) == {}
    assert peerkeys.load_peer_keys(peers).keys == {}


def test_importing_a_retired_key_again_makes_it_current_only(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    before = keys.generate_identity(tmp_path / "before", B)
    after = keys.generate_identity(tmp_path / "after", B)
    peerkeys.import_peer(peers, before.pub_path)
    peerkeys.import_peer(peers, after.pub_path)
    back = peerkeys.import_peer(peers, before.pub_path)
    assert back.retired_fingerprint == after.fingerprint
    assert [keys.fingerprint(k) for k in peerkeys.load_peer_keyrings(peers)[B]] == [before.fingerprint,
                                                                                after.fingerprint]
    assert sorted(p.name for p in (peers / "retired").iterdir()) == [f"{B}.{after.fingerprint}.pub"]


def test_keyring_stamp_changes_when_a_retired_key_is_added(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    b = keys.generate_identity(tmp_path / "b", B)
    peerkeys.import_peer(peers, b.pub_path)
    (peers / "retired").mkdir()
    stamp = peerkeys.keyring_stamp(peers)
    other = keys.generate_identity(tmp_path / "other", B)
    (peers / "retired" / f"{B}.{other.fingerprint}.pub").write_bytes(other.pub_path.read_bytes())
    os.utime(peers / "retired", ns=(1, 1))  # a coarse clock must not hide the change: force a different mtime
    assert peerkeys.keyring_stamp(peers) != stamp
    assert len(peerkeys.load_peer_keyrings(peers)[B]) == 2
