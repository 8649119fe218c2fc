"""node.trust.Keyring over real key files: current key first, retired keys after, re-read on change."""

from __future__ import annotations

import os
from pathlib import Path

from mesh import keys, peerkeys
from node.config import from_dict
from node.trust import Keyring

A = "ai:node-1@lab"
B = "ai:node-2@lab"


def fps(ring: tuple) -> list[str]:
    return [keys.fingerprint(k) for k in ring]


def test_keys_for_gives_current_then_retired_and_follows_the_directories(tmp_path: Path) -> None:
    home = tmp_path / "h"
    cfg = from_dict({"agent_id": A, "home": str(home)}, env={})
    keys.generate_identity(cfg.keys_dir, A)
    own, own_old = keys.rotate_identity(cfg.keys_dir, A)
    b_before = keys.generate_identity(tmp_path / "b1", B)
    b_after = keys.generate_identity(tmp_path / "b2", B)
    peerkeys.import_peer(cfg.peers_dir, b_before.pub_path)

    ring = Keyring(cfg, own)
    assert fps(ring.keys_for(A)) == [own.fingerprint, own_old]
    assert fps(ring.keys_for(B)) == [b_before.fingerprint]

    peerkeys.import_peer(cfg.peers_dir, b_after.pub_path)  # B rotated
    assert fps(ring.keys_for(B)) == [b_after.fingerprint, b_before.fingerprint]
    assert keys.fingerprint(ring.peer_keys[B]) == b_after.fingerprint  # pinning: the current key only

    # A key copied straight into peers/retired/ (only that directory changes) is picked up too.
    older = keys.generate_identity(tmp_path / "b0", B)
    dest = cfg.peers_dir / "retired" / keys.retired_file_name(B, older.fingerprint)
    keys.write_file_atomic(dest, older.pub_path.read_bytes(), 0o644, replace=False)
    st = dest.parent.stat()  # directory times tick coarsely: make this change visible whatever the clock did
    os.utime(dest.parent, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert sorted(fps(ring.keys_for(B))[1:]) == sorted([b_before.fingerprint, older.fingerprint])
    assert ring.keys_for("ai:stranger@lab") == ()
