"""The mesh CA and node certificates (docs/security.md, the transport).

A node's TLS certificate is over the node's own Ed25519 identity key and names
the node by a SAN URI ``urn:ai-memory:agent:<agent_id>``; that URI, not the CN
or an IP address, is the identity checked after the handshake (see mesh.tls).

Error codes: ``ca_exists``, ``ca_missing``, ``cert_missing``, ``cert_invalid``,
``bad_san``, ``bad_validity``, plus the key codes from mesh.keys.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mesh import keys
from mesh.errors import MeshCode, MeshError

CA_KEY_NAME = "ca.key"
CA_CERT_NAME = "ca.crt"
AGENT_URI_PREFIX = "urn:ai-memory:agent:"
CERT_MODE = 0o644
# Backdate notBefore so nodes whose clocks lag the CA's a little still accept.
CLOCK_SKEW = dt.timedelta(minutes=5)
# X.509 caps commonName at 64 characters; the SAN URI carries the full id.
CN_MAX = 64


@dataclass(frozen=True)
class CaPaths:
    """Where a mesh CA lives: ``dir/ca.key`` (0600) and ``dir/ca.crt``."""

    dir: Path
    key: Path
    cert: Path


def ca_paths(ca_dir: Path) -> CaPaths:
    ca_dir = Path(ca_dir)
    return CaPaths(ca_dir, ca_dir / CA_KEY_NAME, ca_dir / CA_CERT_NAME)


def agent_uri(agent_id: str) -> str:
    """The SAN URI naming ``agent_id``: ``urn:ai-memory:agent:<agent_id>``."""
    return AGENT_URI_PREFIX + agent_id


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def init_ca(
    out_dir: Path,
    *,
    name: str = "attested-mesh CA",
    validity_days: int = 3650,
    force: bool = False,
) -> CaPaths:
    """Create a self-signed Ed25519 mesh CA in ``out_dir``.

    Writes ``ca.key`` (PKCS#8 PEM, 0600) and ``ca.crt`` (0644). Refuses to
    replace an existing CA (``ca_exists``) unless ``force``: every node cert
    issued by the old CA would stop verifying.
    """
    paths = ca_paths(out_dir)
    if not force and (paths.key.exists() or paths.cert.exists()):
        raise MeshError(
            MeshCode.CA_EXISTS,
            f"A mesh CA already exists in {paths.dir}; replacing it invalidates "
            "every node certificate it issued (pass force to do it anyway).",
        )
    if validity_days <= 0:
        raise MeshError(MeshCode.BAD_VALIDITY, f"validity_days must be positive, not {validity_days}.")
    key = Ed25519PrivateKey.generate()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:CN_MAX])])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=validity_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, algorithm=None)  # Ed25519 signs without a separate hash
    )
    paths.dir.mkdir(mode=keys.KEYS_DIR_MODE, parents=True, exist_ok=True)
    keys.write_file_atomic(paths.key, keys.private_pem(key), keys.PRIV_MODE, replace=force)
    keys.write_file_atomic(paths.cert, _cert_pem(cert), CERT_MODE, replace=force)
    return paths


def load_cert(path: Path) -> x509.Certificate:
    """Load a PEM certificate (``cert_missing`` / ``cert_invalid``)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MeshError(MeshCode.CERT_MISSING, f"The certificate file {path} does not exist.") from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise MeshError(
            MeshCode.CERT_INVALID, f"The certificate file {path} is not a PEM certificate ({exc})."
        ) from None


def load_ca(ca_dir: Path) -> tuple[Ed25519PrivateKey, x509.Certificate]:
    """Load the CA key (mode-checked like any private key) and certificate."""
    paths = ca_paths(ca_dir)
    if not paths.key.exists() or not paths.cert.exists():
        raise MeshError(
            MeshCode.CA_MISSING,
            f"No mesh CA in {paths.dir} (need {CA_KEY_NAME} and {CA_CERT_NAME}); "
            "run `ai-memory mesh ca init`.",
        )
    key = keys.load_private_key(paths.key)
    cert = load_cert(paths.cert)
    if keys.raw_public_bytes(key.public_key()) != _raw_cert_key(cert, paths.cert):
        raise MeshError(
            MeshCode.CERT_INVALID, f"{paths.cert} does not belong to the key in {paths.key}."
        )
    return key, cert


def _raw_cert_key(cert: x509.Certificate, source: object) -> bytes:
    pk = cert.public_key()
    if not isinstance(pk, Ed25519PublicKey):
        raise MeshError(MeshCode.KEY_INVALID, f"The certificate {source} is not over an Ed25519 key.")
    return keys.raw_public_bytes(pk)


def _sans(
    agent_id: str, extra_ips: Iterable[str], extra_dns: Iterable[str]
) -> list[x509.GeneralName]:
    if not agent_id.isascii():
        # A URI SAN is IA5String; percent-encoding would change the identity.
        raise MeshError(
            MeshCode.BAD_AGENT_ID,
            f"The agent_id {agent_id!a} has non-ASCII characters and cannot be "
            "carried in a certificate URI.",
        )
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(agent_uri(agent_id))]
    dns = ["localhost", *extra_dns]
    ips = ["127.0.0.1", *extra_ips]
    for host in dict.fromkeys(dns):
        if not host or not host.isascii() or any(c.isspace() for c in host):
            raise MeshError(MeshCode.BAD_SAN, f"{host!r} is not a valid DNS name.")
        names.append(x509.DNSName(host))
    for ip in dict.fromkeys(str(i) for i in ips):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise MeshError(MeshCode.BAD_SAN, f"{ip!r} is not an IP address.") from None
    return names


def _node_extensions(node_key: Ed25519PublicKey, ca_key: Ed25519PrivateKey,
                     sans: list[x509.GeneralName]) -> list[tuple[x509.ExtensionType, bool]]:
    """A node certificate's extensions with their criticality: not a CA, signing only, server and client
    authentication, its SANs, and the key identifiers."""
    usage = x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False)
    return [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (usage, True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), False),
        (x509.SubjectAlternativeName(sans), False),
        (x509.SubjectKeyIdentifier.from_public_key(node_key), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ]


def issue_node_cert(
    ca_dir: Path,
    agent_id: str,
    pub_path: Path,
    out_path: Path,
    *,
    validity_days: int = 365,
    extra_ips: Iterable[str] = (),
    extra_dns: Iterable[str] = (),
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> Path:
    """Issue a node certificate over the node's own Ed25519 identity key.

    ``pub_path`` is the node's ``<agent_id>.pub``. Subject CN = agent_id
    (cut to 64 characters); SAN = URI ``urn:ai-memory:agent:<agent_id>``, DNS
    ``localhost``, IP ``127.0.0.1`` plus extras; CA=false; EKU serverAuth +
    clientAuth. Validity is now-5min .. now+``validity_days`` unless
    ``not_before``/``not_after`` (timezone-aware) override it, e.g. for
    expired-cert tests. Writes PEM to ``out_path`` (0644) and returns it.
    """
    keys.validate_agent_id(agent_id)
    ca_key, ca_cert = load_ca(ca_dir)
    node_key = keys.load_public_key(pub_path)
    now = _now()
    start = not_before if not_before is not None else now - CLOCK_SKEW
    end = not_after if not_after is not None else now + dt.timedelta(days=validity_days)
    if end <= start:
        raise MeshError(MeshCode.BAD_VALIDITY, f"Certificate validity ends ({end}) before it starts ({start}).")
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, agent_id[:CN_MAX])]))
        .issuer_name(ca_cert.subject)
        .public_key(node_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )
    for extension, critical in _node_extensions(node_key, ca_key, _sans(agent_id, extra_ips, extra_dns)):
        builder = builder.add_extension(extension, critical=critical)
    cert = builder.sign(ca_key, algorithm=None)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    keys.write_file_atomic(out_path, _cert_pem(cert), CERT_MODE, replace=True)
    return out_path


def extra_sans(cert_path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(extra IPs, extra DNS names) of a node certificate: its SANs beyond the defaults every node
    certificate carries (``127.0.0.1``, ``localhost``), to issue a replacement that answers the same
    addresses. A missing file has none; an unreadable one raises ``cert_invalid``."""
    try:
        cert = load_cert(cert_path)
    except MeshError as exc:
        if exc.code == "cert_missing":
            return (), ()
        raise
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return (), ()
    ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress) if str(ip) != "127.0.0.1")
    dns = tuple(name for name in san.get_values_for_type(x509.DNSName) if name != "localhost")
    return ips, dns
