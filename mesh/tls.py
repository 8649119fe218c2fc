"""Mutual-TLS contexts for the mesh and the post-handshake peer identity check.

Both sides present a certificate issued by the mesh CA over their Ed25519
identity key (mesh.ca); TLS 1.3 only; client certificates are required.

Identity is NOT the host name. The client context has ``check_hostname=False``
because a node's address varies (loopback, container namespaces, NAT) while
its identity does not: :func:`verify_peer` (run inside the client's
handshake by a :func:`pinned_to` context, and by the server on each request)
reads the agent_id from the certificate's SAN URI
``urn:ai-memory:agent:<agent_id>``, checks it against the agent_id it meant
to reach (client side) and, where that peer's ``.pub`` is pinned in
``peers/``, requires the certificate's key to equal it: a compromised CA
still cannot impersonate a pinned node. A peer with no pinned ``.pub`` is
accepted on CA trust alone (the chain was verified by the handshake).

Error codes: ``tls_config``, ``cert_key_mismatch``, ``cert_not_from_ca``,
``cert_invalid``, ``no_peer_cert``, ``no_agent_san``, ``ambiguous_agent_san``,
``peer_identity_mismatch``, ``peer_key_mismatch``, plus mesh.keys / mesh.ca codes.
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from mesh import keys
from mesh.ca import AGENT_URI_PREFIX, load_cert
from mesh.errors import MeshCode, MeshError

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- contexts


def server_context(cert_path: Path, key_path: Path, ca_path: Path) -> ssl.SSLContext:
    """Server-side context: TLS 1.3 minimum, client certificate required.

    ``key_path`` is the node's identity ``.priv`` (the certificate is over
    that key); its 0600 mode is enforced before ssl reads it. Callers must
    run :func:`verify_peer` on each accepted connection.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # Our clients never resume sessions, so tickets would be wasted bytes.
    ctx.num_tickets = 0
    _configure(ctx, cert_path, key_path, ca_path)
    return ctx


def client_context(cert_path: Path, key_path: Path, ca_path: Path) -> ssl.SSLContext:
    """Client-side context: TLS 1.3 minimum, server certificate required.

    ``check_hostname`` is off on purpose: the peer's identity is its SAN URI,
    checked by :func:`verify_peer` after the handshake (pass the agent_id you
    meant to reach as ``expected_agent_id``). IP/DNS SANs are not relied on.
    """
    ctx = MeshClientContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # must precede verify_mode changes; see docstring
    _configure(ctx, cert_path, key_path, ca_path)
    ctx.material = (Path(cert_path), Path(key_path), Path(ca_path))
    return ctx


class MeshClientContext(ssl.SSLContext):
    """A client context that remembers the files it was made from (``material``: cert, key, CA), so that
    :func:`pinned_to` can make a peer's own copy of it."""

    material: tuple[Path, Path, Path]


class PeerRefused(ssl.SSLCertVerificationError):
    """A handshake whose peer :func:`verify_peer` refused (raised inside the handshake, so the TLS stack and
    the HTTP client pass it on as a certificate error); ``error`` is the MeshError saying why."""

    def __init__(self, error: MeshError) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error

    @staticmethod
    def within(exc: BaseException) -> MeshError | None:
        """The MeshError of a PeerRefused that ``exc`` is or was caused by (the HTTP client wraps it), else
        None. Looks a bounded way down the chain."""
        seen: BaseException | None = exc
        for _ in range(8):
            if seen is None:
                return None
            if isinstance(seen, PeerRefused):
                return seen.error
            seen = seen.__cause__ or seen.__context__
        return None


class _PeerCheckedSSLObject(ssl.SSLObject):
    """An SSLObject (``SSLContext.sslobject_class``, the stdlib's hook for it) that runs :func:`verify_peer`
    once its handshake completes, before the connection carries a byte; a refusal fails the handshake as a
    ``PeerRefused``. A subclass per peer sets the two class attributes (:func:`pinned_to`)."""

    expected_agent_id: str
    pinned: Callable[[], Mapping[str, Ed25519PublicKey]]

    def do_handshake(self) -> None:
        super().do_handshake()  # SSLWantReadError until the handshake is through
        try:
            verify_peer(self, expected_agent_id=self.expected_agent_id, pinned=type(self).pinned())
        except MeshError as e:
            raise PeerRefused(e) from None


def pinned_to(ctx: ssl.SSLContext, expected_agent_id: str,
              pinned: Callable[[], Mapping[str, Ed25519PublicKey]]) -> ssl.SSLContext:
    """A copy of the client context ``ctx`` (made by :func:`client_context`) whose every connection checks, in
    its handshake, that the peer is ``expected_agent_id`` and holds the key ``pinned()`` has for it (if any):
    :func:`verify_peer`, before any byte of a request is sent. MeshError ``tls_config`` for another context."""
    if not isinstance(ctx, MeshClientContext):
        raise MeshError(MeshCode.TLS_CONFIG, "a peer's TLS context is made from a mesh client context "
                                             "(mesh.tls.client_context)")
    peer_ctx = client_context(*ctx.material)
    peer_ctx.sslobject_class = type("PeerCheckedSSLObject", (_PeerCheckedSSLObject,),
                                    {"expected_agent_id": expected_agent_id, "pinned": staticmethod(pinned)})
    return peer_ctx


def _configure(ctx: ssl.SSLContext, cert_path: Path, key_path: Path, ca_path: Path) -> None:
    cert_path, key_path, ca_path = Path(cert_path), Path(key_path), Path(ca_path)
    private_key = keys.load_private_key(key_path)  # mode 0600 + Ed25519 checks
    if not cert_path.exists():
        agent_id = key_path.name.removesuffix(keys.PRIV_SUFFIX)
        raise MeshError(
            MeshCode.CERT_MISSING,
            f"The node certificate {cert_path} does not exist; issue one over this node's key where the mesh CA "
            f"is: ai-memory mesh cert issue --ca CA_DIR --agent-id {agent_id} "
            f"--pub {key_path.with_name(agent_id + keys.PUB_SUFFIX)} --out {cert_path}",
        )
    own = load_cert(cert_path)
    if _raw_key(own, cert_path) != keys.raw_public_bytes(private_key.public_key()):
        raise MeshError(
            MeshCode.CERT_KEY_MISMATCH,
            f"The certificate {cert_path} is not over the key in {key_path}; "
            "issue a new one from this node's .pub.",
        )
    _check_issued_by(own, cert_path, ca_path)
    if own.not_valid_after_utc <= dt.datetime.now(dt.UTC):
        # Not fatal here: peers will refuse it, and the operator should know why.
        log.warning("certificate %s expired at %s", cert_path, own.not_valid_after_utc)

    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_verify_locations(cafile=str(ca_path))
        ctx.load_cert_chain(certfile=str(cert_path), keyfile=str(key_path))
    except (ssl.SSLError, OSError) as exc:
        raise MeshError(
            MeshCode.TLS_CONFIG,
            f"Could not load TLS material (cert {cert_path}, key {key_path}, "
            f"CA {ca_path}): {exc}",
        ) from None


def _check_issued_by(cert: x509.Certificate, cert_path: Path, ca_path: Path) -> None:
    # Fail at startup with a clear sentence rather than at every handshake.
    try:
        cas = x509.load_pem_x509_certificates(ca_path.read_bytes())
    except FileNotFoundError:
        raise MeshError(MeshCode.CA_MISSING, f"The CA certificate file {ca_path} does not exist; copy the mesh "
                                             f"CA's certificate there: cp CA_DIR/ca.crt {ca_path}") from None
    except ValueError as exc:
        raise MeshError(MeshCode.CERT_INVALID, f"{ca_path} holds no PEM certificate ({exc}).") from None
    for ca_cert in cas:
        try:
            cert.verify_directly_issued_by(ca_cert)
            return
        except (ValueError, TypeError, InvalidSignature):
            continue
    raise MeshError(
        MeshCode.CERT_NOT_FROM_CA,
        f"The certificate {cert_path} was not issued by the CA in {ca_path}.",
    )


# --------------------------------------------------------- certificate facts


def _load_der(der: bytes) -> x509.Certificate:
    try:
        return x509.load_der_x509_certificate(bytes(der))
    except ValueError as exc:
        raise MeshError(MeshCode.CERT_INVALID, f"The peer certificate does not parse ({exc}).") from None


def _raw_key(cert: x509.Certificate, source: object) -> bytes:
    pk = cert.public_key()
    if not isinstance(pk, Ed25519PublicKey):
        raise MeshError(
            MeshCode.KEY_INVALID, f"The certificate {source} is over a {type(pk).__name__}, not Ed25519."
        )
    return keys.raw_public_bytes(pk)


def agent_id_from_cert(der: bytes) -> str:
    """The agent_id named by the certificate's ``urn:ai-memory:agent:`` SAN URI.

    ``no_agent_san`` if there is none, ``ambiguous_agent_san`` if it names
    two different agents, ``bad_agent_id`` if the id is not a valid agent_id.
    """
    cert = _load_der(der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        uris: list[str] = []
    else:
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    ids = sorted({u[len(AGENT_URI_PREFIX):] for u in uris if u.startswith(AGENT_URI_PREFIX)})
    if not ids:
        raise MeshError(
            MeshCode.NO_AGENT_SAN,
            f"The peer certificate ({cert.subject.rfc4514_string()}) has no "
            f"{AGENT_URI_PREFIX}<agent_id> SAN URI, so it names no mesh agent.",
        )
    if len(ids) > 1:
        raise MeshError(
            MeshCode.AMBIGUOUS_AGENT_SAN,
            f"The peer certificate names several agents ({', '.join(ids)}).",
        )
    return keys.validate_agent_id(ids[0])


def cert_public_key_raw(der: bytes) -> bytes:
    """The raw 32-byte Ed25519 key a DER certificate is over (``key_invalid`` if not Ed25519)."""
    return _raw_key(_load_der(der), "presented by the peer")


def peer_cert_der(peer: Any) -> bytes:
    """DER of the peer certificate from bytes, an SSLObject/SSLSocket, or an
    asyncio transport / StreamWriter (anything with ``get_extra_info``)."""
    if isinstance(peer, (bytes, bytearray, memoryview)):
        return bytes(peer)
    if hasattr(peer, "get_extra_info") and not hasattr(peer, "getpeercert"):
        ssl_object = peer.get_extra_info("ssl_object")
        if ssl_object is None:
            raise MeshError(MeshCode.NO_PEER_CERT, "The connection is not TLS; there is no peer certificate.")
        peer = ssl_object
    der: bytes | None = peer.getpeercert(binary_form=True)
    if not der:
        raise MeshError(MeshCode.NO_PEER_CERT, "The peer presented no certificate.")
    return der


def verify_peer(
    peer: Any,
    *,
    expected_agent_id: str | None,
    pinned: Mapping[str, Ed25519PublicKey],
) -> str:
    """Return the peer's agent_id after checking it against what we trust.

    ``peer`` is the peer certificate as DER bytes, or the handshaken
    ``ssl.SSLObject``/``ssl.SSLSocket``/asyncio transport/StreamWriter. The
    CA chain must already have been verified (the contexts above do that in
    the handshake); this adds the identity checks:

    - ``expected_agent_id`` (the agent we dialled; None on the server side)
      must equal the SAN agent_id, else ``peer_identity_mismatch``;
    - if ``pinned`` (agent_id → key, from ``peers/``) has that agent_id, the
      certificate's key must equal it, else ``peer_key_mismatch``. An agent
      with no pinned key passes on CA trust alone.
    """
    der = peer_cert_der(peer)
    agent_id = agent_id_from_cert(der)
    if expected_agent_id is not None and agent_id != expected_agent_id:
        raise MeshError(
            MeshCode.PEER_IDENTITY_MISMATCH,
            f"Expected to reach {expected_agent_id} but the peer's certificate "
            f"names {agent_id}.",
        )
    pinned_key = pinned.get(agent_id)
    if pinned_key is not None:
        presented = cert_public_key_raw(der)
        expected = keys.raw_public_bytes(pinned_key)
        if presented != expected:
            raise MeshError(
                MeshCode.PEER_KEY_MISMATCH,
                f"The certificate for {agent_id} is over key "
                f"{keys.fingerprint(Ed25519PublicKey.from_public_bytes(presented))}, but the pinned "
                f".pub is {keys.fingerprint(pinned_key)}; refusing. If {agent_id} rotated its key, its "
                "new .pub must be imported where it is pinned (ai-memory identity import); otherwise the "
                "CA issued a certificate it should not have.",
            )
    return agent_id
