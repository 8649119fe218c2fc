"""The test playing a mesh member over real mTLS: a node's own key and certificate, hand-made envelopes.

Used by the issue 10 trust tests (test_federation_trust.py). Everything here is synchronous (each call
runs one short event loop), so tests mix it freely with ``run_cli`` and ``wait_for``.

- ``Member.of(layout, i)``: node i's real credentials; ``Member.outsider(...)``: a fresh identity with a
  mesh-CA certificate that no node trusts by .pub.
- ``member.send(target, payload)``: POST one envelope to /a2a/v1/messages -> ``Answer(status, ack, error)``.
- ``member.sync(target, since=..., limit=...)``: GET /a2a/v1/sync -> ``Answer`` with ``page``.
- ``new_memory`` / ``next_version`` / ``memory_put``: the issue 10 wire shape of memory.put, signed over
  the canonical ``memory.version`` payload of the spec (``version_payload``); ``memory_put_v2``: memory.put.v2,
  the sharing list inside the record, signed over ``memory.version.v2`` (``version_payload_v2``).
- ``db_rows(spec)``: the node's memories, links and change log read from its SQLite file (read-only).
- ``configure_trust(layout)``: the namespace policies the trust tests run under (``SECRET``, ``SHARED``).
"""

from __future__ import annotations

import asyncio
import sqlite3
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import cbor2
import orjson
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from a2a import Ack, decode_frame, new_envelope
from mesh import ca, keys, tls
from mesh.routes import MESSAGES_PATH, SYNC_PATH, WS_PATH
from node.attest import LinkPayload
from node.errors import ServiceError
from testbed.mesh import MeshLayout, NodeSpec
from tests.integration.conftest import maybe, ok
from tests.node_access import ask

MAX_BYTES = 4 * 1024 * 1024
TIMEOUT = aiohttp.ClientTimeout(total=20)
TTL_MS = 60_000
TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000
INT64_MAX = 2**63 - 1


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------- playing a member


@dataclass(frozen=True)
class Answer:
    """What one request came to: the HTTP status and either the ACK, the sync page or the JSON error."""

    status: int
    ack: Ack | None = None
    page: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def code(self) -> str | None:
        """The ACK's reject code, else the JSON error's code."""
        if self.ack is not None:
            return self.ack.reject_code
        return (self.error or {}).get("error", {}).get("code")


@dataclass(frozen=True)
class Member:
    agent_id: str
    cert: Path
    key_path: Path
    ca_cert: Path

    @classmethod
    def of(cls, layout: MeshLayout, index: int) -> Member:
        spec = layout.node(index)
        return cls(spec.agent_id, spec.home / "tls" / "node.crt", spec.home / "keys" / f"{spec.agent_id}.priv",
                   layout.root / "ca" / ca.CA_CERT_NAME)

    @classmethod
    def outsider(cls, layout: MeshLayout, where: Path, agent_id: str) -> Member:
        """A new identity with a certificate from the mesh CA; no node holds its .pub."""
        ident = keys.generate_identity(where / "keys", agent_id)
        cert = ca.issue_node_cert(layout.root / "ca", agent_id, ident.pub_path, where / "node.crt")
        return cls(agent_id, cert, ident.priv_path, layout.root / "ca" / ca.CA_CERT_NAME)

    def signing_as(self, agent_id: str) -> Member:
        """This member's key under another's name: what it signs claims ``signed_by = agent_id`` (a forgery)."""
        return Member(agent_id, self.cert, self.key_path, self.ca_cert)

    @property
    def private_key(self) -> Ed25519PrivateKey:
        return keys.load_private_key(self.key_path)

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    def context(self) -> ssl.SSLContext:
        return tls.client_context(self.cert, self.key_path, self.ca_cert)

    def sign(self, mem: dict[str, Any]) -> bytes:
        """This member's Ed25519 signature of the memory version (the node's own helper when it has one)."""
        return self.private_key.sign(signed_bytes(mem))

    def sign_v2(self, mem: dict[str, Any]) -> bytes:
        """This member's signature of the version in signed set 2 (``mem`` holds ``share_with``), per the spec."""
        return self.private_key.sign(version_payload_v2(mem))

    def send(self, target: NodeSpec, payload: dict[str, Any]) -> Answer:
        """One envelope from this member to ``target`` on POST /a2a/v1/messages."""
        env = new_envelope(self.agent_id, [target.agent_id], payload, now_ms(), TTL_MS)
        return self.post(target, env.to_wire())

    def post(self, target: NodeSpec, body: bytes) -> Answer:
        async def go() -> Answer:
            async with self._session() as s, s.post(target.url + MESSAGES_PATH, data=body,
                                                    headers={"Content-Type": "application/cbor"}) as r:
                data = await r.read()
                if r.content_type == "application/cbor":
                    ack = decode_frame(data, MAX_BYTES)
                    assert isinstance(ack, Ack), ack
                    return Answer(r.status, ack=ack)
                return Answer(r.status, error=_json(data))
        return asyncio.run(go())

    def sync(self, target: NodeSpec, **query: Any) -> Answer:
        """GET /a2a/v1/sync with ``query`` as given (values are sent as their str())."""
        params = {k: str(v) for k, v in query.items()}

        async def go() -> Answer:
            async with self._session() as s, s.get(target.url + SYNC_PATH, params=params) as r:
                data = await r.read()
                if r.content_type == "application/cbor":
                    return Answer(r.status, page=cbor2.loads(data))
                return Answer(r.status, error=_json(data))
        return asyncio.run(go())

    def sync_all(self, target: NodeSpec, *, limit: int = 500, **query: Any) -> list[dict[str, Any]]:
        """Every item ``target`` serves this member, from seq 0 to the end of its change log."""
        items: list[dict[str, Any]] = []
        since = 0
        for _ in range(1000):
            answer = self.sync(target, since=since, limit=limit, **query)
            assert answer.status == 200 and answer.page is not None, answer
            items += answer.page["items"]
            since = answer.page["next"]
            if not answer.page["more"]:
                return items
        raise AssertionError("sync did not reach the end of the change log in 1000 pages")

    def ws_ping(self, target: NodeSpec) -> Answer:
        """Open /a2a/v1/ws and send one ping: the ACK, or the handshake's HTTP status when refused."""
        async def go() -> Answer:
            async with self._session() as s:
                try:
                    async with s.ws_connect(target.url + WS_PATH) as ws:
                        env = new_envelope(self.agent_id, [target.agent_id], {"kind": "ping"}, now_ms(), TTL_MS)
                        await ws.send_bytes(env.to_wire())
                        msg = await ws.receive(timeout=15)
                        assert msg.type is aiohttp.WSMsgType.BINARY, msg
                        ack = decode_frame(msg.data, MAX_BYTES)
                        assert isinstance(ack, Ack), ack
                        return Answer(101, ack=ack)
                except aiohttp.WSServerHandshakeError as e:
                    return Answer(e.status)
        return asyncio.run(go())

    def ws_session(self, target: NodeSpec, steps: list[Any]) -> list[Answer]:
        """One WebSocket to ``target`` kept open across ``steps``: a payload dict is sent as an envelope and
        its ACK awaited (an Answer: 101 + ACK, or 0 when the socket closed instead); a callable is called."""
        async def go() -> list[Answer]:
            out: list[Answer] = []
            async with self._session() as s, s.ws_connect(target.url + WS_PATH) as ws:
                for step in steps:
                    if callable(step):
                        await asyncio.to_thread(step)
                        continue
                    env = new_envelope(self.agent_id, [target.agent_id], step, now_ms(), TTL_MS)
                    await ws.send_bytes(env.to_wire())
                    msg = await ws.receive(timeout=15)
                    if msg.type is not aiohttp.WSMsgType.BINARY:
                        out.append(Answer(0))
                        continue
                    ack = decode_frame(msg.data, MAX_BYTES)
                    assert isinstance(ack, Ack), ack
                    out.append(Answer(101, ack=ack))
            return out
        return asyncio.run(go())

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.context()), timeout=TIMEOUT)


def _json(data: bytes) -> dict[str, Any] | None:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return {"raw": data[:200].decode(errors="replace")}


class PeerServer:
    """The test serving as ``member`` on ``spec``'s mesh port, with the member's own certificate and key.

    It accepts the WebSocket nodes dial (and ACKs every envelope on it) and answers GET /a2a/v1/sync
    with ``items`` (each a sync item with its ``seq``), so nodes pull whatever the test wants them to.
    Use as a context manager; it runs on its own thread and event loop.
    """

    def __init__(self, member: Member, spec: NodeSpec, items: list[dict[str, Any]]) -> None:
        self.member = member
        self.spec = spec
        self.items = items
        self.sync_requests: list[tuple[str, dict[str, str]]] = []
        self.ws_peers: list[str] = []  # agent_id of each WebSocket accepted, in order
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="peer-server", daemon=True)
        self._runner: web.AppRunner | None = None
        self._sockets: set[web.WebSocketResponse] = set()

    def __enter__(self) -> PeerServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(15)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._runner is not None:
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(15)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
            self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get(WS_PATH, self._ws)
        app.router.add_get(SYNC_PATH, self._sync)
        app.on_shutdown.append(self._close_sockets)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        ctx = tls.server_context(self.member.cert, self.member.key_path, self.member.ca_cert)
        await web.TCPSite(self._runner, "127.0.0.1", self.spec.port, ssl_context=ctx).start()

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.ws_peers.append(_peer_of(request))
        self._sockets.add(ws)
        try:
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.BINARY:
                    env = decode_frame(msg.data, MAX_BYTES)
                    await ws.send_bytes(Ack.ok(env.correlation_id, self.member.agent_id).to_wire())
        finally:
            self._sockets.discard(ws)
        return ws

    async def _close_sockets(self, app: web.Application) -> None:
        for ws in list(self._sockets):
            await ws.close()

    async def _sync(self, request: web.Request) -> web.StreamResponse:
        self.sync_requests.append((_peer_of(request), dict(request.query)))
        since = int(request.query.get("since", "0"))
        items = [i for i in self.items if i["seq"] > since]
        page = {"items": items, "next": max([since, *(i["seq"] for i in items)]), "more": False}
        return web.Response(body=cbor2.dumps(page), content_type="application/cbor")

    @property
    def last_seq(self) -> int:
        return max(i["seq"] for i in self.items)


def _peer_of(request: web.Request) -> str:
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    return tls.agent_id_from_cert(ssl_object.getpeercert(binary_form=True)) if ssl_object else "?"


def poll(predicate: Any, timeout_s: float, poll_s: float = 0.1) -> Any:
    """Like wait_for but returns the last (falsy) value at the deadline instead of failing: for bounded
    "this does not happen" checks that first saw the event it would follow."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = predicate()
        if last or time.monotonic() >= deadline:
            return last
        time.sleep(poll_s)


# ---------------------------------------------------------------- memory.put (issue 10 wire shape)

MEMORY_FIELDS = ("id", "namespace", "title", "content", "tags", "priority", "confidence", "source", "origin",
                 "writer", "version", "created_at", "updated_at")


def version_payload(mem: dict[str, Any]) -> bytes:
    """The bytes a memory version's signature covers: canonical CBOR of the spec's ``memory.version`` map."""
    body = {f: mem[f] for f in MEMORY_FIELDS}
    body["tags"] = list(body["tags"])
    body["confidence"] = float(body["confidence"])
    return cbor2.dumps({"type": "memory.version", **body}, canonical=True)


def version_payload_v2(mem: dict[str, Any]) -> bytes:
    """What a memory.put.v2 signature covers (docs/protocol.md): canonical CBOR of ``memory.version.v2``, the
    fields of ``version_payload`` and ``share_with`` (null, or the list sorted and distinct), always stated."""
    body = {f: mem[f] for f in MEMORY_FIELDS}
    body["tags"] = list(body["tags"])
    body["confidence"] = float(body["confidence"])
    body["share_with"] = None if mem["share_with"] is None else list(mem["share_with"])
    return cbor2.dumps({"type": "memory.version.v2", **body}, canonical=True)


def signed_bytes(mem: dict[str, Any]) -> bytes:
    """The product's canonical payload (node.attest.MemoryPayload) when present, else the spec's own."""
    try:
        from node.attest import MemoryPayload
    except ImportError:
        return version_payload(mem)
    return MemoryPayload.from_mapping(mem).canonical_bytes()


def new_memory(origin: str, *, writer: str | None = None, **fields: Any) -> dict[str, Any]:
    """A fresh memory (version 1, now) created by ``origin``; ``fields`` override any wire field."""
    ts = now_ms()
    mem = {"id": str(uuid.uuid4()), "namespace": "default", "title": "", "content": f"memory by {origin}",
           "tags": [], "priority": 5, "confidence": 1.0, "source": "", "origin": origin,
           "writer": writer or origin, "version": 1, "created_at": ts, "updated_at": ts}
    mem.update(fields)
    return mem


def next_version(stored: dict[str, Any], writer: str, **fields: Any) -> dict[str, Any]:
    """The version after ``stored`` (a node's CLI ``get --json``), written by ``writer`` now."""
    mem = {f: stored[f] for f in MEMORY_FIELDS if f != "writer"}
    mem["tags"] = list(mem["tags"])
    mem.update(writer=writer, version=stored["version"] + 1, updated_at=max(now_ms(), stored["updated_at"] + 1))
    mem.update(fields)
    return mem


def memory_put(mem: dict[str, Any], *, signer: Member | None = None, signed_by: str | None = None,
               signature: bytes | None = None, **extra: Any) -> dict[str, Any]:
    """A memory.put payload; with ``signer`` the version is signed by its key (``signed_by`` defaults to it)."""
    if signer is not None:
        signature = signer.sign(mem) if signature is None else signature
        signed_by = signer.agent_id if signed_by is None else signed_by
    return {"kind": "memory.put", "memory": dict(mem), "signature": signature, "signed_by": signed_by, **extra}


def memory_put_v2(mem: dict[str, Any], share_with: list[str] | None, *, signer: Member | None = None,
                  signature: bytes | None = None) -> dict[str, Any]:
    """A memory.put.v2 payload: ``mem`` with ``share_with`` inside, signed by ``signer`` unless ``signature``
    is given (a signature over another list: what a relay that changed the list would send)."""
    rec = {**mem, "share_with": share_with}
    if signer is not None and signature is None:
        signature = signer.sign_v2(rec)
    return {"kind": "memory.put.v2", "memory": rec, "signature": signature,
            "signed_by": None if signature is None else rec["writer"]}


# ---------------------------------------------------------------- reading a node's state


def db_rows(spec: NodeSpec) -> dict[str, list[tuple]]:
    """Every row of the node's memories and memory_links tables, and its change log, read-only."""
    path = spec.home / "data" / "memory.db"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return {table: sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
                for table in ("memories", "memory_links", "change_log")}
    finally:
        conn.close()


def queued_for(spec: NodeSpec, peer: str) -> list[dict[str, Any]]:
    """The payloads of every envelope the node has queued (or dead-lettered) for ``peer``: its live path."""
    path = spec.home / "data" / "memory.db"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = [r[0] for table in ("a2a_outbox", "a2a_dead_letters")
                for r in conn.execute(f"SELECT envelope FROM {table} WHERE peer = ?", (peer,))]
    finally:
        conn.close()
    return [decode_frame(bytes(r), MAX_BYTES).payload for r in rows]


def change_log_seq(spec: NodeSpec) -> int:
    """The last seq of the node's change log (what a peer that pulled it to the end has as its cursor)."""
    path = spec.home / "data" / "memory.db"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("SELECT coalesce(max(seq), 0) FROM change_log").fetchone()[0]
    finally:
        conn.close()


def memory_on(spec: NodeSpec, memory_id: str) -> dict[str, Any] | None:
    """The memory as the CLI's ``get`` shows it, or None. A running node is asked over its local socket (what
    the polls call, many times a second); a stopped one's store is read by the CLI."""
    try:
        got = ask(spec.config_path, spec.home, "memory_get", {"id": memory_id})
    except ServiceError as e:
        if e.code == "not_found":
            return None
        raise
    return got if got is not None else maybe(spec, "get", memory_id)


def links_on(spec: NodeSpec) -> dict[str, dict[str, Any]]:
    return {r["link_id"]: r for r in ok(spec, "links", "--limit", "100")}


# ---------------------------------------------------------------- per-node config


def add_config(spec: NodeSpec, table: str, **values: Any) -> None:
    """Set ``values`` in ``[table]`` of the node's config.toml (the table is made when absent)."""
    text = spec.config_path.read_text(encoding="utf-8")
    header = f"[{table}]"
    lines = [f"{k} = {_toml(v)}" for k, v in values.items()]
    out = text.splitlines()
    if header in out:
        at = out.index(header) + 1
        out[at:at] = lines
    else:
        out += ["", header, *lines]
    spec.config_path.write_text("\n".join(out) + "\n", encoding="utf-8")


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return orjson.dumps(v).decode()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    raise TypeError(f"no TOML literal for {v!r}")


# ---------------------------------------------------------------- the issue 10 trust mesh

MAX_VERSION_STEP = 1_000_000  # the spec's default [federation] max_version_step
SECRET = "secret"   # on node 1: restricted to node 3
SHARED = "shared"   # on node 1: shared with nodes 2 and 3, node 2 may write versions of others' memories


def configure_trust(layout: MeshLayout) -> None:
    """Node 1 restricts ``SECRET`` to node 3 and lets node 2 write versions in ``SHARED``; node 3 has no
    namespace policy at all (it only learns a restriction from the data, ``share_with``). Both hold an
    orphan link 0.2 s."""
    n2, n3 = (layout.node(i).agent_id for i in (2, 3))
    add_config(layout.node(1), "federation", orphan_hold_s=0.2)
    add_config(layout.node(1), f'federation.namespaces."{SECRET}"', peers=[n3])
    add_config(layout.node(1), f'federation.namespaces."{SHARED}"', peers=[n2, n3], writers=[n2])
    add_config(layout.node(3), "federation", orphan_hold_s=0.2)


def diff(before: dict[str, list[tuple]], after: dict[str, list[tuple]]) -> dict[str, dict[str, list]]:
    """What ``db_rows`` gained and lost between two readings, per table (tables that did not change left out)."""
    out = {}
    for table in before:
        added = [r for r in after[table] if r not in before[table]]
        removed = [r for r in before[table] if r not in after[table]]
        if added or removed:
            out[table] = {"added": added, "removed": removed}
    return out


def item_ids(items: list[dict[str, Any]]) -> set[str]:
    """Every memory id and link end named by sync items (or queued payloads)."""
    out = set()
    for item in items:
        if item["kind"] in ("memory.put", "memory.put.v2"):
            out.add(item["memory"]["id"])
        else:
            out |= {item["link"]["src_id"], item["link"]["dst_id"]}
    return out


def link_ids(items: list[dict[str, Any]]) -> set[str]:
    return {LinkPayload.from_mapping(i["link"]).link_id for i in items if i["kind"] == "link.put"}
