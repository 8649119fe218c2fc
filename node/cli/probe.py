"""``ai-memory health``: the probe a supervisor runs (Docker's HEALTHCHECK, compose, a load balancer's script). It
reads the port from the node's own config (``mesh.health_port``), asks the plain health endpoint on loopback and
exits 0 when the node answers ``ok``, 1 otherwise, with one line saying what it found. It opens no store and
needs nothing of the home but the config, so it is cheap to run every few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from node.config import NodeConfig

if TYPE_CHECKING:
    from node.cli.common import Commands

PROBE_TIMEOUT_S = 4.0
# The health server listens on loopback; a wildcard bind is asked on loopback too.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def add_parsers(sub: Commands) -> None:
    hp = sub.add_parser("health", help="probe the running node's plain health port (mesh.health_port): exit 0 when "
                                       "it answers ok, 1 when not (for Docker's HEALTHCHECK and other supervisors)")
    hp.add_argument("--ready", action="store_true",
                    help="ask /readyz instead of /healthz: also 1 while the node is degraded (no peer link up, "
                         "the store away, damaged or full)")
    hp.add_argument("--timeout", type=float, default=PROBE_TIMEOUT_S,
                    help=f"seconds to wait for the answer (default {PROBE_TIMEOUT_S:g})")
    hp.set_defaults(handler=_health)


def probe_url(cfg: NodeConfig, ready: bool) -> str | None:
    """The URL this node's health server answers on, or None when the config serves none (health_port 0)."""
    if not cfg.mesh.health_port:
        return None
    host = cfg.mesh.health_host  # a bind address
    host = WILDCARDS.get(host, host)
    bracketed = f"[{host}]" if ":" in host else host
    return f"http://{bracketed}:{cfg.mesh.health_port}/{'readyz' if ready else 'healthz'}"


def _health(args: argparse.Namespace, cfg: NodeConfig) -> int:
    import urllib.error  # the HTTP client (and ssl, email parsing) loads only for this command
    import urllib.request

    url = probe_url(cfg, args.ready)
    config = args.config or cfg.home / "config.toml"
    if url is None and not Path(config).exists():  # no file read: every setting is a default (health_port 0)
        print(f"ai-memory health: no config file at {config}: the probe reads mesh.health_port from it; give "
              "--config, or --home (or $AI_MEMORY_HOME) naming the node's home", file=sys.stderr)
        return EXIT_USAGE
    if url is None:
        print(f"ai-memory health: mesh.health_port is 0 in {config}: the node serves no plain health port to "
              "probe; set it (docs/operations.md)", file=sys.stderr)
        return EXIT_USAGE
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as r:  # noqa: S310 (a loopback http URL we built)
            body = json.loads(r.read() or b"{}")
            status = r.status
    except urllib.error.HTTPError as e:  # /readyz answers 503 with its reasons
        reasons = json.loads(e.read() or b"{}").get("reasons", [])
        why = "; ".join(f"{x.get('code')}: {x.get('message')}" for x in reasons) or e.reason
        print(f"ai-memory health: {url} answered {e.code}: {why}", file=sys.stderr)
        return EXIT_FAILED
    except (OSError, ValueError) as e:
        print(f"ai-memory health: {url}: no answer ({getattr(e, 'reason', e)})", file=sys.stderr)
        return EXIT_FAILED
    ok = status == 200 and (body.get("ready") is True if args.ready else body.get("status") == "ok")
    print(f"{'ok' if ok else 'NOT ok'}: {url} answered {status} for {body.get('agent_id', '?')}")
    return EXIT_OK if ok else EXIT_FAILED
