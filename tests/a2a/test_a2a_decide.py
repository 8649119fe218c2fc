from __future__ import annotations

import pytest

from a2a import Ack, Decision, Envelope, Outcome, SeenCache, ack_for, decide, new_envelope

ME = "ai:b"
PEER = "ai:a"
NOW = 1_700_000_000_000


class FakeClock:
    def __init__(self, now_ms: float) -> None:
        self.now_ms = now_ms

    def __call__(self) -> float:
        return self.now_ms


@pytest.fixture
def seen() -> SeenCache:
    return SeenCache(maxsize=100, clock=FakeClock(NOW))


def env(sender: str = PEER, recipients: tuple[str, ...] = (ME,), ttl_ms: int = 60_000) -> Envelope:
    return new_envelope(sender, recipients, {"kind": "ping"}, now_ms=NOW, ttl_ms=ttl_ms)


def test_fresh_message_for_me_is_accepted(seen: SeenCache) -> None:
    assert decide(env(), PEER, ME, NOW, seen) == Decision(Outcome.ACCEPT)


def test_forged_sender_is_rejected(seen: SeenCache) -> None:
    assert decide(env(sender="ai:mallory"), PEER, ME, NOW, seen) == Decision(Outcome.REJECT, "sender_mismatch")


def test_message_not_addressed_to_me_is_rejected(seen: SeenCache) -> None:
    assert decide(env(recipients=("ai:c",)), PEER, ME, NOW, seen) == Decision(Outcome.REJECT, "not_a_recipient")


def test_duplicate_correlation_id_is_decided_duplicate(seen: SeenCache) -> None:
    e = env()
    seen.remember(e.correlation_id, e.expires_at)
    assert decide(e, PEER, ME, NOW, seen).outcome is Outcome.DUPLICATE


def test_expired_message_is_decided_expired(seen: SeenCache) -> None:
    e = env(ttl_ms=1)
    assert decide(e, PEER, ME, e.expires_at, seen).outcome is Outcome.EXPIRED
    assert decide(e, PEER, ME, e.expires_at - 1, seen).outcome is Outcome.ACCEPT


def test_sender_check_comes_before_everything(seen: SeenCache) -> None:
    e = env(sender="ai:mallory", recipients=("ai:c",), ttl_ms=1)
    seen.remember(e.correlation_id, e.expires_at)
    assert decide(e, PEER, ME, NOW + 10, seen).code == "sender_mismatch"


def test_duplicate_is_reported_even_when_the_retry_arrives_late(seen: SeenCache) -> None:
    e = env(ttl_ms=1_000)
    seen.remember(e.correlation_id, e.expires_at)
    assert decide(e, PEER, ME, e.expires_at - 1, seen).outcome is Outcome.DUPLICATE


def test_decide_never_mutates_the_seen_cache(seen: SeenCache) -> None:
    e = env()
    decide(e, PEER, ME, NOW, seen)
    assert e.correlation_id not in seen and len(seen) == 0


def test_ack_for_each_outcome() -> None:
    e = env()
    cid = e.correlation_id
    assert ack_for(Decision(Outcome.ACCEPT), e, ME) == Ack.ok(cid, ME)
    assert ack_for(Decision(Outcome.DUPLICATE), e, ME) == Ack(cid, ME, False, "duplicate")
    assert ack_for(Decision(Outcome.REJECT, "sender_mismatch"), e, ME) == Ack(cid, ME, False,
                                                                              "rejected:sender_mismatch")
    assert ack_for(Decision(Outcome.EXPIRED), e, ME) is None


def test_reject_decision_requires_a_code() -> None:
    with pytest.raises(ValueError):
        Decision(Outcome.REJECT)
    with pytest.raises(ValueError):
        Decision(Outcome.ACCEPT, "why")
