"""The auto_link reference hook: its similarity alone, then as a daemon linking inside the store transaction."""

from __future__ import annotations

import sys
from pathlib import Path

from node.config import NodeConfig
from tests.hooks.conftest import rows
from tools.auto_link.hook import AutoLinker, NamespaceIndex

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "tools" / "auto_link" / "hook.py"

K8S_A = "Upgrade procedure for the staging kubernetes cluster: drain nodes, bump the control plane"
K8S_B = "How to upgrade the staging kubernetes cluster control plane and drain the nodes"
BREAD = "Sourdough bread needs a ripe starter, flour, water and salt"


def test_similar_texts_score_high_and_unrelated_ones_are_not_proposed() -> None:
    idx = NamespaceIndex(max_docs=10)
    idx.add("k8s", K8S_A)
    idx.add("bread", BREAD)
    hits = idx.similar(K8S_B, top_k=3, threshold=0.2)
    assert [doc for doc, _ in hits] == ["k8s"] and 0.2 <= hits[0][1] <= 1.0
    assert idx.similar("completely different words here", top_k=3, threshold=0.2) == []


def test_index_is_bounded_and_forgets_the_oldest() -> None:
    idx = NamespaceIndex(max_docs=2)
    for i, text in enumerate([K8S_A, BREAD, "third memory text"]):
        idx.add(f"m{i}", text)
    assert list(idx.docs) == ["m1", "m2"]
    assert all("m0" not in bucket for bucket in idx.postings.values())


def test_linker_proposes_only_within_the_namespace_and_only_committed_memories() -> None:
    linker = AutoLinker(threshold=0.2)
    pre = {"id": "new", "content": K8S_B, "title": "", "namespace": "ops"}
    assert linker.decide("pre_store", pre) == {"decision": "allow"}
    linker.decide("post_store", {"memory": {"id": "old", "namespace": "other", "title": "", "content": K8S_A}})
    assert linker.decide("pre_store", pre) == {"decision": "allow"}
    linker.decide("post_store", {"memory": {"id": "old2", "namespace": "ops", "title": "", "content": K8S_A}})
    d = linker.decide("pre_store", pre)
    assert d["decision"] == "modify"
    assert [(p["dst_id"], p["relation"]) for p in d["delta"]["links"]] == [("old2", "related_to")]


async def test_auto_link_daemon_links_a_new_memory_in_the_same_transaction(open_service, cfg: NodeConfig) -> None:
    svc = await open_service([{"name": "auto_link", "events": ["pre_store", "post_store"], "mode": "daemon",
                               "command": [sys.executable, str(HOOK), "--threshold", "0.2"], "priority": -100}])
    a = await svc.memory_store(K8S_A, namespace="ops")
    bread = await svc.memory_store(BREAD, namespace="ops")
    b = await svc.memory_store(K8S_B, namespace="ops")
    assert [(link["dst_id"], link["relation"], link["attest_level"]) for link in b["links"]] == [
        (a["id"], "related_to", "self_signed")]
    assert "links" not in bread
    # Stored with the memory: same created_at, one change-log run, and the signature verifies.
    assert rows(cfg, "SELECT src_id, dst_id, created_at FROM memory_links") == [(b["id"], a["id"], b["created_at"])]
    assert (await svc.memory_verify(b["links"][0]["link_id"]))["signature_verified"] is True
    other = await svc.memory_store(K8S_B, namespace="elsewhere")
    assert "links" not in other
