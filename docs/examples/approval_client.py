#!/usr/bin/env python3
"""A client of an ai-memory node's approval API (docs/permissions.md, "Approval HTTP API") that signs its
requests. Standard library only.

    python3 approval_client.py --key /var/lib/ai-memory/keys/approval.hmac --url http://127.0.0.1:7445 list
    python3 approval_client.py --key ... --url ... approve ACTION_ID --by ops@lab
    python3 approval_client.py --key ... --url ... deny ACTION_ID --by ops@lab

The key file holds the hex text of 32 key bytes (and a newline): the HMAC key is those bytes
(``bytes.fromhex(text.strip())``), not the characters. Each request carries X-Approval-Timestamp (unix ms),
X-Approval-Nonce (fresh for every request) and X-Approval-Signature, hex HMAC-SHA256 over
METHOD \\n PATH?QUERY \\n TIMESTAMP \\n NONCE \\n hex(sha256(body)).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import secrets
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def signed_headers(key: bytes, method: str, path_qs: str, body: bytes) -> dict[str, str]:
    ts, nonce = str(time.time_ns() // 1_000_000), secrets.token_hex(16)
    msg = "\n".join([method, path_qs, ts, nonce, hashlib.sha256(body).hexdigest()])
    return {"X-Approval-Timestamp": ts, "X-Approval-Nonce": nonce,
            "X-Approval-Signature": hmac.new(key, msg.encode(), hashlib.sha256).hexdigest(),
            "Content-Type": "application/json"}


def call(url: str, key: bytes, method: str, path_qs: str, data: dict[str, object] | None = None) -> tuple[int, object]:
    body = b"" if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url.rstrip("/") + path_qs, data=body if data is not None else None, method=method,
                                 headers=signed_headers(key, method, path_qs, body))
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--key", type=Path, required=True, help="<home>/keys/approval.hmac")
    p.add_argument("--url", required=True, help="http://127.0.0.1:<approval.http_port>")
    p.add_argument("what", choices=["list", "approve", "deny"])
    p.add_argument("action", nargs="?")
    p.add_argument("--by", default="operator", help="decided_by")
    args = p.parse_args()
    key = bytes.fromhex(args.key.read_text(encoding="ascii").strip())
    if args.what == "list":
        status, answer = call(args.url, key, "GET", "/v1/approvals?status=pending")
    else:
        path = f"/v1/approvals/{args.action}/{args.what}"
        status, answer = call(args.url, key, "POST", path, {"decided_by": args.by})
    print(json.dumps({"status": status, "answer": answer}))
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
