"""The one-node walk-through: a throwaway home, an identity, two memories, a signed link, its verification."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from mesh import keys
from node.assemble import open_service
from node.config import from_dict


async def walkthrough(home: Path) -> dict:
    cfg = from_dict({"agent_id": "ai:demo@local", "home": str(home)}, env={})
    ident = keys.generate_identity(cfg.keys_dir, cfg.agent_id)
    svc = await open_service(cfg, require_identity=True)
    try:
        a = await svc.memory_store("The mesh signs every link with Ed25519 over canonical CBOR.",
                                   title="signing", tags=["design"])
        b = await svc.memory_store("Peers verify inbound links against the sender's .pub file.",
                                   title="verification", tags=["design"])
        link = await svc.memory_link(a["id"], b["id"], "related_to")
        verified = await svc.memory_verify(link["link_id"])
        recall = await svc.memory_recall("verify links", limit=2)
        audit = await svc.audit_verify()
    finally:
        await svc.close()
    return {"agent_id": ident.agent_id, "fingerprint": ident.fingerprint, "memories": [a["id"], b["id"]],
            "link": {k: link[k] for k in ("link_id", "relation", "attest_level")}, "verify": verified,
            "recall_top": [h["title"] for h in recall], "audit": audit}


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="ai-memory-demo-") as tmp:
        result = asyncio.run(walkthrough(Path(tmp)))
    print(json.dumps(result, indent=2))
    return 0 if result["verify"]["signature_verified"] and result["audit"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
