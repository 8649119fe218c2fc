"""Key history bundles (mesh/keyhistory.py): what `identity export-pub --with-retired` writes, what `identity import`
accepts, and the record that tells a node it holds a peer's whole key history."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from mesh import keyhistory, keys, peerkeys
from mesh.errors import MeshError

AGENT = "ai:node-1@lab"
T0 = 1_700_000_000_000


def _rotated_twice(tmp_path: Path) -> tuple[Path, keys.Identity, list[str]]:
    """A node whose key was rotated twice (at T0 + 1000 and T0 + 2000): its keys dir, its identity now, and its
    fingerprints oldest first."""
    keys_dir = tmp_path / "n1" / "keys"
    first = keys.generate_identity(keys_dir, AGENT)
    os.utime(first.pub_path, ns=(T0 * 1_000_000, T0 * 1_000_000))  # generated at T0
    second, _ = keyhistory.rotate(keys_dir, AGENT, T0 + 1000)
    third, _ = keyhistory.rotate(keys_dir, AGENT, T0 + 2000)
    return keys_dir, third, [first.fingerprint, second.fingerprint, third.fingerprint]


def test_a_bundle_lists_the_current_key_then_the_retired_ones_each_with_when_it_was_current(tmp_path: Path) -> None:
    keys_dir, ident, fps = _rotated_twice(tmp_path)
    path = keyhistory.export_bundle(keys_dir, ident, tmp_path / "out", T0 + 5000)
    assert path.name == f"{AGENT}.keyhistory.json" and path.stat().st_mode & 0o777 == 0o644
    assert keyhistory.is_bundle(path) and not keyhistory.is_bundle(ident.pub_path)
    bundle = keyhistory.read_bundle(path)
    assert bundle.agent_id == AGENT and bundle.issued_at == T0 + 5000
    assert [p.fingerprint for p in bundle.periods] == fps[::-1]
    current, second, first = bundle.periods
    assert current.valid_until is None and current.valid_from is not None
    assert (second.valid_from, second.valid_until) == (T0 + 1000, T0 + 2000)
    assert (first.valid_from, first.valid_until) == (T0, T0 + 1000)


@pytest.mark.parametrize("change", ["validity", "extra_key", "agent", "signature"])
def test_a_bundle_changed_after_signing_is_refused(tmp_path: Path, change: str) -> None:
    keys_dir, ident, _ = _rotated_twice(tmp_path)
    path = keyhistory.export_bundle(keys_dir, ident, tmp_path / "out", T0 + 5000)
    doc = json.loads(path.read_text())
    if change == "validity":
        doc["keys"][1]["valid_until"] += 1
    elif change == "extra_key":
        other = keys.generate_identity(tmp_path / "other", "ai:other@lab")
        doc["keys"].append({"fingerprint": other.fingerprint, "valid_from": 1, "valid_until": 2,
                            "public_key": base64.b64encode(keys.raw_public_bytes(other.public_key)).decode()})
    elif change == "agent":
        doc["agent_id"] = "ai:node-9@lab"
    else:
        doc["signature"] = base64.b64encode(bytes(64)).decode()
    path.write_text(json.dumps(doc))
    with pytest.raises(MeshError) as err:
        keyhistory.read_bundle(path)
    assert err.value.code == "key_bundle_invalid" and "signature does not verify" in err.value.message


def test_a_bundle_holding_a_point_no_key_pair_has_is_refused(tmp_path: Path) -> None:
    keys_dir, ident, _ = _rotated_twice(tmp_path)
    path = keyhistory.export_bundle(keys_dir, ident, tmp_path / "out", T0 + 5000)
    doc = json.loads(path.read_text())
    doc["keys"][2]["public_key"] = base64.b64encode(bytes(32)).decode()  # the identity point: small order
    path.write_text(json.dumps(doc))
    with pytest.raises(MeshError) as err:
        keyhistory.read_bundle(path)
    assert err.value.code == "key_bundle_invalid" and "keys[2]" in err.value.message


def test_a_late_joiner_that_imports_the_bundle_holds_every_key_and_knows_it_holds_them_all(tmp_path: Path) -> None:
    keys_dir, ident, fps = _rotated_twice(tmp_path)
    bundle = keyhistory.read_bundle(keyhistory.export_bundle(keys_dir, ident, tmp_path / "out", T0 + 5000))
    peers = tmp_path / "n2" / "peers"
    peerkeys.import_peer(peers, ident.pub_path)  # the late joiner was given the current .pub only
    assert keyhistory.peer_histories(peers) == {}
    done = keyhistory.import_bundle(peers, bundle, T0 + 6000)
    assert done.kept == (fps[1], fps[0]) and done.unlisted == () and done.current.retired_fingerprint is None
    ring = [keys.fingerprint(k) for k in peerkeys.load_peer_keyrings(peers)[AGENT]]
    assert ring[0] == fps[2] and sorted(ring[1:]) == sorted(fps[:2])  # current first; retired in file-name order
    [history] = keyhistory.peer_histories(peers).values()
    assert history.complete_for(fps[2]) and not history.complete_for(fps[1])
    assert history.periods[fps[0]] == (T0, T0 + 1000)
    # Importing it again changes nothing.
    assert keyhistory.import_bundle(peers, bundle, T0 + 7000).kept == ()


def test_a_bundle_brings_the_new_key_of_a_peer_that_rotated_and_keeps_the_one_trusted_so_far(tmp_path: Path) -> None:
    keys_dir, ident, fps = _rotated_twice(tmp_path)
    bundle = keyhistory.read_bundle(keyhistory.export_bundle(keys_dir, ident, tmp_path / "out", T0 + 5000))
    peers = tmp_path / "n2" / "peers"
    old = keys.load_public_key(keys_dir / "retired" / keys.retired_file_name(AGENT, fps[1]))
    peerkeys.trust_peer_key(peers, AGENT, old)  # trusted before the second rotation
    done = keyhistory.import_bundle(peers, bundle, T0 + 6000)
    assert done.current.fingerprint == fps[2] and done.current.retired_fingerprint == fps[1]
    assert {keys.fingerprint(k) for k in peerkeys.load_peer_keyrings(peers)[AGENT]} == set(fps)


def test_a_bundle_that_does_not_list_the_key_trusted_now_needs_force(tmp_path: Path) -> None:
    keys_dir, ident, fps = _rotated_twice(tmp_path)
    bundle = keyhistory.read_bundle(keyhistory.export_bundle(keys_dir, ident, tmp_path / "out", T0 + 5000))
    peers = tmp_path / "n2" / "peers"
    stranger = keys.generate_identity(tmp_path / "stranger", AGENT)
    peerkeys.import_peer(peers, stranger.pub_path)
    with pytest.raises(MeshError) as err:
        keyhistory.import_bundle(peers, bundle, T0 + 6000)
    assert err.value.code == "key_history_conflict" and stranger.fingerprint in err.value.message
    assert peerkeys.load_peer_keyrings(peers)[AGENT] == (stranger.public_key,)  # nothing changed
    done = keyhistory.import_bundle(peers, bundle, T0 + 6000, force=True)
    assert done.unlisted == (stranger.fingerprint,) and done.current.retired_fingerprint == stranger.fingerprint


def test_a_bundle_is_imported_only_as_the_agent_it_names(tmp_path: Path) -> None:
    keys_dir, ident, _ = _rotated_twice(tmp_path)
    bundle = keyhistory.read_bundle(keyhistory.export_bundle(keys_dir, ident, tmp_path / "out", T0 + 5000))
    with pytest.raises(MeshError) as err:
        keyhistory.import_bundle(tmp_path / "peers", bundle, T0, agent_id="ai:node-2@lab")
    assert err.value.code == "key_bundle_invalid"


def test_a_history_record_writable_by_others_is_not_believed(tmp_path: Path) -> None:
    keys_dir, ident, fps = _rotated_twice(tmp_path)
    bundle = keyhistory.read_bundle(keyhistory.export_bundle(keys_dir, ident, tmp_path / "out", T0 + 5000))
    peers = tmp_path / "peers"
    keyhistory.import_bundle(peers, bundle, T0 + 6000)
    record = keyhistory.history_path(peers, AGENT)
    record.chmod(0o666)
    assert keyhistory.peer_histories(peers) == {}
    record.chmod(0o644)
    assert AGENT in keyhistory.peer_histories(peers)
