"""Bad input on real mTLS sockets against a real `ai-memory serve` process (docs/protocol.md).

Each case checks its documented outcome AND that the node then still serves a good peer.
Client certificates are issued here with the layout's CA (or another CA) over real Ed25519 keys.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import ssl
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import cbor2
import orjson
import pytest

from a2a import Ack, Envelope, decode_frame, new_envelope
from mesh import ca, keys, tls
from mesh.routes import MESSAGES_PATH, WS_PATH
from testbed.mesh import LocalMesh, agent_id_for, health
from tests.integration.conftest import stop_meshes
from tests.layouts import new_layout

pytestmark = pytest.mark.integration

MAX_BYTES = 1024 * 1024  # the default a2a.max_message_bytes
TIMEOUT = aiohttp.ClientTimeout(total=15)


@dataclass
class Creds:
    agent_id: str
    cert: Path
    key: Path
    ca: Path

    def context(self, *, extra_ca: Path | None = None) -> ssl.SSLContext:
        ctx = tls.client_context(self.cert, self.key, self.ca)
        if extra_ca is not None:
            ctx.load_verify_locations(cafile=str(extra_ca))
        return ctx


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    """Nodes 1 and 2 running (node 3 only exists as credentials); the tests talk to node 2."""
    layout = new_layout(tmp_path_factory.mktemp("wire") / "mesh", 3)
    mesh = LocalMesh(layout)
    try:
        mesh.start([1, 2], want_links=False)
        yield mesh
    finally:
        assert not (errors := stop_meshes([mesh])), errors


def node_creds(mesh: LocalMesh, i: int) -> Creds:
    spec = mesh.layout.node(i)
    return Creds(spec.agent_id, spec.home / "tls" / "node.crt", spec.home / "keys" / f"{spec.agent_id}.priv",
                 mesh.layout.root / "ca" / ca.CA_CERT_NAME)


def ping(sender: str, recipients: list[str], ttl_ms: int = 60_000) -> Envelope:
    return new_envelope(sender, recipients, {"kind": "ping", "sent_at": int(time.time() * 1000)},
                        int(time.time() * 1000), ttl_ms)


async def post(creds: Creds, url: str, body: bytes, *, ctx: ssl.SSLContext | None = None):
    """POST raw bytes to /a2a/v1/messages: (status, ACK or None, JSON body or None)."""
    connector = aiohttp.TCPConnector(ssl=ctx or creds.context())
    async with aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as s:
        async with s.post(url + MESSAGES_PATH, data=body, headers={"Content-Type": "application/cbor"}) as r:
            data = await r.read()
            if r.content_type == "application/cbor":
                ack = decode_frame(data, MAX_BYTES)
                assert isinstance(ack, Ack)
                return r.status, ack, None
            return r.status, None, orjson.loads(data)


async def assert_still_serving(mesh: LocalMesh) -> None:
    """A good peer (node 1's real credentials) still gets an accepted ACK from node 2."""
    n2 = mesh.layout.node(2)
    creds = node_creds(mesh, 1)
    env = ping(creds.agent_id, [n2.agent_id])
    status, ack, err = await post(creds, n2.url, env.to_wire())
    assert status == 200 and err is None, err
    assert ack.accepted and ack.correlation_id == env.correlation_id and ack.recipient == n2.agent_id


def first_answer(ctx: ssl.SSLContext, port: int) -> bytes:
    """Handshake with ``ctx`` on a blocking socket, send GET /healthz and return the first bytes back.

    In TLS 1.3 the client's side of the handshake completes before the server has checked the client
    certificate, so a refusal shows on the first read: an alert, a reset or a bare close, never HTTP.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return s.recv(1024)
        except (ssl.SSLError, ConnectionError) as e:
            return f"refused: {e}".encode()


def assert_handshake_refused(ctx: ssl.SSLContext, mesh: LocalMesh) -> None:
    port = mesh.layout.node(2).port
    control = first_answer(node_creds(mesh, 1).context(), port)
    assert control.startswith(b"HTTP/1.1 200"), control  # the same probe with good credentials is served
    answer = first_answer(ctx, port)
    assert not answer.startswith(b"HTTP"), answer


def assert_json_error(status, ack, err, want_status: int, want_code: str) -> None:
    assert (status, ack) == (want_status, None), (status, ack, err)
    assert err["error"]["code"] == want_code and err["error"]["message"], err


@pytest.fixture
def wait_logged(wait_for, node_log):
    def wait(spec, event: str, **fields) -> None:
        wait_for(lambda: node_log.has(spec, event, **fields), f"node log event {event} {fields}", timeout_s=10)
    return wait


# ---------------------------------------------------------------- handshake and identity


async def test_client_cert_from_another_ca_fails_the_handshake(wire, tmp_path):
    n2 = wire.layout.node(2)
    good = node_creds(wire, 1)
    other_ca = tmp_path / "other-ca"
    ca.init_ca(other_ca)
    n1 = wire.layout.node(1)
    cert = ca.issue_node_cert(other_ca, n1.agent_id, n1.home / "keys" / f"{n1.agent_id}.pub", tmp_path / "other.crt")
    rogue = Creds(good.agent_id, cert, good.key, other_ca / ca.CA_CERT_NAME)
    # The rogue client trusts the mesh CA too, so only the server's check of its certificate can fail.
    ctx = rogue.context(extra_ca=good.ca)
    assert_handshake_refused(ctx, wire)
    with pytest.raises(aiohttp.ClientError):
        await post(rogue, n2.url, ping(good.agent_id, [n2.agent_id]).to_wire(), ctx=ctx)
    await assert_still_serving(wire)


async def test_expired_client_cert_fails_the_handshake(wire, tmp_path):
    n1, n2 = wire.layout.node(1), wire.layout.node(2)
    good = node_creds(wire, 1)
    now = dt.datetime.now(dt.UTC)
    cert = ca.issue_node_cert(wire.layout.root / "ca", n1.agent_id, n1.home / "keys" / f"{n1.agent_id}.pub",
                              tmp_path / "expired.crt", not_before=now - dt.timedelta(days=2),
                              not_after=now - dt.timedelta(days=1))
    expired = Creds(n1.agent_id, cert, good.key, good.ca)
    assert_handshake_refused(expired.context(), wire)
    with pytest.raises(aiohttp.ClientError):
        await post(expired, n2.url, ping(n1.agent_id, [n2.agent_id]).to_wire())
    await assert_still_serving(wire)


async def test_sender_other_than_the_tls_identity_is_403_sender_mismatch(wire, wait_logged):
    n1, n2 = wire.layout.node(1), wire.layout.node(2)
    node3 = node_creds(wire, 3)  # a valid certificate, but for node 3
    env = ping(n1.agent_id, [n2.agent_id])  # claims to come from node 1
    status, ack, err = await post(node3, n2.url, env.to_wire())
    assert_json_error(status, ack, err, 403, "sender_mismatch")
    wait_logged(n2, "reject", code="sender_mismatch", correlation_id=env.correlation_id, peer=node3.agent_id,
                sender=n1.agent_id)
    await assert_still_serving(wire)


async def test_ca_valid_cert_over_another_key_than_the_pinned_pub_is_403(wire, wait_logged, tmp_path):
    n1, n2 = wire.layout.node(1), wire.layout.node(2)
    # A second identity that claims node 1's agent_id: the CA signs it, but node 2 pinned node 1's real .pub.
    impostor = keys.generate_identity(tmp_path / "impostor", n1.agent_id)
    cert = ca.issue_node_cert(wire.layout.root / "ca", n1.agent_id, impostor.pub_path, tmp_path / "impostor.crt")
    creds = Creds(n1.agent_id, cert, impostor.priv_path, wire.layout.root / "ca" / ca.CA_CERT_NAME)
    status, ack, err = await post(creds, n2.url, ping(n1.agent_id, [n2.agent_id]).to_wire())
    assert_json_error(status, ack, err, 403, "peer_key_mismatch")
    wait_logged(n2, "peer_key_mismatch")
    await assert_still_serving(wire)


async def test_plain_http_to_the_tls_port_fails(wire):
    n2 = wire.layout.node(2)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(f"http://127.0.0.1:{n2.port}/healthz") as r:
                await r.read()
    assert health(n2) is not None
    await assert_still_serving(wire)


# ---------------------------------------------------------------- bodies on POST


async def test_truncated_and_non_cbor_bodies_are_400_malformed(wire):
    n2 = wire.layout.node(2)
    creds = node_creds(wire, 1)
    wire_bytes = ping(creds.agent_id, [n2.agent_id]).to_wire()
    for body in (wire_bytes[:-7], b"\xff\xfe this is not CBOR", b""):
        status, ack, err = await post(creds, n2.url, body)
        assert_json_error(status, ack, err, 400, "malformed")
    await assert_still_serving(wire)


async def test_body_over_max_message_bytes_is_413(wire):
    n2 = wire.layout.node(2)
    creds = node_creds(wire, 1)
    for size in (MAX_BYTES + 1, 3 * MAX_BYTES):
        status, ack, err = await post(creds, n2.url, b"\x00" * size)
        assert_json_error(status, ack, err, 413, "too_large")
    await assert_still_serving(wire)


async def test_wrong_field_types_and_non_v4_uuid_are_400(wire):
    n2 = wire.layout.node(2)
    creds = node_creds(wire, 1)
    good = ping(creds.agent_id, [n2.agent_id]).to_map()
    cases = [
        ({**good, "expires_at": "tomorrow"}, "bad_field"),
        ({**good, "recipients": n2.agent_id}, "bad_field"),
        ({**good, "sender": 7}, "bad_field"),
        ({**good, "payload": ["kind", "ping"]}, "bad_payload"),
        ({**good, "correlation_id": str(uuid.uuid1())}, "bad_correlation_id"),
        ({**good, "correlation_id": str(uuid.uuid4()).upper()}, "bad_correlation_id"),
        ({**good, "v": 2}, "bad_version"),
        ({k: v for k, v in good.items() if k != "expires_at"}, "bad_field"),
    ]
    for msg, code in cases:
        status, ack, err = await post(creds, n2.url, cbor2.dumps(msg, canonical=True))
        assert_json_error(status, ack, err, 400, code)
    await assert_still_serving(wire)


async def test_envelope_not_addressed_to_the_node_is_acked_rejected(wire):
    n2 = wire.layout.node(2)
    creds = node_creds(wire, 1)
    env = ping(creds.agent_id, [agent_id_for(3)])
    status, ack, err = await post(creds, n2.url, env.to_wire())
    assert status == 200 and err is None
    assert ack == Ack.rejected(env.correlation_id, n2.agent_id, "not_a_recipient")
    await assert_still_serving(wire)


async def test_receiver_logs_expired_with_its_correlation_id(wire, wait_logged):
    n2 = wire.layout.node(2)
    creds = node_creds(wire, 1)
    now = int(time.time() * 1000)
    env = Envelope(correlation_id=str(uuid.uuid4()), sender=creds.agent_id, recipients=(n2.agent_id,),
                   payload={"kind": "ping"}, expires_at=now - 1000)
    status, ack, err = await post(creds, n2.url, env.to_wire())
    assert_json_error(status, ack, err, 410, "expired")
    wait_logged(n2, "expired", correlation_id=env.correlation_id, sender=creds.agent_id)
    await assert_still_serving(wire)


# ---------------------------------------------------------------- WebSocket


async def test_websocket_survives_a_non_cbor_frame(wire, wait_for):
    n2 = wire.layout.node(2)
    creds = node_creds(wire, 1)
    connector = aiohttp.TCPConnector(ssl=creds.context())
    async with aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as s:
        async with s.ws_connect(n2.url + WS_PATH) as ws:
            await ws.send_bytes(b"\xff\xfe not CBOR at all")
            await ws.send_bytes(b"\x00" * (MAX_BYTES + 1))  # over the limit, still within the read slack
            bad_type = {**ping(creds.agent_id, [n2.agent_id]).to_map(), "expires_at": "soon"}
            await ws.send_bytes(cbor2.dumps(bad_type, canonical=True))
            env = ping(creds.agent_id, [n2.agent_id])
            await ws.send_bytes(env.to_wire())
            acks: dict[str, Ack] = {}
            deadline = asyncio.get_running_loop().time() + 15
            while not {env.correlation_id, bad_type["correlation_id"]} <= set(acks):
                remaining = deadline - asyncio.get_running_loop().time()
                assert remaining > 0, f"no ACK for the good frame; got {acks}"
                msg = await ws.receive(timeout=remaining)
                assert msg.type is aiohttp.WSMsgType.BINARY, msg
                ack = decode_frame(msg.data, MAX_BYTES)
                acks[ack.correlation_id] = ack
            assert acks[env.correlation_id] == Ack.ok(env.correlation_id, n2.agent_id)
            # The frame with a valid correlation_id but a bad field is answered with a rejection.
            assert acks[bad_type["correlation_id"]].reason == "rejected:bad_field"
            assert len(acks) == 2  # the frames without a usable correlation_id got no ACK
            assert not ws.closed
    await assert_still_serving(wire)
    # Node 1's own link to node 2 was never disturbed.
    wait_for(lambda: (health(wire.layout.node(1)) or {}).get("peers", {}).get(n2.agent_id) == "up",
             "node 1's link to node 2 to be up", timeout_s=10)


async def test_ca_valid_cert_naming_the_receiving_node_itself_is_403(wire, wait_logged, tmp_path):
    n2 = wire.layout.node(2)
    # A compromised CA signs a certificate for node 2's own agent_id over another key: node 2 pins itself too.
    impostor = keys.generate_identity(tmp_path / "self-impostor", n2.agent_id)
    cert = ca.issue_node_cert(wire.layout.root / "ca", n2.agent_id, impostor.pub_path, tmp_path / "self.crt")
    creds = Creds(n2.agent_id, cert, impostor.priv_path, wire.layout.root / "ca" / ca.CA_CERT_NAME)
    status, ack, err = await post(creds, n2.url, ping(n2.agent_id, [n2.agent_id]).to_wire())
    assert_json_error(status, ack, err, 403, "peer_key_mismatch")
    await assert_still_serving(wire)
