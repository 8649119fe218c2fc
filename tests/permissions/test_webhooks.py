"""Webhook subscriptions against a receiver the test starts on 127.0.0.1: signed deliveries, a receiver
that is down (retries, then a dead letter), and replay once it is back."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from node import assemble
from node.config import NodeConfig
from node.errors import ServiceError
from node.events.delivery import WebhookDelivery
from node.events.webhooks import next_attempt
from storage import subscriptions
from tests.node.conftest import AGENT, make_config
from tests.permissions.test_approvals import ASK_TEAM, _parked

WAIT_S = 20.0


def test_retry_schedule_then_dead_letter() -> None:
    delays = (1.0, 5.0)
    assert next_attempt(1, delays, 1_000) == 2_000
    assert next_attempt(2, delays, 1_000) == 6_000
    assert next_attempt(3, delays, 1_000) is None


class Receiver:
    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.arrived = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def start(self, port: int) -> None:
        async def hook(request: web.Request) -> web.Response:
            self.got.append((dict(request.headers), await request.read()))
            self.arrived.set()
            return web.Response(status=204)

        app = web.Application()
        app.add_routes([web.post("/hook", hook)])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _until(pred: Any, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        for _ in range(int(WAIT_S / 0.02)):
            if await pred():
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"not reached: {what}")


@pytest.fixture
async def node(tmp_path) -> AsyncIterator[tuple[Any, NodeConfig]]:
    from mesh import keys
    cfg = make_config(tmp_path / "home", permissions={"reload_check_s": 1e-9},
                      subscriptions={"retry_delays_s": [0.05, 0.05], "poll_s": 0.02})
    keys.generate_identity(cfg.keys_dir, AGENT)
    cfg.home.mkdir(parents=True, exist_ok=True)
    cfg.permissions_path.write_text(ASK_TEAM, encoding="utf-8")
    svc = await assemble.open_service(cfg, require_identity=True)
    stop = [False]
    sender = asyncio.create_task(WebhookDelivery(svc.webhooks).run(lambda: stop[0]))
    try:
        yield svc, cfg
    finally:
        stop[0] = True
        await asyncio.wait_for(sender, WAIT_S)
        await svc.close()


async def test_signed_deliveries_survive_a_receiver_that_is_down_and_replay(node) -> None:
    svc, cfg = node
    port = _free_port()
    sub = await svc.webhooks.subscribe(f"http://127.0.0.1:{port}/hook", ["approval.requested", "memory.stored"])
    action = await _parked(svc)  # nobody listens on the port yet

    async def dead() -> bool:
        return bool(await svc.db.read(subscriptions.deliveries, "dead", 10))
    await _until(dead, "the delivery dead-lettered")
    [letter] = await svc.db.read(subscriptions.deliveries, "dead", 10)
    assert letter.attempts == 3 and letter.event == "approval.requested"

    receiver = Receiver()
    await receiver.start(port)
    try:
        await svc.webhooks.replay(letter.id)
        await asyncio.wait_for(receiver.arrived.wait(), WAIT_S)
        headers, body = receiver.got[0]
        want = hmac.new(bytes.fromhex(sub["secret"]), headers["X-Webhook-Timestamp"].encode() + b"." + body,
                        hashlib.sha256).hexdigest()
        assert headers["X-Webhook-Signature"] == want and headers["X-Webhook-Event"] == "approval.requested"
        assert json.loads(body)["data"]["id"] == action
        receiver.arrived.clear()
        await svc.memory_store("public", namespace="elsewhere")
        await asyncio.wait_for(receiver.arrived.wait(), WAIT_S)
        assert receiver.got[-1][0]["X-Webhook-Event"] == "memory.stored"
        with pytest.raises(ServiceError) as e:
            await svc.webhooks.replay(letter.id)  # delivered now: not dead any more
        assert e.value.code == "not_found"
    finally:
        await receiver.stop()


async def test_bad_subscriptions_are_refused(node) -> None:
    svc, _ = node
    with pytest.raises(ServiceError, match="url must be"):
        await svc.webhooks.subscribe("ftp://x", ["memory.stored"])
    with pytest.raises(ServiceError, match="events must be"):
        await svc.webhooks.subscribe("http://127.0.0.1:1/x", ["memory.deleted"])


async def test_a_peers_memory_and_link_reach_subscribers_as_local_ones_do(node) -> None:
    from tests.node.test_federation_apply import M1, M2, PEER, _env, _link_put, _memory, _mput

    svc, _ = node
    port = _free_port()
    await svc.webhooks.subscribe(f"http://127.0.0.1:{port}/hook", ["memory.stored", "link.attested"])
    receiver = Receiver()
    await receiver.start(port)
    try:
        for mid in (M1, M2):
            assert (await svc.replicator.apply(_env(PEER, _mput(_memory(mid))), PEER)).accepted
        assert (await svc.replicator.apply(_env(PEER, _link_put(None, M1, M2)), PEER)).accepted

        async def three() -> bool:
            return len(receiver.got) >= 3
        await _until(three, "three deliveries")
        got = [(h["X-Webhook-Event"], json.loads(b)["data"]) for h, b in receiver.got]
        assert [e for e, _ in got] == ["memory.stored", "memory.stored", "link.attested"]
        assert {d["id"] for _, d in got[:2]} == {M1, M2} and all(d["received_from"] == PEER for _, d in got)
        # The same memory again changes nothing and tells nobody.
        assert (await svc.replicator.apply(_env(PEER, _mput(_memory(M1))), PEER)).accepted
        assert len(await svc.db.read(subscriptions.deliveries, None, 10)) == 3
    finally:
        await receiver.stop()


async def test_what_an_agent_writes_reaches_subscribers_naming_the_agent(node) -> None:
    """An agent acting on this node: its memory and link arrive as memory.stored / link.attested whose bodies
    name the agent as writer and signer (the node only vouches for it), not the node."""
    from node.agents.acting import acting_as

    svc, _ = node
    port = _free_port()
    await svc.webhooks.subscribe(f"http://127.0.0.1:{port}/hook", ["memory.stored", "link.attested"])
    receiver = Receiver()
    await receiver.start(port)
    bot = "ai:claude-code@laptop"
    try:
        principal = await svc.agents.principal(bot)
        assert principal is not None
        with acting_as(principal):
            a = await svc.memory_store("the agent's own", namespace="elsewhere")
            b = await svc.memory_store("and another", namespace="elsewhere")
            await svc.memory_link(a["id"], b["id"], "related_to")

        async def three() -> bool:
            return len(receiver.got) >= 3
        await _until(three, "three deliveries")
        got = [(h["X-Webhook-Event"], json.loads(body)["data"]) for h, body in receiver.got]
        memories = [d for e, d in got if e == "memory.stored"]
        assert sorted(d["id"] for d in memories) == sorted([a["id"], b["id"]])
        assert all((d["writer"], d["origin"], d["signed_by"]) == (bot, bot, bot) for d in memories)
        [link] = [d for e, d in got if e == "link.attested"]
        assert link["observed_by"] == bot and AGENT not in (link["observed_by"], *(d["writer"] for d in memories))
    finally:
        await receiver.stop()


def test_cli_refuses_out_of_range_delivery_limits_and_ids_with_a_message(tmp_path) -> None:
    from tests.kg.test_kg_mcp_cli import _cli
    from tests.mcp.conftest import make_home
    home = make_home(tmp_path)
    for limit in ("-5", "0", "99999999999999999999"):
        r = _cli(home, "subscriptions", "deliveries", "--limit", limit)
        assert r.returncode == 1 and "error [bad_input]" in r.stderr and "Traceback" not in r.stderr, r.stderr
    for delivery_id in ("99999999999999999999", "-1"):
        r = _cli(home, "subscriptions", "replay", delivery_id)
        assert r.returncode == 1 and "error [not_found]" in r.stderr and "Traceback" not in r.stderr, r.stderr


async def test_links_a_pre_store_hook_makes_reach_link_attested_subscribers(tmp_path) -> None:
    import json as jsonlib

    from mesh import keys
    from tests.hooks.scripts import hook, write_hooks_toml, write_scripts
    cfg = make_config(tmp_path / "home")
    keys.generate_identity(cfg.keys_dir, AGENT)
    svc = await assemble.open_service(cfg, require_identity=True)
    try:
        target = await svc.memory_store("the target")
    finally:
        await svc.close()
    exe, _ = write_scripts(tmp_path / "hooks")
    delta = {"links": [{"dst_id": target["id"], "relation": "related_to", "confidence": 1.0}]}
    write_hooks_toml(cfg.hooks_path, [hook("linker", ["pre_store"], exe, "modify", jsonlib.dumps(delta))])
    svc = await assemble.open_service(cfg, require_identity=True)
    try:
        # Nobody listens: the deliveries are queued durably, which is what is checked.
        await svc.webhooks.subscribe("http://127.0.0.1:1/hook", ["link.attested"])
        made = await svc.memory_store("linked by the hook")
        [link] = made["links"]
        queued = await svc.db.read(subscriptions.deliveries, None, 10)
        assert [(d.event, jsonlib.loads(d.body)["data"]["link_id"]) for d in queued] == [
            ("link.attested", link["link_id"])]
    finally:
        await svc.close()


async def test_publishes_that_find_the_subscriber_check_stale_at_once_share_one_read(node, monkeypatch) -> None:
    svc, _ = node
    hooks = svc.webhooks
    reads: list[Any] = []
    real = hooks.db.read

    async def counted(fn: Any, *args: Any) -> Any:
        reads.append(fn)
        return await real(fn, *args)
    monkeypatch.setattr(hooks.db, "read", counted)
    hooks._subscribed = (0.0, False)  # stale
    await asyncio.gather(*(hooks.publish("link.attested", {"i": i}) for i in range(200)))
    assert reads.count(subscriptions.list_) == 1
    # A subscription made while a check is in flight is not hidden by that check's older answer.
    hooks._subscribed = (0.0, False)
    port = _free_port()
    receiver = Receiver()
    await receiver.start(port)
    try:
        check = asyncio.ensure_future(hooks.publish("link.attested", {"first": True}))
        await hooks.subscribe(f"http://127.0.0.1:{port}/hook", ["link.attested"])
        await check
        await hooks.publish("link.attested", {"second": True})

        async def second_delivered() -> bool:
            return any(b"second" in body for _, body in receiver.got)
        await _until(second_delivered, "the event published after the subscription delivered")
    finally:
        await receiver.stop()
