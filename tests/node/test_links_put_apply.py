"""links.put on the receiving side: its links applied as one run of stages answer, count, fire hooks and store
exactly as the same links sent one per link.put envelope do, on a real SQLite store."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a.envelope import RETRYABLE_REJECT_CODES
from mesh import keys, peerkeys
from node.assemble import open_service
from node.hooks import HookEvent, HookRefused, NoHooks
from node.hooks.decision import Deny
from node.service import Service, now_ms
from tests.node.conftest import AGENT, make_config
from tests.node.test_federation_apply import M1, M2, OTHER, PEER, _env, _link_put, _memory, _mput

M3 = "33333333-3333-4333-8333-333333333333"  # arrives while a link to it is held
T1, T2 = "44444444-4444-4444-8444-444444444444", "55555555-5555-4555-8555-555555555555"  # in the gated namespace

RULES = f"""
mode = "enforce"
[[rules]]
agent = "{PEER}"
namespace = "team"
operations = ["link"]
action = "deny"
"""


class _Recorder(NoHooks):
    """Records every fire; its pre_federated_link hook refuses a link whose relation is 'hook_says_no'.
    ``attached`` as told: False fires a run's payloads one after another, True all at once."""

    def __init__(self, attached: bool) -> None:
        self.fired: list[tuple[str, dict[str, Any]]] = []
        self._attached = attached

    def attached(self, event: HookEvent) -> bool:
        return self._attached

    async def fire(self, event: HookEvent, payload: dict[str, Any]) -> dict[str, Any]:
        self.fired.append((str(event), payload))
        if self._attached:
            await asyncio.sleep(0)  # as a hook program's answer does, the others run meanwhile
        if event is HookEvent.PRE_FEDERATED_LINK and payload["link"]["relation"] == "hook_says_no":
            raise HookRefused("no-links", str(event), Deny("link_refused", "not this one"))
        return payload


async def _open(home: Path, peer_pub: Path, attached: bool) -> tuple[Service, _Recorder]:
    """A node that knows the peer's key, denies the peer links in namespace 'team', and holds a link to a
    missing memory for up to a minute (its end arrives well before)."""
    cfg = make_config(home, federation={"orphan_hold_s": 60.0}, permissions={"reload_check_s": 1e-9})
    keys.generate_identity(cfg.keys_dir, AGENT)
    peerkeys.import_peer(cfg.peers_dir, peer_pub)
    cfg.permissions_path.write_text(RULES, encoding="utf-8")
    hooks = _Recorder(attached)
    return await open_service(cfg, require_identity=True, hooks=hooks), hooks


def _bodies(key: Ed25519PrivateKey, before: int) -> list[dict[str, Any]]:
    """One of each answer a link can get, in the order a links.put carries them."""
    ok = _link_put(key, M1, M2, relation="accepted")
    signer_mismatch = {**_link_put(key, M1, M2, relation="signer_mismatch"), "signed_by": OTHER}
    return [
        _link_put(key, M1, M2, relation="stored_before"),  # a duplicate
        ok,
        _link_put(Ed25519PrivateKey.generate(), M1, M2, relation="forged"),  # bad_signature
        _link_put(key, M1, M3, relation="late_end"),  # held until M3 arrives
        _link_put(key, M1, M2, relation="hook_says_no"),
        _link_put(key, T1, T2, relation="gated"),  # permission_denied
        _link_put(key, M1, M2, relation="expired", valid_until=before - 500),
        signer_mismatch,
        _link_put(None, M1, M2, observed_by=OTHER, relation="relayed"),  # unverified_relay
        _link_put(None, M2, M1, relation="unsigned_by_sender"),
        dict(ok),  # the same link twice in one envelope: the second is a duplicate
    ]


async def _seed(svc: Service, first: dict[str, Any]) -> None:
    for m in (_memory(M1), _memory(M2), _memory(T1, namespace="team"), _memory(T2, namespace="team")):
        assert (await svc.replicator.apply(_env(PEER, _mput(m)), PEER)).accepted
    assert (await svc.replicator.apply(_env(PEER, first), PEER)).accepted


async def _until_stored(svc: Service, relation: str) -> None:
    for _ in range(3000):  # bounded: the other links are stored long before the held one's hold ends
        if relation in {link["relation"] for link in await svc.links_list(limit=100)}:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{relation} was never stored")


def _by_link(fired: list[tuple[str, dict[str, Any]]]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for event, payload in fired:
        if "link" in payload:
            out.setdefault(payload["link"]["relation"], []).append((event, payload))
    return out


def _stored(links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({k: v for k, v in link.items() if k != "created_at"} for link in links),
                  key=lambda link: link["link_id"])


@pytest.mark.parametrize("attached", [False, True], ids=["hooks one after another", "hooks all at once"])
async def test_a_mixed_links_put_answers_each_link_as_its_own_link_put_does(tmp_path: Path, attached: bool) -> None:
    peer = keys.generate_identity(tmp_path / "peer-keys", PEER)
    bodies = _bodies(peer.private_key, now_ms())
    one_by_one, one_hooks = await _open(tmp_path / "one", peer.pub_path, attached)
    batched, batch_hooks = await _open(tmp_path / "batch", peer.pub_path, attached)
    try:
        for svc in (one_by_one, batched):
            await _seed(svc, bodies[0])
        one_hooks.fired.clear()
        batch_hooks.fired.clear()
        before = Counter(one_by_one.replicator.counters), Counter(batched.replicator.counters)

        # One link.put per link, one after another; the held link's end arrives while it waits.
        answers = []
        for body in bodies:
            task = asyncio.create_task(one_by_one.replicator.apply(_env(PEER, body), PEER))
            if body["link"]["relation"] == "late_end":
                await asyncio.sleep(0.05)  # (had it come first, the link would not wait: the same answer)
                assert (await one_by_one.replicator.apply(_env(PEER, _mput(_memory(M3))), PEER)).accepted
            answers.append(await task)
        codes = [None if a.accepted else a.reason.removeprefix("rejected:") for a in answers]

        # The same links in one links.put: the held link does not hold up the others.
        packed = {"kind": "links.put", "links": [{k: v for k, v in b.items() if k != "kind"} for b in bodies]}
        task = asyncio.create_task(batched.replicator.apply(_env(PEER, packed), PEER))
        await _until_stored(batched, "accepted")
        assert not task.done(), "the other links are stored while one waits for its end"
        assert (await batched.replicator.apply(_env(PEER, _mput(_memory(M3))), PEER)).accepted
        ack = await task
        stored = _stored(await one_by_one.links_list(limit=100)), _stored(await batched.links_list(limit=100))
        audits = (await one_by_one.audit_verify())["ok"], (await batched.audit_verify())["ok"]
    finally:
        await one_by_one.close()
        await batched.close()

    assert codes == [None, None, "bad_signature", None, "link_refused", "permission_denied", "expired_link",
                     "signer_mismatch", "unverified_relay", None, None]
    # The one ACK: a retryable code first, else the first permanent one.
    refused = [c for c in codes if c is not None]
    want = next((c for c in refused if c in RETRYABLE_REJECT_CODES), refused[0])
    assert ack.reason == f"rejected:{want}" and ack.permanent
    assert stored[0] == stored[1] and len(stored[0]) == 4 and audits == (True, True)

    after = Counter(one_by_one.replicator.counters) - before[0], Counter(batched.replicator.counters) - before[1]
    assert after[1] == after[0] + Counter({"links.put": 1})
    assert (after[0]["link:duplicate"], after[0]["link:peer_attested"], after[0]["link:unsigned"]) == (2, 2, 1)
    assert after[0]["rejected:bad_signature"] == after[0]["bad_signature"] == 1
    # Every link's hooks fired with the same payloads in the same order...
    one, batch = _by_link(one_hooks.fired), _by_link(batch_hooks.fired)
    assert {rel: fired for rel, fired in batch.items() if rel != "accepted"} == \
        {rel: fired for rel, fired in one.items() if rel != "accepted"}
    assert [e for e, _ in one["hook_says_no"]] == ["pre_federated_link"]
    assert [e for e, _ in one["late_end"]] == ["pre_federated_link", "post_federated_link"]
    assert "forged" not in one and "gated" in one
    # ...but for the link sent twice: one after another, the second is a duplicate at its lookup, before any hook;
    # twice in one envelope (as twice in one batch frame) both pass the lookup and the second finds the first
    # only in the write: its post hook says stored false.
    assert [(e, p.get("stored")) for e, p in one["accepted"]] == [("pre_federated_link", None),
                                                                   ("post_federated_link", True)]
    assert [(e, p.get("stored")) for e, p in batch["accepted"]] == [("pre_federated_link", None)] * 2 + [
        ("post_federated_link", True), ("post_federated_link", False)]
