"""Mesh CA, node certificates and mutual TLS over real loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import ssl
import stat
import subprocess
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mesh import ca, keys, tls
from mesh.errors import MeshError
from tests.needs import needs

# A guard against hangs only; nothing asserts on elapsed time.
HANG_GUARD_S = 10

NODE_A = "ai:node-1@lab"
NODE_B = "ai:node-2@lab"


@dataclass(frozen=True)
class Node:
    """One node's identity and certificate, as files on disk."""

    identity: keys.Identity
    cert: Path
    ca_cert: Path

    @property
    def agent_id(self) -> str:
        return self.identity.agent_id

    @property
    def key(self) -> Path:
        return self.identity.priv_path


class Pki:
    """A mesh CA under ``root`` that can mint node identities and certs."""

    def __init__(self, root: Path, name: str = "test mesh CA") -> None:
        self.root = root
        self.ca = ca.init_ca(root / "ca", name=name)

    def node(self, agent_id: str, *, home: str | None = None, **cert_kw: object) -> Node:
        """A fresh identity for ``agent_id`` in its own home, with a cert."""
        home_dir = self.root / (home or agent_id.replace(":", "_").replace("@", "_"))
        identity = keys.generate_identity(home_dir / "keys", agent_id)
        cert = self.issue(agent_id, identity.pub_path, home_dir / "tls" / "node.crt", **cert_kw)
        return Node(identity, cert, self.ca.cert)

    def issue(self, agent_id: str, pub_path: Path, out: Path, **cert_kw: object) -> Path:
        return ca.issue_node_cert(self.ca.dir, agent_id, pub_path, out, **cert_kw)  # type: ignore[arg-type]


def load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def der_of(path: Path) -> bytes:
    return load_cert(path).public_bytes(Encoding.DER)


def server_ctx(node: Node, ca_cert: Path | None = None) -> ssl.SSLContext:
    return tls.server_context(node.cert, node.key, ca_cert or node.ca_cert)


def client_ctx(node: Node, ca_cert: Path | None = None) -> ssl.SSLContext:
    return tls.client_context(node.cert, node.key, ca_cert or node.ca_cert)


class EchoIdentityServer:
    """TLS server that runs verify_peer on each connection and answers one line."""

    def __init__(self, ctx: ssl.SSLContext, pinned: Mapping[str, Ed25519PublicKey]) -> None:
        self.ctx = ctx
        self.pinned = pinned
        self.outcomes: list[str] = []  # agent_id, or "refused:<code>", per accepted connection
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            agent_id = tls.verify_peer(
                writer.get_extra_info("ssl_object"), expected_agent_id=None, pinned=self.pinned
            )
        except MeshError as exc:
            self.outcomes.append(f"refused:{exc.code}")
            writer.write(f"refused:{exc.code}\n".encode())
        else:
            self.outcomes.append(agent_id)
            writer.write(f"hello {agent_id}\n".encode())
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.drain()
            writer.close()
            await writer.wait_closed()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[EchoIdentityServer]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ctx)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self


async def talk(port: int, ctx: ssl.SSLContext) -> tuple[ssl.SSLObject, bytes]:
    """Connect, read the server's one line; returns the client's SSLObject and the line."""
    async with asyncio.timeout(HANG_GUARD_S):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        try:
            line = await reader.readline()
            return writer.get_extra_info("ssl_object"), line
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()


async def talk_fails(port: int, ctx: ssl.SSLContext) -> BaseException | None:
    """The error the client sees, or None if it got a server reply (i.e. no failure)."""
    try:
        _, line = await talk(port, ctx)
    except (ssl.SSLError, OSError, asyncio.IncompleteReadError) as exc:
        return exc
    if line == b"":
        return ConnectionError("server closed without a reply")
    return None


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "mesh")


@pytest.fixture
def node_a(pki: Pki) -> Node:
    return pki.node(NODE_A)


@pytest.fixture
def node_b(pki: Pki) -> Node:
    return pki.node(NODE_B)


def pins(*nodes: Node) -> dict[str, Ed25519PublicKey]:
    return {n.agent_id: n.identity.public_key for n in nodes}


# ------------------------------------------------------------------------ CA


def test_init_ca_writes_a_self_signed_ca_with_right_modes(pki: Pki) -> None:
    assert stat.S_IMODE(os.stat(pki.ca.key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pki.ca.cert).st_mode) == 0o644
    cert = load_cert(pki.ca.cert)
    assert cert.issuer == cert.subject
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True
    assert isinstance(cert.public_key(), Ed25519PublicKey)
    assert isinstance(keys.load_private_key(pki.ca.key), Ed25519PrivateKey)


def test_init_ca_refuses_to_overwrite(pki: Pki) -> None:
    before = pki.ca.cert.read_bytes()
    with pytest.raises(MeshError) as excinfo:
        ca.init_ca(pki.ca.dir)
    assert excinfo.value.code == "ca_exists"
    assert pki.ca.cert.read_bytes() == before
    ca.init_ca(pki.ca.dir, force=True)
    assert pki.ca.cert.read_bytes() != before


def test_node_cert_is_over_the_identity_key_and_names_the_agent(pki: Pki, node_a: Node) -> None:
    cert = load_cert(node_a.cert)
    assert keys.raw_public_bytes(cert.public_key()) == keys.raw_public_bytes(  # type: ignore[arg-type]
        node_a.identity.public_key
    )
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == NODE_A
    assert cert.issuer == load_cert(pki.ca.cert).subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"urn:ai-memory:agent:{NODE_A}"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    cert.verify_directly_issued_by(load_cert(pki.ca.cert))
    assert tls.agent_id_from_cert(der_of(node_a.cert)) == NODE_A


def test_extra_sans_are_added(pki: Pki) -> None:
    node = pki.node("ai:node-9@lab", extra_ips=("10.0.0.9", "::1"), extra_dns=("node9.mesh",))
    san = load_cert(node.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "node9.mesh"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "10.0.0.9", "::1"]


def test_bad_extra_ip_is_refused(pki: Pki, node_a: Node, tmp_path: Path) -> None:
    with pytest.raises(MeshError) as excinfo:
        pki.issue(NODE_A, node_a.identity.pub_path, tmp_path / "x.crt", extra_ips=("not-an-ip",))
    assert excinfo.value.code == "bad_san"


def test_issuing_without_a_ca_says_so(tmp_path: Path, node_a: Node) -> None:
    with pytest.raises(MeshError) as excinfo:
        ca.issue_node_cert(tmp_path / "no-ca", NODE_A, node_a.identity.pub_path, tmp_path / "x.crt")
    assert excinfo.value.code == "ca_missing"


@needs("openssl")
def test_openssl_verifies_the_node_cert_against_the_ca(pki: Pki, node_a: Node) -> None:
    out = subprocess.run(
        ["openssl", "verify", "-CAfile", str(pki.ca.cert), "-purpose", "sslclient", str(node_a.cert)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------ contexts


def test_contexts_are_tls13_only_and_require_peer_certs(node_a: Node) -> None:
    for ctx in (server_ctx(node_a), client_ctx(node_a)):
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
        assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert client_ctx(node_a).check_hostname is False


def test_context_refuses_a_loose_key_file(node_a: Node) -> None:
    os.chmod(node_a.key, 0o644)
    with pytest.raises(MeshError) as excinfo:
        server_ctx(node_a)
    assert excinfo.value.code == "key_file_mode"


def test_context_refuses_a_cert_over_another_key(pki: Pki, node_a: Node, tmp_path: Path) -> None:
    other = keys.generate_identity(tmp_path / "other", NODE_A)
    wrong = pki.issue(NODE_A, other.pub_path, tmp_path / "wrong.crt")
    with pytest.raises(MeshError) as excinfo:
        tls.server_context(wrong, node_a.key, pki.ca.cert)
    assert excinfo.value.code == "cert_key_mismatch"


def test_context_refuses_a_cert_from_another_ca(node_a: Node, tmp_path: Path) -> None:
    other_ca = Pki(tmp_path / "other-mesh", name="other CA")
    with pytest.raises(MeshError) as excinfo:
        tls.client_context(node_a.cert, node_a.key, other_ca.ca.cert)
    assert excinfo.value.code == "cert_not_from_ca"


# ---------------------------------------------------------- handshakes: good


async def test_mutual_tls_handshake_identifies_both_sides(node_a: Node, node_b: Node) -> None:
    server = EchoIdentityServer(server_ctx(node_b), pinned=pins(node_a))
    async with server.running():
        client_ssl, line = await talk(server.port, client_ctx(node_a))

    assert line == f"hello {NODE_A}\n".encode()
    assert server.outcomes == [NODE_A]
    assert client_ssl.version() == "TLSv1.3"
    assert tls.verify_peer(client_ssl, expected_agent_id=NODE_B, pinned=pins(node_b)) == NODE_B


async def test_unpinned_peer_passes_on_ca_trust_alone(node_a: Node, node_b: Node) -> None:
    server = EchoIdentityServer(server_ctx(node_b), pinned={})
    async with server.running():
        client_ssl, line = await talk(server.port, client_ctx(node_a))
    assert server.outcomes == [NODE_A]
    assert tls.verify_peer(client_ssl, expected_agent_id=NODE_B, pinned={}) == NODE_B


# ----------------------------------------------------------- handshakes: bad


async def test_client_cert_from_another_ca_fails_the_handshake(
    pki: Pki, node_b: Node, tmp_path: Path
) -> None:
    foreign = Pki(tmp_path / "foreign").node(NODE_A)
    # The foreigner trusts our CA (so it would accept our server) but presents
    # a cert our CA never issued.
    both = tmp_path / "both-cas.pem"
    both.write_bytes(pki.ca.cert.read_bytes() + foreign.ca_cert.read_bytes())
    server = EchoIdentityServer(server_ctx(node_b), pinned={})
    async with server.running():
        error = await talk_fails(server.port, client_ctx(foreign, both))
    assert error is not None
    assert server.outcomes == []


async def test_server_cert_from_another_ca_is_refused_by_the_client(
    node_a: Node, tmp_path: Path
) -> None:
    foreign = Pki(tmp_path / "foreign").node(NODE_B)
    server = EchoIdentityServer(server_ctx(foreign), pinned={})
    async with server.running():
        error = await talk_fails(server.port, client_ctx(node_a))
    assert isinstance(error, ssl.SSLCertVerificationError)
    assert server.outcomes == []


async def test_expired_client_cert_fails_the_handshake(pki: Pki, node_b: Node) -> None:
    now = dt.datetime.now(dt.UTC)
    expired = pki.node(
        NODE_A, not_before=now - dt.timedelta(days=30), not_after=now - dt.timedelta(days=1)
    )
    server = EchoIdentityServer(server_ctx(node_b), pinned={})
    async with server.running():
        error = await talk_fails(server.port, client_ctx(expired))
    assert error is not None
    assert server.outcomes == []


async def test_expired_server_cert_is_refused_by_the_client(pki: Pki, node_a: Node) -> None:
    now = dt.datetime.now(dt.UTC)
    expired = pki.node(
        NODE_B, not_before=now - dt.timedelta(days=30), not_after=now - dt.timedelta(days=1)
    )
    server = EchoIdentityServer(server_ctx(expired), pinned={})
    async with server.running():
        error = await talk_fails(server.port, client_ctx(node_a))
    assert isinstance(error, ssl.SSLCertVerificationError)
    assert "expired" in str(error)


async def test_client_without_a_certificate_fails_the_handshake(pki: Pki, node_b: Node) -> None:
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.check_hostname = False
    anonymous.load_verify_locations(cafile=str(pki.ca.cert))
    server = EchoIdentityServer(server_ctx(node_b), pinned={})
    async with server.running():
        error = await talk_fails(server.port, anonymous)
    assert error is not None
    assert server.outcomes == []


async def test_tls12_client_is_refused(node_a: Node, node_b: Node) -> None:
    old = client_ctx(node_a)
    old.minimum_version = ssl.TLSVersion.TLSv1_2
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    server = EchoIdentityServer(server_ctx(node_b), pinned={})
    async with server.running():
        error = await talk_fails(server.port, old)
    assert error is not None
    assert server.outcomes == []


async def test_ca_issued_cert_over_a_non_pinned_key_is_peer_key_mismatch(
    pki: Pki, node_a: Node, node_b: Node
) -> None:
    # The CA (compromised, or careless) certifies NODE_A over an impostor's key.
    impostor = pki.node(NODE_A, home="impostor")
    server = EchoIdentityServer(server_ctx(node_b), pinned=pins(node_a))
    async with server.running():
        _, line = await talk(server.port, client_ctx(impostor))
    assert line == b"refused:peer_key_mismatch\n"
    assert server.outcomes == ["refused:peer_key_mismatch"]


async def test_client_refuses_a_server_whose_key_is_not_the_pinned_one(
    pki: Pki, node_a: Node, node_b: Node
) -> None:
    impostor = pki.node(NODE_B, home="impostor")
    server = EchoIdentityServer(server_ctx(impostor), pinned={})
    async with server.running():
        client_ssl, _ = await talk(server.port, client_ctx(node_a))
    with pytest.raises(MeshError) as excinfo:
        tls.verify_peer(client_ssl, expected_agent_id=NODE_B, pinned=pins(node_b))
    assert excinfo.value.code == "peer_key_mismatch"


async def test_reaching_the_wrong_agent_is_peer_identity_mismatch(
    pki: Pki, node_a: Node, node_b: Node
) -> None:
    server = EchoIdentityServer(server_ctx(node_b), pinned={})
    async with server.running():
        client_ssl, _ = await talk(server.port, client_ctx(node_a))
    with pytest.raises(MeshError) as excinfo:
        tls.verify_peer(client_ssl, expected_agent_id="ai:node-3@lab", pinned=pins(node_b))
    assert excinfo.value.code == "peer_identity_mismatch"


async def test_plain_tcp_garbage_does_not_kill_the_server(node_a: Node, node_b: Node) -> None:
    server = EchoIdentityServer(server_ctx(node_b), pinned={})
    async with server.running():
        async with asyncio.timeout(HANG_GUARD_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /a2a/v1/ws HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            with contextlib.suppress(OSError):
                await reader.read()  # the server closes after its TLS alert
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

        _, line = await talk(server.port, client_ctx(node_a))

    assert line == f"hello {NODE_A}\n".encode()
    assert server.outcomes == [NODE_A]


# ------------------------------------------------------- certificate parsing


def test_cert_without_agent_san_is_no_agent_san() -> None:
    key = Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE_A)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier("https://example.org/")]),
            critical=False,
        )
        .sign(key, algorithm=None)
    )
    with pytest.raises(MeshError) as excinfo:
        tls.agent_id_from_cert(cert.public_bytes(Encoding.DER))
    assert excinfo.value.code == "no_agent_san"


def test_verify_peer_accepts_der_and_reads_the_cert_key(node_a: Node) -> None:
    der = der_of(node_a.cert)
    assert tls.cert_public_key_raw(der) == keys.raw_public_bytes(node_a.identity.public_key)
    assert tls.verify_peer(der, expected_agent_id=NODE_A, pinned=pins(node_a)) == NODE_A


def test_garbage_der_is_cert_invalid() -> None:
    with pytest.raises(MeshError) as excinfo:
        tls.verify_peer(b"\x30\x03junk", expected_agent_id=None, pinned={})
    assert excinfo.value.code == "cert_invalid"
