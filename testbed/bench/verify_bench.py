"""Ed25519 verification of a link signature: attest.verify (libsodium) against OpenSSL's check, one run.

    .venv/bin/python -m testbed.bench.verify_bench [--rounds 20] [--calls 500]

Both check the same signed link payload (canonical CBOR, as received) with the same key, taking turns
batch by batch (``--calls`` checks a batch; the per-call figure of a batch is its time over ``--calls``), so
drift on a shared machine falls on both. Prints p50 / p95 / p99 of the per-call µs over the rounds and the
ratio of attest.verify to OpenSSL.
"""

from __future__ import annotations

import argparse
import statistics
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.attest import LinkPayload, sign, verify
from testbed.bench.figures import pct


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--calls", type=int, default=500)
    args = p.parse_args()
    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    payload = LinkPayload("f0e1d2c3-0000-4000-8000-000000000000", "a0b1c2d3-0000-4000-8000-000000000000",
                          "related_to", "ai:bench-1@lab", 1764633600000, None)
    sig = sign(key, payload)
    data = payload.canonical_bytes()

    def ours() -> bool:
        return verify(public, payload, sig)

    def openssl() -> None:
        public.verify(sig, data)

    assert ours()
    openssl()
    times: dict[str, list[float]] = {"attest.verify (libsodium)": [], "OpenSSL (cryptography)": []}
    for r in range(args.rounds):
        order = list(zip(times, (ours, openssl), strict=True))
        for name, fn in order if r % 2 else order[::-1]:
            t = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - t) / args.calls * 1e6)
    print(f"| per verification (µs), {args.rounds} rounds of {args.calls} | p50 | p95 | p99 |")
    print("|---|---:|---:|---:|")
    for name, xs in times.items():
        print(f"| {name} | {pct(xs, 50):.1f} | {pct(xs, 95):.1f} | {pct(xs, 99):.1f} |")
    ratio = statistics.median(times["attest.verify (libsodium)"]) / statistics.median(times["OpenSSL (cryptography)"])
    print(f"\np50 attest.verify / OpenSSL: {ratio:.2f}×")


if __name__ == "__main__":
    main()
