"""``ai-memory identity``: this node's Ed25519 identity (generate, rotate, export) and the peer keys it trusts."""

from __future__ import annotations

import argparse
import sys
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
                                       "peer retires the old one to <home>/peers/retired/)")
    i.add_argument("file", type=Path, help="the peer's <agent_id>.pub")
    i.add_argument("--agent-id", help="peer agent id (default: the file name without .pub)")
    i.add_argument("--force", action="store_true",
                   help="replace a trusted key file that cannot be read (it cannot be kept in the keyring)")
    i.set_defaults(handler=_import)
    ls = isub.add_parser("list", help="this node's identity and trusted peers, with fingerprints; retired keys "
                                      "marked")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=_list)
    e = isub.add_parser("export-pub", help="copy this node's .pub to a directory to hand to other operators")
    e.add_argument("--out", type=Path, default=Path("."), help="destination directory (default: .)")
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


def _import(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    peer = keys.import_peer(cfg.peers_dir, args.file, agent_id=args.agent_id, force=args.force)
    print(f"trusted peer {peer.agent_id}  fingerprint {peer.fingerprint}  ({peer.path})")
    if peer.retired_fingerprint is not None:
        print(f"  {peer.agent_id} rotated: its previous key {peer.retired_fingerprint} is kept in "
              f"{peer.retired_path} (what it signed keeps verifying; connections must use the new key)")
    return EXIT_OK


def _list(args: argparse.Namespace, cfg: NodeConfig) -> int:
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


def _export(args: argparse.Namespace, cfg: NodeConfig) -> int:
    from mesh import keys
    ident = keys.load_identity(cfg.keys_dir, cfg.agent_id or None)
    out = keys.export_pub(cfg.keys_dir, ident.agent_id, args.out)
    print(out)
    return EXIT_OK
