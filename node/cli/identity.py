"""``ai-memory identity``: this node's Ed25519 identity (generate, rotate, export) and the peer keys it trusts."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli.common import EXIT_FAILED, EXIT_OK, emit
from node.config import NodeConfig
from node.errors import ServiceError, describe, is_project_error

if TYPE_CHECKING:
    from node.cli.common import Commands


def add_parsers(sub: Commands) -> None:
    ident = sub.add_parser("identity", help="manage this node's Ed25519 identity and trusted peer keys")
    isub = ident.add_commands(dest="sub", required=True, metavar="ACTION")
    g = isub.add_parser("generate", help="create <home>/keys/<agent_id>.priv (0600) and .pub (0644)")
    g.add_argument("--agent-id", required=True, help="immutable agent id, e.g. ai:node-1@lab")
    g.add_argument("--force", action="store_true", help="replace an existing identity")
    g.set_defaults(handler=_generate)
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
    rot.set_defaults(handler=_rotate)
    i = isub.add_parser("import", help="trust a peer: copy its .pub into <home>/peers/ (a new key for a known "
                                       "peer retires the old one to <home>/peers/retired/), or take its key "
                                       "history (<agent_id>.keyhistory.json: its current and retired keys)")
    i.add_argument("file", type=Path, help="the peer's <agent_id>.pub, or its <agent_id>.keyhistory.json")
    i.add_argument("--agent-id", help="peer agent id (default: the file name without .pub)")
    i.add_argument("--force", action="store_true",
                   help="replace a trusted key file that cannot be read (it cannot be kept in the keyring); take a "
                        "key history that does not list the key trusted now")
    i.set_defaults(handler=_import)
    ls = isub.add_parser("list", help="this node's identity, its agents' keys and trusted peers, with "
                                      "fingerprints; retired keys marked")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=_list)
    e = isub.add_parser("export-pub", help="copy this node's .pub to a directory to hand to other operators")
    e.add_argument("--out", type=Path, default=Path("."), help="destination directory (default: .)")
    e.add_argument("--with-retired", action="store_true",
                   help="write <agent_id>.keyhistory.json instead: the current and retired keys, each with when "
                        "it was current, signed by the current key (a node that joins after a rotation needs it "
                        "to verify what the retired keys signed)")
    e.add_argument("--json", action="store_true", help="print the result as JSON (with --with-retired)")
    e.set_defaults(handler=_export)


def _generate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    ident = keys.generate_identity(cfg.keys_dir, args.agent_id, force=args.force)
    print(f"identity {ident.agent_id}  fingerprint {ident.fingerprint}")
    print(f"  private key {ident.priv_path} (0600)")
    print(f"  public key  {ident.pub_path} (hand this file to peer operators)")
    return EXIT_OK


def _rotate(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import ca, keys
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
    from mesh import keyhistory
    ident, retired = keyhistory.rotate(cfg.keys_dir, agent_id, _now_ms())
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


def _import(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keyhistory, peerkeys
    if keyhistory.is_bundle(args.file):
        return _import_history(args, cfg)
    peer = peerkeys.import_peer(cfg.peers_dir, args.file, agent_id=args.agent_id, force=args.force)
    print(f"trusted peer {peer.agent_id}  fingerprint {peer.fingerprint}  ({peer.path})")
    if peer.retired_fingerprint is not None:
        print(f"  {peer.agent_id} rotated: its previous key {peer.retired_fingerprint} is kept in "
              f"{peer.retired_path} (what it signed keeps verifying; connections must use the new key)")
    return EXIT_OK


def _import_history(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keyhistory
    bundle = keyhistory.read_bundle(args.file)
    done = keyhistory.import_bundle(cfg.peers_dir, bundle, _now_ms(), agent_id=args.agent_id, force=args.force)
    peer = done.current
    print(f"trusted peer {peer.agent_id}  fingerprint {peer.fingerprint}  ({peer.path}), with its key history "
          f"of {len(bundle.periods)} key(s)")
    for p in bundle.periods[1:]:
        print(f"  retired key {p.fingerprint}  current {_when(p.valid_from)} .. {_when(p.valid_until)}"
              + ("  (added: what it signed now verifies here)" if p.fingerprint in done.kept else ""))
    if peer.retired_fingerprint is not None:
        print(f"  {peer.agent_id} rotated: its previous key {peer.retired_fingerprint} is kept in {peer.retired_path}")
    for fp in done.unlisted:
        print(f"  note: this node also keeps retired key {fp} for {peer.agent_id}, which its history does not "
              "list (its owner removed it): delete it from peers/retired/ if it was compromised")
    print("  a running node verifies the sync items parked as unknown_key again within seconds")
    return EXIT_OK


def _list(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import agentkeys, peerkeys
    infos = peerkeys.list_keys(cfg.keys_dir, cfg.peers_dir)
    validity = _validity(cfg)
    rows = [{"agent_id": k.agent_id, "fingerprint": k.fingerprint, "trust": k.trust, "retired": k.retired,
             "path": str(k.path), **dict(zip(("valid_from", "valid_until"),
                                             validity.get((k.agent_id, k.fingerprint), (None, None)), strict=True))}
            for k in infos]
    # This node's agents (keys/agents/, made on first use): trust "agent".
    rows += [{"agent_id": a.agent_id, "fingerprint": a.fingerprint, "trust": "agent", "retired": False,
              "path": str(a.path), "valid_from": None, "valid_until": None}
             for a in agentkeys.list_agent_keys(cfg.keys_dir)]

    def human(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return f"no identity or peers under {cfg.home}"
        width = max(len(r["agent_id"]) for r in rows)
        return "\n".join(f"{r['agent_id']:<{width}}  {r['fingerprint']}  {r['trust']}"
                         + ("  retired (verifies old signatures only)" if r["retired"] else "")
                         + (f"  current {_when(r['valid_from'])} .. {_when(r['valid_until'])}"
                            if r["retired"] and (r["valid_from"] or r["valid_until"]) else "") for r in rows)

    emit(args, rows, human)
    return EXIT_OK


def _validity(cfg: NodeConfig) -> dict[tuple[str, str], tuple[int | None, int | None]]:
    """(agent_id, fingerprint) -> (valid_from, valid_until) for the keys whose validity this node knows: its own,
    and those of the key histories it imported."""
    from mesh import keyhistory, keys
    from mesh.errors import MeshError
    out: dict[tuple[str, str], tuple[int | None, int | None]] = {}
    try:
        ident = keys.load_identity(cfg.keys_dir, cfg.agent_id or None)
        out.update({(ident.agent_id, p.fingerprint): (p.valid_from, p.valid_until)
                    for p in keyhistory.own_periods(cfg.keys_dir, ident.agent_id)})
    except (MeshError, OSError):
        pass  # no identity here (or not readable): `list` shows what it can
    for agent, history in keyhistory.peer_histories(cfg.peers_dir).items():
        out.update({(agent, fp): period for fp, period in history.periods.items()})
    return out


def _export(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keyhistory, keys
    ident = keys.load_identity(cfg.keys_dir, cfg.agent_id or None)
    if args.with_retired:
        out = keyhistory.export_bundle(cfg.keys_dir, ident, args.out, _now_ms())
        periods = keyhistory.own_periods(cfg.keys_dir, ident.agent_id)
        emit(args, {"path": str(out), "agent_id": ident.agent_id, "keys": [p.to_json() for p in periods]},
             _bundle_lines)
        return EXIT_OK
    out = keys.export_pub(cfg.keys_dir, ident.agent_id, args.out)
    print(out)
    return EXIT_OK


def _bundle_lines(d: dict[str, Any]) -> str:
    keys = [f"  {k['fingerprint']}  current {_when(k['valid_from'])} .. {_when(k['valid_until'], 'now')}"
            for k in d["keys"]]
    return "\n".join([d["path"], *keys])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _when(ms: int | None, none: str = "?") -> str:
    """A unix-ms time as ISO 8601 UTC to the second; ``none`` when there is none (not known, or still current)."""
    if ms is None:
        return none
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
