"""`ai-memory identity rotate / import / list` on real key files, a real mesh CA and certificates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography import x509

from mesh import ca, keys, tls
from node.cli import main

A = "ai:node-1@lab"
B = "ai:node-2@lab"


def run(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["--home", str(home), *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def node_home(tmp_path: Path) -> Path:
    home = tmp_path / "n1"
    ident = keys.generate_identity(home / "keys", A)
    ca.init_ca(home / "ca")
    ca.issue_node_cert(home / "ca", A, ident.pub_path, home / "tls" / "node.crt", extra_ips=("10.0.0.5",))
    (home / "tls" / "ca.crt").write_bytes((home / "ca" / "ca.crt").read_bytes())
    return home


def test_rotate_reissues_the_certificate_with_the_ca_in_this_home(capsys, node_home: Path) -> None:
    old = keys.load_identity(node_home / "keys", A)
    rc, out, err = run(capsys, node_home, "identity", "rotate", "--json")
    assert rc == 0, err
    d = json.loads(out)
    new = keys.load_identity(node_home / "keys", A)
    assert (d["fingerprint"], d["retired_fingerprint"]) == (new.fingerprint, old.fingerprint)
    assert d["certificate"] == str(node_home / "tls" / "node.crt") and d["certificate_error"] is None
    cert = x509.load_pem_x509_certificate((node_home / "tls" / "node.crt").read_bytes())
    assert keys.raw_public_bytes(cert.public_key()) == keys.raw_public_bytes(new.public_key)
    assert ca.extra_sans(node_home / "tls" / "node.crt") == (("10.0.0.5",), ())
    # the node's TLS material loads: certificate over the new key, issued by the CA
    tls.server_context(node_home / "tls" / "node.crt", new.priv_path, node_home / "tls" / "ca.crt")


def test_rotate_without_a_ca_prints_the_next_steps(capsys, node_home: Path, tmp_path: Path) -> None:
    (node_home / "ca").rename(tmp_path / "offline-ca")
    rc, out, err = run(capsys, node_home, "identity", "rotate")
    assert rc == 0, err
    new = keys.load_identity(node_home / "keys", A)
    assert f"new key {new.fingerprint}" in out
    assert "ai-memory mesh cert issue --ca CA_DIR" in out and "identity import" in out
    assert "peer_key_mismatch" in out


def test_rotate_with_an_unusable_ca_changes_nothing(capsys, node_home: Path, tmp_path: Path) -> None:
    old = keys.load_identity(node_home / "keys", A)
    rc, out, err = run(capsys, node_home, "identity", "rotate", "--ca", str(tmp_path / "nowhere"))
    assert rc == 1 and err.startswith("ai-memory: error [ca_missing]: ")
    assert keys.load_identity(node_home / "keys", A).fingerprint == old.fingerprint
    assert not (node_home / "keys" / "retired").exists()


def test_rotate_without_an_identity_is_a_clear_error(capsys, tmp_path: Path) -> None:
    rc, out, err = run(capsys, tmp_path / "empty", "identity", "rotate")
    assert rc == 1 and err.startswith("ai-memory: error [no_identity]: ")


def test_import_of_a_rotated_peer_says_so_and_list_shows_the_retired_key(capsys, node_home: Path,
                                                                          tmp_path: Path) -> None:
    peer_home = tmp_path / "n2"
    before = keys.generate_identity(peer_home / "keys", B)
    rc, out, err = run(capsys, node_home, "identity", "import", str(before.pub_path))
    assert rc == 0 and "previous key" not in out
    after, _ = keys.rotate_identity(peer_home / "keys", B)

    rc, out, err = run(capsys, node_home, "identity", "import", str(after.pub_path))
    assert rc == 0, err
    assert f"fingerprint {after.fingerprint}" in out
    assert f"{B} rotated: its previous key {before.fingerprint} is kept in" in out

    rc, out, err = run(capsys, node_home, "identity", "list", "--json")
    rows = {(r["agent_id"], r["fingerprint"]): r for r in json.loads(out)}
    assert rows[(B, after.fingerprint)]["retired"] is False
    assert rows[(B, before.fingerprint)]["retired"] is True
    assert rows[(B, before.fingerprint)]["path"].endswith(f"peers/retired/{B}.{before.fingerprint}.pub")
    rc, out, err = run(capsys, node_home, "identity", "list")
    assert f"{before.fingerprint}  peer  retired" in out
