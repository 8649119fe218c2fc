#!/usr/bin/env python3
"""A webhook receiver that verifies each delivery of an ai-memory node (docs/permissions.md, "Webhook
subscriptions"). Standard library only; copy it and put your handling where it prints.

    AIMEM_WEBHOOK_SECRET=<the secret `ai-memory subscriptions add` printed> python3 webhook_receiver.py --port 8080

The secret is the hex text of 32 key bytes: the HMAC key is those bytes (``bytes.fromhex(secret)``), not the
64 characters of the text. The signature is hex HMAC-SHA256 over ``X-Webhook-Timestamp`` + "." + the body, as
received. A delivery whose signature does not verify, or whose timestamp is more than --window-s from now (a
replay), gets 401; a verified one 204 and one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

MAX_BODY = 1 << 20


def verify(key: bytes, timestamp: str, body: bytes, signature: str, now_ms: int, window_s: float) -> bool:
    """Whether a delivery is the node's: the signature over TIMESTAMP.BODY under ``key``, and a fresh timestamp."""
    want = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, signature):
        return False
    return timestamp.isdigit() and abs(now_ms - int(timestamp)) <= window_s * 1000


def handler(key: bytes, window_s: float) -> type[BaseHTTPRequestHandler]:
    class Delivery(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the http.server name)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, MAX_BODY))
            ok = verify(key, self.headers.get("X-Webhook-Timestamp", ""), body,
                        self.headers.get("X-Webhook-Signature", ""), time.time_ns() // 1_000_000, window_s)
            self.send_response(204 if ok else 401)
            self.end_headers()
            if ok:
                event = json.loads(body)
                print(json.dumps({"verified": True, "event": event["event"], "delivery": event.get("delivery_id"),
                                  "data": event["data"]}), flush=True)
            else:
                print(json.dumps({"verified": False, "from": self.client_address[0]}), flush=True)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
            pass  # stdout carries one line per delivery; nothing else

    return Delivery


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0: any free port (printed first)")
    p.add_argument("--window-s", type=float, default=300.0, help="largest age of a delivery's timestamp")
    args = p.parse_args()
    secret = os.environ.get("AIMEM_WEBHOOK_SECRET", "")
    try:
        key = bytes.fromhex(secret)
    except ValueError:
        key = b""
    if len(key) < 16:
        print("set AIMEM_WEBHOOK_SECRET to the hex secret `ai-memory subscriptions add` printed", file=sys.stderr)
        return 2
    server = HTTPServer((args.host, args.port), handler(key, args.window_s))
    print(json.dumps({"listening": server.server_address[1]}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
