"""The ``ai-memory`` command line.

Exit codes: 0 success; 1 an operation failed (the message names the stable error code);
2 usage error; 3 a check ran and found a problem (a link that does not verify, a broken audit chain).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from node import mcp_cli
from node.config import HOME_ENV, NodeConfig, load_config
from node.errors import describe, is_project_error
from node.version import version

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CHECK = 0, 1, 2, 3

Handler = Callable[[argparse.Namespace, NodeConfig], int]
_HANDLERS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _HANDLERS[name] = fn
        return fn
    return register


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ai-memory", description="attested-mesh node: memories, signed links, federation.")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    p.add_argument("--config", type=Path, help="node config TOML (default: <home>/config.toml when it exists)")
    p.add_argument("--home", type=Path, help=f"node home directory (overrides {HOME_ENV} and the config file)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    ident = sub.add_parser("identity", help="manage this node's Ed25519 identity and trusted peer keys")
    isub = ident.add_subparsers(dest="sub", required=True, metavar="ACTION")
    g = isub.add_parser("generate", help="create <home>/keys/<agent_id>.priv (0600) and .pub (0644)")
    g.add_argument("--agent-id", required=True, help="immutable agent id, e.g. ai:node-1@lab")
    g.add_argument("--force", action="store_true", help="replace an existing identity")
    rot = isub.add_parser(
        "rotate", help="replace this node's key; the old .pub stays in <home>/keys/retired/ so old signatures verify",
        description="Replace this node's Ed25519 identity key with a new one. The old public key is kept in "
                    "<home>/keys/retired/<agent_id>.<fingerprint>.pub, so links this node signed before keep "
                    "verifying here; the old private key is destroyed. The TLS certificate must then be reissued "
                    "over the new key (done here with --ca, or when <home>/ca holds the mesh CA), the node "
                    "restarted, and the new .pub imported by every peer: until a peer imports it, that peer "
                    "refuses this node's connections (peer_key_mismatch). Stop the node first: a running node "
                    "keeps using the old key until it restarts.")
    rot.add_argument("--ca", type=Path, metavar="DIR",
                     help="mesh CA directory (ca.key, ca.crt): reissue this node's certificate over the new key "
                          "(default: <home>/ca when it holds the CA key)")
    rot.add_argument("--days", type=int, default=365, help="validity of the reissued certificate (default 365)")
    rot.add_argument("--json", action="store_true", help="print the result as JSON")
    i = isub.add_parser("import", help="trust a peer: copy its .pub into <home>/peers/ (a new key for a known "
                                       "peer retires the old one to <home>/peers/retired/)")
    i.add_argument("file", type=Path, help="the peer's <agent_id>.pub")
    i.add_argument("--agent-id", help="peer agent id (default: the file name without .pub)")
    i.add_argument("--force", action="store_true",
                   help="replace a trusted key file that cannot be read (it cannot be kept in the keyring)")
    isub.add_parser("list", help="this node's identity and trusted peers, with fingerprints; retired keys "
                                 "marked").add_argument("--json", action="store_true")
    e = isub.add_parser("export-pub", help="copy this node's .pub to a directory to hand to other operators")
    e.add_argument("--out", type=Path, default=Path("."), help="destination directory (default: .)")

    s = sub.add_parser("store", help="store a memory")
    s.add_argument("content", help="memory text")
    s.add_argument("--title", default="", help="short title (default none)")
    s.add_argument("--namespace", default="default", help="namespace (default 'default'); [federation.namespaces] "
                                                          "may restrict which peers it replicates to")
    s.add_argument("--tag", action="append", default=[], dest="tags", help="a tag; repeat for more")
    s.add_argument("--priority", type=int, default=5, help="1..10 (default 5)")
    s.add_argument("--confidence", type=float, default=1.0, help="0..1 (default 1)")
    s.add_argument("--source", default="", help="where the memory came from (free text)")
    s.add_argument("--json", action="store_true")

    up = sub.add_parser("update", help="change fields of a memory (new version, replicated)")
    up.add_argument("id", help="memory id")
    up.add_argument("--content", help="new text")
    up.add_argument("--title", help="new title")
    up.add_argument("--tag", action="append", dest="tags", help="a tag; repeat for more; replaces all tags")
    up.add_argument("--priority", type=int, help="1..10")
    up.add_argument("--confidence", type=float, help="0..1")
    up.add_argument("--source", help="where the memory came from (free text)")
    up.add_argument("--json", action="store_true")

    gm = sub.add_parser("get", help="show one memory")
    gm.add_argument("id", help="memory id")
    gm.add_argument("--json", action="store_true")

    lm = sub.add_parser("list", help="list memories, newest first")
    lm.add_argument("--namespace", help="only this namespace")
    lm.add_argument("--limit", type=int, default=50, help="most rows (default 50, at most limits.max_recall_limit)")
    lm.add_argument("--offset", type=int, default=0, help="rows to skip (default 0)")
    lm.add_argument("--json", action="store_true")

    r = sub.add_parser("recall", help="full-text recall, ranked by BM25")
    r.add_argument("query", help="search text (any text is a safe query)")
    r.add_argument("--limit", type=int, default=10, help="most hits (default 10)")
    r.add_argument("--namespace", help="only this namespace")
    r.add_argument("--json", action="store_true")

    lk = sub.add_parser("link", help="link two memories (signed with the node key when present)")
    lk.add_argument("src_id", help="memory id the link starts at")
    lk.add_argument("dst_id", help="memory id the link points to")
    lk.add_argument("relation", help="e.g. related_to, contradicts, derived_from")
    lk.add_argument("--valid-until", type=int, help="end of validity, unix milliseconds")
    lk.add_argument("--confidence", type=float, help="0..1")
    lk.add_argument("--json", action="store_true")

    ls = sub.add_parser("links", help="list links")
    ls.add_argument("--attest-level", choices=["unsigned", "self_signed", "peer_attested"],
                    help="only links at this level")
    ls.add_argument("--limit", type=int, default=50, help="most rows (default 50)")
    ls.add_argument("--json", action="store_true")

    v = sub.add_parser("verify", help="re-derive a link's or a memory version's signed payload and check its "
                                      "signature (exit 3 if it fails)")
    v.add_argument("id", help="a link_id, or a memory id (its current version is checked)")
    v.add_argument("--json", action="store_true")

    kg = sub.add_parser("kg", help="the knowledge graph over the links: neighbours, paths, timeline, invalidate")
    kgsub = kg.add_subparsers(dest="sub", required=True, metavar="ACTION")
    kq = kgsub.add_parser("query", help="memories reachable from one memory, each with the path that reached it")
    kq.add_argument("memory_id", help="the memory to start from")
    kq.add_argument("--depth", type=int, default=2, help="hops, 1..kg.max_depth (default 2)")
    kq.add_argument("--relation", action="append", dest="relations", help="only these relations (repeatable)")
    kq.add_argument("--as-of", type=int, help="links valid at this instant, unix ms (default now)")
    kq.add_argument("--limit", type=int, help="most neighbours (default kg.max_results)")
    kq.add_argument("--json", action="store_true")
    kp = kgsub.add_parser("paths", help="simple paths between two memories, shortest first")
    kp.add_argument("src_id", help="memory id the paths start at")
    kp.add_argument("dst_id", help="memory id the paths end at")
    kp.add_argument("--max-depth", type=int, default=3, help="most links per path, 1..kg.max_depth (default 3)")
    kp.add_argument("--limit", type=int, default=10, help="most paths, 1..kg.max_paths (default 10)")
    kp.add_argument("--relation", action="append", dest="relations", help="only these relations (repeatable)")
    kp.add_argument("--as-of", type=int, help="links valid at this instant, unix ms (default now)")
    kp.add_argument("--json", action="store_true")
    kt = kgsub.add_parser("timeline", help="the links touching a memory over time")
    kt.add_argument("memory_id", help="the memory whose links to show")
    kt.add_argument("--limit", type=int, help="most links, 1..kg.max_timeline (default all up to it)")
    kt.add_argument("--json", action="store_true")
    ki = kgsub.add_parser("invalidate", help="end a link's validity with a signed invalidation (replicated)")
    ki.add_argument("link_id", help="the link to end")
    ki.add_argument("--valid-until", type=int, help="end of validity, unix ms (default now)")
    ki.add_argument("--json", action="store_true")

    _transcript_parsers(sub)

    a = sub.add_parser("audit", help="the append-only signed event chain")
    asub = a.add_subparsers(dest="sub", required=True, metavar="ACTION")
    asub.add_parser("verify", help="walk the hash chain; exit 3 and name the first bad seq if broken").add_argument(
        "--json", action="store_true")

    sv = sub.add_parser("serve", help="run the node: mTLS mesh server, peer links, outbox sender, local MCP")
    sv.set_defaults(json=False)

    m = sub.add_parser("mesh", help="the mesh CA and node TLS certificates")
    msub = m.add_subparsers(dest="sub", required=True, metavar="ACTION")
    ca = msub.add_parser("ca", help="mesh certificate authority")
    casub = ca.add_subparsers(dest="sub2", required=True, metavar="ACTION")
    ci = casub.add_parser("init", help="create ca.key (0600) and a self-signed ca.crt in --out")
    ci.add_argument("--out", type=Path, required=True, help="directory for ca.key and ca.crt")
    ci.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    ci.add_argument("--force", action="store_true", help="replace an existing CA")
    cert = msub.add_parser("cert", help="node certificates")
    certsub = cert.add_subparsers(dest="sub2", required=True, metavar="ACTION")
    cis = certsub.add_parser("issue", help="issue a node certificate over the node's own Ed25519 identity key")
    cis.add_argument("--ca", type=Path, required=True, help="CA directory (from `mesh ca init`)")
    cis.add_argument("--agent-id", required=True, help="the node's agent id, e.g. ai:node-1@lab")
    cis.add_argument("--pub", type=Path, required=True, help="the node's <agent_id>.pub")
    cis.add_argument("--out", type=Path, help="certificate path (default: <home>/tls/node.crt from the config)")
    cis.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    cis.add_argument("--ip", action="append", default=[], help="extra IP SAN (repeatable)")

    a2 = sub.add_parser("a2a", help="A2A messaging tools")
    a2sub = a2.add_subparsers(dest="sub", required=True, metavar="ACTION")
    snd = a2sub.add_parser("send", help="send one message to a peer and print its ACK and latency")
    snd.add_argument("--to", required=True, help="peer agent id (its url comes from [[mesh.peers]] or --url)")
    snd.add_argument("--url", help="peer base url, e.g. https://127.0.0.1:7444")
    snd.add_argument("--kind", default="ping", choices=["ping"], help="payload kind (default ping)")
    snd.add_argument("--correlation-id", help="reuse a correlation id (to see duplicate handling)")
    snd.add_argument("--ttl", type=float, help="seconds until expires_at (default a2a.ttl_s; <= 0 sends expired)")
    snd.add_argument("--queue", action="store_true",
                     help="write it to the outbox instead; the running node delivers it with retries "
                          "(the peer must be in [[mesh.peers]]; --url is not used)")
    snd.add_argument("--json", action="store_true")
    dl = a2sub.add_parser("dead-letters", help="messages that exhausted their retries; --replay re-sends")
    dl.add_argument("--peer", help="only this peer")
    g2 = dl.add_mutually_exclusive_group()
    g2.add_argument("--replay", type=int, metavar="ID", help="re-queue one dead letter (fresh id and expiry)")
    g2.add_argument("--replay-all", action="store_true", help="re-queue every dead letter (of --peer)")
    dl.add_argument("--json", action="store_true")

    mcp_cli.add_parser(sub)

    dr = sub.add_parser("doctor", help="what this node runs on (storage backend, schema, kg backend, key, audit "
                                       "chain) and its hooks; exit 3 when a check fails")
    dr.add_argument("--hooks", action="store_true",
                    help="only the hooks: per event in chain order, daemon state, fire/deny/timeout/crash counts")
    dr.add_argument("--json", action="store_true")

    pe = sub.add_parser("peers", help="peers: key fingerprint, link state, last ACK, outbox, dead letters, sync "
                                      "(live from the running node; from the store when none runs)")
    pe.add_argument("--json", action="store_true")
    st = sub.add_parser("status", help="the node's live state: identity, links, outbox, dead letters, hooks "
                                       "(from the running node; from the store when none runs)")
    st.add_argument("--json", action="store_true")
    _permission_parsers(sub)
    p.add_argument("--json", action="store_true", help="machine-readable output (where the command has it)")
    _global_options_anywhere(p)
    return p


def _global_options_anywhere(parser: argparse.ArgumentParser) -> None:
    """Accept --config, --home and --json after the subcommand as well as before it.

    A subcommand's option defaults to SUPPRESS so that a value given before the subcommand survives
    (argparse copies a subparser's defaults over the parent's values)."""
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public walk of its subparsers
        if not isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            continue
        for sub in set(action.choices.values()):
            for a in sub._actions:  # noqa: SLF001
                if a.option_strings == ["--json"]:
                    a.default = argparse.SUPPRESS
                    a.help = a.help or "print the result as JSON"
            present = {o for a in sub._actions for o in a.option_strings}  # noqa: SLF001
            if "--config" not in present:
                sub.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            if "--home" not in present:
                sub.add_argument("--home", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            _global_options_anywhere(sub)


def _permission_parsers(sub: Any) -> None:
    ops = "store, update, link, recall, get, list, verify, replay or *"
    pm = sub.add_parser("permissions", help="permission rules (docs/permissions.md)")
    psub = pm.add_subparsers(dest="sub", required=True, metavar="ACTION")
    psub.add_parser("list", help="the rules in force, in evaluation order, and the mode").add_argument(
        "--json", action="store_true")
    ck = psub.add_parser("check", help="what the rules answer for one request (whatever the mode)")
    ck.add_argument("--agent", required=True, help="agent id (this node's own for local callers, or a peer's)")
    ck.add_argument("--namespace", required=True, help="namespace the request writes or reads")
    ck.add_argument("--operation", required=True, help=ops)
    ck.add_argument("--json", action="store_true")
    ad = psub.add_parser("add", help="add a runtime rule (stored in the database; a running node sees it)")
    ad.add_argument("--agent", required=True, help="agent id or *")
    ad.add_argument("--namespace", required=True, help="namespace (its subtree too) or *")
    ad.add_argument("--operation", action="append", required=True, dest="operations", help=f"repeatable: {ops}")
    ad.add_argument("--action", required=True, choices=["allow", "deny", "ask"],
                    help="allow, deny, or ask (park the write until a person approves it)")
    ad.add_argument("--no-inherit", action="store_true",
                    help="break inheritance here: rules on the namespaces above are not consulted")
    ad.add_argument("--json", action="store_true")

    ap = sub.add_parser("approvals", help="pending actions parked by an ask")
    asub = ap.add_subparsers(dest="sub", required=True, metavar="ACTION")
    al = asub.add_parser("list", help="pending actions, oldest first")
    al.add_argument("--status", default="pending", choices=["pending", "applied", "denied", "expired", "failed"],
                    help="which actions (default pending)")
    al.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    al.add_argument("--json", action="store_true")
    for name, what in (("approve", "run the parked write now (exactly once)"), ("deny", "refuse it for good")):
        d = asub.add_parser(name, help=what)
        d.add_argument("id", help="pending action id")
        d.add_argument("--by", default=os.environ.get("USER") or "cli", help="who decides (default $USER)")
        if name == "approve":
            d.add_argument("--remember", choices=["once", "forever"], default="once",
                           help="forever: answer the same ask for this namespace from now on")
        d.add_argument("--json", action="store_true")

    rk = asub.add_parser("rotate-key", help="a new HMAC key for the approval API; the old one verifies for "
                                            "approval.key_grace_s more (a running node sees it at once)")
    rk.add_argument("--json", action="store_true")

    sb = sub.add_parser("subscriptions", help="webhook subscriptions (signed deliveries, retries, dead letters)")
    ssub = sb.add_subparsers(dest="sub", required=True, metavar="ACTION")
    sa = ssub.add_parser("add", help="subscribe a URL to events; prints the signing secret once")
    sa.add_argument("--url", required=True, help="where deliveries are POSTed (signed with the secret)")
    sa.add_argument("--event", action="append", required=True, dest="events",
                    help="repeatable: approval.requested, approval.decided, memory.stored, link.attested or *")
    sa.add_argument("--json", action="store_true")
    ssub.add_parser("list", help="subscriptions").add_argument("--json", action="store_true")
    sd = ssub.add_parser("deliveries", help="deliveries, oldest first")
    sd.add_argument("--status", choices=["pending", "delivered", "dead"], help="only these (default all)")
    sd.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    sd.add_argument("--json", action="store_true")
    sr = ssub.add_parser("replay", help="queue a dead delivery again (the running node sends it)")
    sr.add_argument("id", type=int, help="delivery id (from `subscriptions deliveries --status dead`)")
    sr.add_argument("--json", action="store_true")


def _transcript_parsers(sub: Any) -> None:
    tr = sub.add_parser("transcript", help="conversation trails behind memories: store, replay, lifecycle")
    trsub = tr.add_subparsers(dest="sub", required=True, metavar="ACTION")
    ts = trsub.add_parser("store", help="store a transcript (zstd-compressed, signed) citing spans of it")
    ts.add_argument("file", type=Path, help="the transcript text, UTF-8 ('-' reads stdin)")
    ts.add_argument("--namespace", default="default",
                    help="namespace to store it in (its [transcripts] policy applies)")
    ts.add_argument("--span", action="append", dest="spans", default=[], metavar="MEMORY_ID:START:END",
                    help="a memory drawn from [START, END) (Unicode code points) of the text (repeatable)")
    ts.add_argument("--json", action="store_true")
    tp = trsub.add_parser("replay", help="the transcript spans a memory was drawn from (exit 1 when not permitted)")
    tp.add_argument("memory_id", help="the memory whose transcript spans to show")
    tp.add_argument("--full", action="store_true", help="whole transcripts, where the namespace allows it")
    tp.add_argument("--json", action="store_true")
    trsub.add_parser("lifecycle", help="archive transcripts past their TTL, delete archived ones past "
                                       "prune_after_s").add_argument("--json", action="store_true")


def resolve_config(args: argparse.Namespace) -> NodeConfig:
    env = dict(os.environ)
    if args.home is not None:
        env[HOME_ENV] = str(args.home)
    path = args.config
    if path is None:
        home = Path(env.get(HOME_ENV) or "~/.config/ai-memory").expanduser()
        candidate = home / "config.toml"
        path = candidate if candidate.exists() else None
    return load_config(path, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    key = " ".join(x for x in (args.cmd, getattr(args, "sub", None), getattr(args, "sub2", None)) if x)
    try:
        cfg = resolve_config(args)
        return _HANDLERS[key](args, cfg)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place errors become messages and exit codes
        if not is_project_error(exc):
            raise
        d = describe(exc)
        print(f"ai-memory: error [{d.code}]: {d.message}", file=sys.stderr)
        return EXIT_FAILED


def run_async(coro: Awaitable[int]) -> int:
    return asyncio.run(coro)  # type: ignore[arg-type]


def emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(human(data))


def _check_home(cfg: NodeConfig) -> None:
    """Refuse a home that does not exist rather than create a store there (a mistyped --home)."""
    if not cfg.home.is_dir():
        from node.errors import ServiceError
        raise ServiceError("home_not_found",
                           f"no node home at {cfg.home} (mistyped --home or {HOME_ENV}?); a new node starts with "
                           f"`ai-memory --home {cfg.home} identity generate --agent-id ...`")


def with_service(fn: Callable[[Any], Awaitable[int]], cfg: NodeConfig, *, require_identity: bool = False) -> int:
    from node.assemble import open_service

    _check_home(cfg)

    async def go() -> int:
        svc = await open_service(cfg, require_identity=require_identity)
        try:
            return await fn(svc)
        finally:
            await svc.close()

    return run_async(go())


command("mcp")(mcp_cli.handler)


# ---- identity -----------------------------------------------------------------------------

@command("identity generate")
def _identity_generate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    ident = keys.generate_identity(cfg.keys_dir, args.agent_id, force=args.force)
    print(f"identity {ident.agent_id}  fingerprint {ident.fingerprint}")
    print(f"  private key {ident.priv_path} (0600)")
    print(f"  public key  {ident.pub_path} (hand this file to peer operators)")
    return EXIT_OK


@command("identity rotate")
def _identity_rotate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import ca, keys
    from node.errors import ServiceError
    if args.days < 1:
        raise ServiceError("bad_input", f"--days must be at least 1, got {args.days}")
    ca_dir = args.ca
    if ca_dir is None and ca.ca_paths(cfg.home / "ca").key.exists():
        ca_dir = cfg.home / "ca"
    agent_id = keys.load_identity(cfg.keys_dir, cfg.agent_id or None).agent_id
    ips: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()
    if ca_dir is not None:
        ca.load_ca(ca_dir)  # a CA that cannot issue is refused before anything changes
        # The reissued certificate answers the same addresses as the old one.
        ips, dns = ca.extra_sans(cfg.cert_path)
    ident, retired = keys.rotate_identity(cfg.keys_dir, agent_id)
    out: dict[str, Any] = {"agent_id": agent_id, "fingerprint": ident.fingerprint, "retired_fingerprint": retired,
                           "retired_path": str(cfg.keys_dir / keys.RETIRED_DIR
                                               / keys.retired_file_name(agent_id, retired)),
                           "pub": str(ident.pub_path), "certificate": None, "certificate_error": None}
    if ca_dir is not None:
        try:
            ca.issue_node_cert(ca_dir, agent_id, ident.pub_path, cfg.cert_path, validity_days=args.days,
                               extra_ips=ips, extra_dns=dns)
            out["certificate"] = str(cfg.cert_path)
        except Exception as exc:  # the rotation is done: say what is left to do, and exit non-zero
            if not is_project_error(exc):
                raise
            d = describe(exc)
            out["certificate_error"] = {"code": d.code, "message": d.message}
    emit(args, out, lambda d: _rotation_steps(d, cfg))
    if out["certificate_error"]:
        e = out["certificate_error"]
        print(f"ai-memory: error [{e['code']}]: key rotated, but the certificate was not reissued: {e['message']}",
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _rotation_steps(d: dict[str, Any], cfg: NodeConfig) -> str:
    lines = [f"identity {d['agent_id']} rotated: new key {d['fingerprint']}, retired key "
             f"{d['retired_fingerprint']} (kept in {d['retired_path']})"]
    steps = []
    if d["certificate"]:
        lines.append(f"certificate reissued over the new key: {d['certificate']}")
    else:
        if d["certificate_error"]:
            e = d["certificate_error"]
            lines.append(f"the certificate was NOT reissued: [{e['code']}] {e['message']}")
        steps.append("reissue the TLS certificate over the new key (the node will not start until then): "
                     f"ai-memory mesh cert issue --ca CA_DIR --agent-id '{d['agent_id']}' --pub '{d['pub']}' "
                     f"--out '{cfg.cert_path}'")
    steps.append("restart the node (a running node keeps using the old key)")
    steps.append(f"hand {d['pub']} to every peer operator; they run `ai-memory identity import` on it, which keeps "
                 "the old key in their keyring. Until then they refuse this node: peer_key_mismatch")
    lines += [f"{n}. {step}" for n, step in enumerate(steps, 1)]
    return "\n".join(lines)


@command("identity import")
def _identity_import(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    peer = keys.import_peer(cfg.peers_dir, args.file, agent_id=args.agent_id, force=args.force)
    print(f"trusted peer {peer.agent_id}  fingerprint {peer.fingerprint}  ({peer.path})")
    if peer.retired_fingerprint is not None:
        print(f"  {peer.agent_id} rotated: its previous key {peer.retired_fingerprint} is kept in "
              f"{peer.retired_path} (what it signed keeps verifying; connections must use the new key)")
    return EXIT_OK


@command("identity list")
def _identity_list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    infos = keys.list_keys(cfg.keys_dir, cfg.peers_dir)
    rows = [{"agent_id": k.agent_id, "fingerprint": k.fingerprint, "trust": k.trust, "retired": k.retired,
             "path": str(k.path)} for k in infos]

    def human(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return f"no identity or peers under {cfg.home}"
        width = max(len(r["agent_id"]) for r in rows)
        return "\n".join(f"{r['agent_id']:<{width}}  {r['fingerprint']}  {r['trust']}"
                         + ("  retired (verifies old signatures only)" if r["retired"] else "") for r in rows)

    emit(args, rows, human)
    return EXIT_OK


@command("identity export-pub")
def _identity_export(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    ident = keys.load_identity(cfg.keys_dir, cfg.agent_id or None)
    out = keys.export_pub(cfg.keys_dir, ident.agent_id, args.out)
    print(out)
    return EXIT_OK


# ---- memories and links -------------------------------------------------------------------

def _memory_line(m: dict[str, Any]) -> str:
    title = f" {m['title']!r}" if m["title"] else ""
    text = m["content"] if len(m["content"]) <= 80 else m["content"][:77] + "..."
    return f"{m['id']}  [{m['namespace']}]{title} {text}"


@command("store")
def _store(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        m = await svc.memory_store(args.content, title=args.title, namespace=args.namespace, tags=args.tags,
                                   priority=args.priority, confidence=args.confidence, source=args.source)
        emit(args, m, lambda m: m["id"])
        return EXIT_OK
    return with_service(go, cfg)


@command("update")
def _update(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        m = await svc.memory_update(args.id, content=args.content, title=args.title, tags=args.tags,
                                    priority=args.priority, confidence=args.confidence, source=args.source)
        emit(args, m, lambda m: f"{m['id']} version {m['version']}")
        return EXIT_OK
    return with_service(go, cfg)


@command("get")
def _get(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        m = await svc.memory_get(args.id)
        emit(args, m, lambda m: "\n".join(f"{k}: {v}" for k, v in m.items()))
        return EXIT_OK
    return with_service(go, cfg)


@command("list")
def _list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        ms = await svc.memory_list(namespace=args.namespace, limit=args.limit, offset=args.offset)
        emit(args, ms, lambda ms: "\n".join(map(_memory_line, ms)) or "no memories")
        return EXIT_OK
    return with_service(go, cfg)


@command("recall")
def _recall(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        hits = await svc.memory_recall(args.query, limit=args.limit, namespace=args.namespace)
        emit(args, hits, lambda hs: "\n".join(f"{h['score']:8.3f}  {_memory_line(h)}" for h in hs) or "no match")
        return EXIT_OK
    return with_service(go, cfg)


def _link_line(link: dict[str, Any]) -> str:
    return (f"{link['link_id']}  {link['src_id']} -[{link['relation']}]-> {link['dst_id']}  "
            f"{link['attest_level']}  by {link['observed_by']}")


@command("link")
def _link(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        link = await svc.memory_link(args.src_id, args.dst_id, args.relation, valid_until=args.valid_until,
                                     confidence=args.confidence)
        emit(args, link, _link_line)
        return EXIT_OK
    return with_service(go, cfg)


@command("links")
def _links(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        rows = await svc.links_list(attest_level=args.attest_level, limit=args.limit)
        emit(args, rows, lambda rows: "\n".join(map(_link_line, rows)) or "no links")
        return EXIT_OK
    return with_service(go, cfg)


@command("verify")
def _verify(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.memory_verify(args.id)

        def human(r: dict[str, Any]) -> str:
            verdict = "VERIFIED" if r["signature_verified"] else f"NOT VERIFIED ({r['reason']})"
            what = r["link_id"] if "link_id" in r else f"{r['memory_id']} v{r['version']}"
            return f"{what}  {verdict}  attest_level={r['attest_level']}  signed_by={r['signed_by']}"

        emit(args, r, human)
        return EXIT_OK if r["signature_verified"] else EXIT_CHECK
    return with_service(go, cfg)


@command("audit verify")
def _audit_verify(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.audit_verify()

        def human(r: dict[str, Any]) -> str:
            if r["ok"]:
                return f"audit chain intact: {r['checked']} event(s) checked"
            return f"audit chain BROKEN at seq {r['first_bad_seq']}: {r['reason']}"

        emit(args, r, human)
        return EXIT_OK if r["ok"] else EXIT_CHECK
    return with_service(go, cfg)


# ---- node process and mesh --------------------------------------------------------------

@command("serve")
def _serve(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node import log
    from node.node import run_serve
    log.setup(cfg.agent_id or "?", cfg.log.level, cfg.log.format)
    return run_serve(cfg)


@command("mesh ca init")
def _ca_init(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import ca
    paths = ca.init_ca(args.out, validity_days=args.days, force=args.force)
    print(f"CA key  {paths.key} (0600, keep it offline)")
    print(f"CA cert {paths.cert} (give to every node as mesh.ca_cert)")
    return EXIT_OK


@command("mesh cert issue")
def _cert_issue(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import ca
    out = args.out or cfg.cert_path
    out.parent.mkdir(parents=True, exist_ok=True)
    path = ca.issue_node_cert(args.ca, args.agent_id, args.pub, out, validity_days=args.days,
                              extra_ips=tuple(args.ip))
    print(f"certificate for {args.agent_id}: {path}")
    return EXIT_OK


def _peer_url(cfg: NodeConfig, agent_id: str, url: str | None) -> str:
    from node.errors import ServiceError
    if url:
        return url.rstrip("/")
    for p in cfg.mesh.peers:
        if p.agent_id == agent_id:
            return p.url
    raise ServiceError("unknown_peer", f"no [[mesh.peers]] entry for {agent_id!r}; pass --url")


@command("a2a send")
def _a2a_send(args: argparse.Namespace, cfg: NodeConfig) -> int:
    import time as _time

    from a2a import Envelope, new_envelope
    from node.errors import ServiceError
    from node.service import now_ms

    async def go(svc) -> int:
        ttl_s = cfg.a2a.ttl_s if args.ttl is None else args.ttl
        now = now_ms()
        payload = {"kind": args.kind, "sent_at": now}
        env = new_envelope(svc.agent_id, [args.to], payload, now, max(1, int(ttl_s * 1000)))
        if args.correlation_id or ttl_s <= 0:
            env = Envelope(correlation_id=args.correlation_id or env.correlation_id, sender=env.sender,
                           recipients=env.recipients, payload=payload, expires_at=now + int(ttl_s * 1000))
        if args.queue:
            if args.to not in {p.agent_id for p in cfg.mesh.peers}:
                raise ServiceError("unknown_peer", f"no [[mesh.peers]] entry for {args.to!r}: the node would never "
                                                   "deliver a queued message to it (--url applies without --queue)")
            from storage import outbox
            await svc.db.write(outbox.enqueue, env.correlation_id, args.to, env.kind, env.to_wire(),
                               env.expires_at, now, now)
            emit(args, {"queued": env.correlation_id, "peer": args.to}, lambda d: f"queued {d['queued']}")
            return EXIT_OK
        from mesh import tls
        from mesh.link import post_envelope
        ident = svc.identity
        ctx = tls.client_context(cfg.cert_path, ident.priv_path, cfg.ca_cert_path)
        t0 = _time.perf_counter()
        status, ack, err = await post_envelope(_peer_url(cfg, args.to, args.url), env, ctx,
                                               expected_agent_id=args.to, pinned=svc.peer_keys,
                                               timeout_s=cfg.a2a.ack_timeout_s, max_bytes=cfg.a2a.max_message_bytes)
        ms = (_time.perf_counter() - t0) * 1000
        out = {"correlation_id": env.correlation_id, "http_status": status, "latency_ms": round(ms, 3),
               "ack": ack.to_map() if ack else None, "error": (err or {}).get("error")}

        def human(d: dict[str, Any]) -> str:
            if d["ack"]:
                a = d["ack"]
                verdict = "accepted" if a["accepted"] else a["reason"]
                return f"ACK {verdict} from {a['recipient']} in {d['latency_ms']} ms ({d['correlation_id']})"
            return f"no ACK: HTTP {d['http_status']} {d['error']} ({d['correlation_id']})"

        emit(args, out, human)
        return EXIT_OK if ack and ack.accepted else EXIT_CHECK
    return with_service(go, cfg, require_identity=True)


@command("a2a dead-letters")
def _dead_letters(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from a2a import decode_frame, new_envelope
    from node.errors import ServiceError
    from node.service import now_ms
    from storage import outbox

    async def go(svc) -> int:
        if args.replay is not None or args.replay_all:
            ids = [args.replay] if args.replay is not None else [
                d.id for d in await svc.db.read(outbox.dead_letters, args.peer, 1_000_000)]

            def replay(conn, dead_id: int) -> str:
                dead = outbox.get_dead_letter(conn, dead_id)
                if dead is None:
                    raise ServiceError("not_found", f"no dead letter with id {dead_id}")
                old = decode_frame(dead.envelope, cfg.a2a.max_message_bytes)
                now = now_ms()
                env = new_envelope(old.sender, old.recipients, old.payload, now, int(cfg.a2a.ttl_s * 1000))
                outbox.replay_dead_letter(conn, dead_id, now, env.expires_at, envelope=env.to_wire(),
                                          correlation_id=env.correlation_id)
                return env.correlation_id

            done = [(i, await svc.db.write(replay, i)) for i in ids]
            emit(args, [{"dead_letter": i, "correlation_id": c} for i, c in done],
                 lambda rows: f"re-queued {len(rows)} message(s); the running node delivers them")
            return EXIT_OK
        rows = await svc.db.read(outbox.dead_letters, args.peer, 1000)
        data = [{"id": d.id, "peer": d.peer, "kind": d.kind, "correlation_id": d.correlation_id,
                 "attempts": d.attempts, "last_error": d.last_error, "dead_at": d.dead_at} for d in rows]
        emit(args, data, lambda rows: "\n".join(
            f"{r['id']:>6}  {r['peer']}  {r['kind']}  attempts={r['attempts']}  {r['last_error']}" for r in rows)
            or "no dead letters")
        return EXIT_OK
    return with_service(go, cfg)


def _live_or_store(cfg: NodeConfig, tool: str, from_store: Callable[[Any], Awaitable[Any]]) -> tuple[str, Any]:
    """("node", the running node's answer) or, when no node answers on its socket, ("store", from_store(svc))."""
    from node.live import ask_node

    async def go() -> tuple[str, Any]:
        live = await ask_node(cfg, tool)
        if live is not None:
            return "node", live
        _check_home(cfg)
        from node.assemble import open_service
        svc = await open_service(cfg)
        try:
            return "store", await from_store(svc)
        finally:
            await svc.close()

    return asyncio.run(go())


def _not_running_note(cfg: NodeConfig) -> None:
    print(f"ai-memory: no node answers on {cfg.socket_path}; read from the store (link state not known)",
          file=sys.stderr)


# ---- knowledge graph ----------------------------------------------------------------------

@command("kg query")
def _kg_query(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.kg.query(args.memory_id, depth=args.depth, relations=args.relations, as_of=args.as_of,
                               limit=args.limit)

        def human(r: dict[str, Any]) -> str:
            lines = [f"{n['depth']}  {n['memory_id']}  via {' > '.join(v['relation'] for v in n['via'])}"
                     for n in r["neighbours"]]
            lines.append(f"{r['count']} neighbour(s) within {r['depth']} hop(s)"
                         + (f" (truncated at {r['limit']})" if r["truncated"] else ""))
            return "\n".join(lines)

        emit(args, r, human)
        return EXIT_OK
    return with_service(go, cfg)


@command("kg paths")
def _kg_paths(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.kg.find_paths(args.src_id, args.dst_id, max_depth=args.max_depth, limit=args.limit,
                                    relations=args.relations, as_of=args.as_of)

        def human(r: dict[str, Any]) -> str:
            lines = [f"{p['length']}  {' '.join(p['links'])}" for p in r["paths"]]
            lines.append(f"{r['count']} path(s)" + (" (truncated)" if r["truncated"] else ""))
            return "\n".join(lines)

        emit(args, r, human)
        return EXIT_OK
    return with_service(go, cfg)


@command("kg timeline")
def _kg_timeline(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.kg.timeline(args.memory_id, limit=args.limit)

        def human(r: dict[str, Any]) -> str:
            lines = [f"{e['at']}  {e['event']:<11} {e['link_id']}" for e in r["events"]]
            return "\n".join(lines) or "no links"

        emit(args, r, human)
        return EXIT_OK
    return with_service(go, cfg)


@command("kg invalidate")
def _kg_invalidate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.kg.invalidate(args.link_id, valid_until=args.valid_until)
        emit(args, r, lambda r: f"{r['inval_id']}  ends {r['link_id']} at {r['valid_until']} ({r['attest_level']})")
        return EXIT_OK
    return with_service(go, cfg)


# ---- transcripts --------------------------------------------------------------------------

def _span_arg(text: str) -> dict[str, Any]:
    from node.errors import ServiceError
    parts = text.rsplit(":", 2)
    try:
        memory_id, start, end = parts[0], int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise ServiceError("bad_input", f"--span must be MEMORY_ID:START:END, got {text!r}") from None
    return {"memory_id": memory_id, "start": start, "end": end}


@command("transcript store")
def _transcript_store(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.errors import ServiceError
    spans = [_span_arg(s) for s in args.spans]
    try:
        raw = sys.stdin.buffer.read() if str(args.file) == "-" else args.file.read_bytes()
        text = raw.decode("utf-8")
    except OSError as e:
        raise ServiceError("bad_input", f"cannot read {args.file}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ServiceError("bad_input", f"{args.file} is not UTF-8 text") from None

    async def go(svc) -> int:
        r = await svc.transcripts.store(text, namespace=args.namespace, spans=spans)
        emit(args, r, lambda r: f"{r['id']}  {r['raw_bytes']} bytes -> {r['stored_bytes']} stored, "
                                f"{len(r['spans'])} span(s) ({r['attest_level']})")
        return EXIT_OK
    return with_service(go, cfg)


@command("transcript replay")
def _transcript_replay(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.transcripts.replay(args.memory_id, full=args.full)

        def human(r: dict[str, Any]) -> str:
            out = []
            for t in r["transcripts"]:
                out.append(f"== {t['transcript_id']} ({t['namespace']}, {t['agent']})")
                out += [t["text"]] if r["full"] else [f"[{s['start']}:{s['end']}] {s['text']}" for s in t["spans"]]
            return "\n".join(out) or "no transcript cites this memory"

        emit(args, r, human)
        return EXIT_OK
    return with_service(go, cfg)


@command("transcript lifecycle")
def _transcript_lifecycle(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        r = await svc.transcripts.lifecycle()
        emit(args, r, lambda r: f"archived {len(r['archived'])}, pruned {len(r['pruned'])}")
        return EXIT_OK
    return with_service(go, cfg)


@command("peers")
def _peers(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.peers import peer_rows

    source, rows = _live_or_store(cfg, "memory_peers", peer_rows)
    if source == "store":
        _not_running_note(cfg)

    def human(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return "no peers configured or trusted"
        lines = [f"{'agent_id':<28} {'fingerprint':<16} {'link':<13} {'last_ack':>9} {'outbox':>6} "
                 f"{'dead':>5} {'sync_seq':>8} {'parked':>6}"]
        for r in rows:
            age = "-" if r["last_ack_age_s"] is None else f"{r['last_ack_age_s']:.0f}s"
            lines.append(f"{r['agent_id']:<28} {r['fingerprint'] or 'untrusted':<16} {r['link_state']:<13} "
                         f"{age:>9} {r['outbox_depth']:>6} {r['dead_letters']:>5} {r['last_sync_seq']:>8} "
                         f"{r['parked']:>6}")
        return "\n".join(lines)

    emit(args, rows, human)
    return EXIT_OK


@command("status")
def _status(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def from_store(svc: Any) -> dict[str, Any]:
        return await svc.capabilities()

    source, caps = _live_or_store(cfg, "memory_capabilities", from_store)
    if source == "store":
        _not_running_note(cfg)
    emit(args, {"source": source, **caps}, _status_lines)
    return EXIT_OK


def _status_lines(d: dict[str, Any]) -> str:
    where = "running" if d["source"] == "node" else "NOT RUNNING (read from the store)"
    lines = [f"node {d['agent_id'] or '(no identity)'}  {where}",
             f"  key          {d['key_fingerprint'] or 'none (writes are unsigned)'}",
             f"  memories     {d['memories']}   links {sum(d['links_by_attest_level'].values())}   "
             f"change_log_seq {d['change_log_seq']}",
             f"  outbox       {d['outbox_depth']}   dead letters {d['dead_letters']}   sync parked {d['sync_parked']}"]
    for t in d.get("transports", []):
        lines.append(f"  transport    {t}")
    for p in d["peers"]:
        age = "-" if p["last_ack_age_s"] is None else f"{p['last_ack_age_s']:.0f}s ago"
        lines.append(f"  peer         {p['agent_id']:<28} {p['link_state']:<13} last ACK {age}")
    hooks = d.get("hooks", {}).get("hooks", [])
    lines.append(f"  hooks        {len(hooks)} ({', '.join(h['name'] for h in hooks) or 'none'})")
    return "\n".join(lines)


@command("doctor")
def _doctor(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.hooks.doctor import hooks_report, render
    report = asyncio.run(hooks_report(cfg))
    hooks_ok = not report.get("reload_error")
    if args.hooks:
        emit(args, {"hooks": report}, lambda d: render(d["hooks"]))
        return EXIT_OK if hooks_ok else EXIT_CHECK

    async def go(svc) -> int:
        chain = await svc.audit_verify()
        r = {"storage_backend": cfg.storage.backend, "schema_version": svc.db.schema_version,
             "kg_backend": svc.kg.backend, "agent_id": svc.agent_id, "signing": svc.identity is not None,
             "audit_chain_ok": chain["ok"], "hooks": report}
        emit(args, r, lambda r: "\n".join([*(f"{k}: {v}" for k, v in r.items() if k != "hooks"),
                                            render(r["hooks"])]))
        return EXIT_OK if chain["ok"] and hooks_ok else EXIT_CHECK
    return with_service(go, cfg)


# ---- permissions and approvals ------------------------------------------------------------

@command("permissions list")
def _permissions_list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        snap = svc.gate.snapshot()
        emit(args, snap, lambda s: f"mode {s['mode']}, default {s['default']}, {s['rules']} rule(s)\n"
             + "\n".join(s["rule_summary"]))
        return EXIT_OK
    return with_service(go, cfg)


@command("permissions check")
def _permissions_check(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.errors import ServiceError
    from node.hooks.decision import decision_to_wire
    from node.permissions.rules import Operation

    async def go(svc) -> int:
        try:
            op = Operation(args.operation)
        except ValueError:
            raise ServiceError("bad_input", f"--operation must be one of {', '.join(Operation)}, "
                                            f"got {args.operation!r}") from None
        decision, rule = svc.gate.check(args.agent, args.namespace, op)
        out = {**decision_to_wire(decision), "rule": rule.summary() if rule else None, "mode": str(svc.gate.mode)}
        emit(args, out, lambda d: f"{d['decision']}  ({d['rule'] or 'no rule: the default'}; mode {d['mode']})")
        return EXIT_OK
    return with_service(go, cfg)


@command("permissions add")
def _permissions_add(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.service import now_ms

    async def go(svc) -> int:
        rule = await svc.gate.add_rule({"agent": args.agent, "namespace": args.namespace,
                                        "operations": args.operations, "action": args.action,
                                        "inherit": not args.no_inherit}, os.environ.get("USER") or "cli", now_ms())
        emit(args, {"rule": rule.summary()}, lambda d: f"added: {d['rule']}")
        return EXIT_OK
    return with_service(go, cfg)


def _action_line(a: dict[str, Any]) -> str:
    return (f"{a['id']}  {a['status']:<8} {a['operation']:<7} [{a['namespace']}] by {a['agent']}  "
            f"asked by {a['asked_by']}: {a['prompt']}")


@command("approvals list")
def _approvals_list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        rows = await svc.approval_list(status=args.status, limit=args.limit)
        emit(args, rows, lambda rows: "\n".join(map(_action_line, rows)) or f"no {args.status} actions")
        return EXIT_OK
    return with_service(go, cfg)


def _decide(choice: str) -> Handler:
    def handler(args: argparse.Namespace, cfg: NodeConfig) -> int:
        async def go(svc) -> int:
            a = await svc.approval_decide(args.id, choice, decided_by=args.by,
                                          remember=getattr(args, "remember", "once"))
            emit(args, a, _action_line)
            return EXIT_OK
        return with_service(go, cfg)
    return handler


@command("approvals rotate-key")
def _approvals_rotate_key(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from node.permissions import approval_api

    new = approval_api.rotate_key(cfg)
    out = {"key_path": str(approval_api.key_path(cfg)), "key_sha256_prefix": hashlib.sha256(new).hexdigest()[:16],
           "previous_valid_s": cfg.approval.key_grace_s}
    emit(args, out, lambda d: f"new approval key in {d['key_path']} (sha256 {d['key_sha256_prefix']}...); the "
                              f"previous key verifies for {d['previous_valid_s']:g} s more")
    return EXIT_OK


command("approvals approve")(_decide("approve"))
command("approvals deny")(_decide("deny"))


@command("subscriptions add")
def _subscriptions_add(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        sub = await svc.webhooks.subscribe(args.url, args.events)
        emit(args, sub, lambda d: f"subscription {d['id']} -> {d['url']} ({', '.join(d['events'])})\n"
                                  f"signing secret (shown once): {d['secret']}")
        return EXIT_OK
    return with_service(go, cfg)


@command("subscriptions list")
def _subscriptions_list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from storage import subscriptions

    async def go(svc) -> int:
        rows = await svc.db.read(subscriptions.list_)
        emit(args, rows, lambda rows: "\n".join(f"{r['id']:>4}  {r['url']}  {', '.join(r['events'])}"
                                                 for r in rows) or "no subscriptions")
        return EXIT_OK
    return with_service(go, cfg)


@command("subscriptions deliveries")
def _subscriptions_deliveries(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        rows = [{"id": d.id, "subscription_id": d.subscription_id, "url": d.url, "event": d.event,
                 "status": d.status, "attempts": d.attempts, "last_error": d.last_error, "created_at": d.created_at,
                 "delivered_at": d.delivered_at}
                for d in await svc.webhooks.deliveries(args.status, args.limit)]
        emit(args, rows, lambda rows: "\n".join(
            f"{r['id']:>6}  {r['status']:<9} {r['event']:<18} attempts={r['attempts']}  {r['last_error'] or ''}"
            for r in rows) or "no deliveries")
        return EXIT_OK
    return with_service(go, cfg)


@command("subscriptions replay")
def _subscriptions_replay(args: argparse.Namespace, cfg: NodeConfig) -> int:
    async def go(svc) -> int:
        await svc.webhooks.replay(args.id)
        emit(args, {"replayed": args.id}, lambda d: f"delivery {d['replayed']} queued again")
        return EXIT_OK
    return with_service(go, cfg)


if __name__ == "__main__":
    sys.exit(main())
