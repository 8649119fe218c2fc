"""Lay out an N-node mesh on disk: a CA, N identities, N certificates, every .pub in every other
node's peers/, and N configs, exactly as operators would by hand (docs/operations.md)."""

from __future__ import annotations

import json
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from mesh import ca, keys, peerkeys
from testbed.errors import TestbedError

MAX_NODES = 64
# sun_path is 108 bytes including the NUL; nodes put run/node.sock (the default) in their home.
MAX_UNIX_PATH = 107


@dataclass(frozen=True)
class NodeSpec:
    index: int
    agent_id: str
    home: Path
    port: int
    health_port: int
    mcp_http_port: int
    fingerprint: str
    # The address the node's mesh server listens on and peers dial; with ``netns`` (testbed/mesh/netns.py)
    # the node runs inside that network namespace and ``host`` is its address on the testbed bridge.
    host: str = "127.0.0.1"
    netns: str | None = None

    @property
    def config_path(self) -> Path:
        return self.home / "config.toml"

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"


@dataclass
class MeshLayout:
    root: Path
    nodes: list[NodeSpec] = field(default_factory=list)

    def node(self, index: int) -> NodeSpec:
        return self.nodes[index - 1]


def agent_id_for(index: int) -> str:
    return f"ai:node-{index}@testbed"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago (held together so none repeats)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def check_ports_free(ports: list[int], host: str = "127.0.0.1") -> None:
    for port in ports:
        with socket.socket() as s:
            # As the node's server binds: TIME_WAIT leftovers of an earlier testbed do not block it.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                s.listen()
            except OSError:
                raise TestbedError("port_in_use",
                                   f"port {port} on {host} is in use; choose another --base-port") from None


def build_layout(root: Path, nodes: int, *, base_port: int | None = None, mcp_http: bool = True,
                 extra_config: str = "", retry_delays_s: tuple[float, ...] | None = None,
                 a2a: dict[str, object] | None = None,
                 netns: dict[int, tuple[str, str]] | None = None) -> MeshLayout:
    """Create the whole on-disk mesh under ``root`` (which must be empty or absent).

    ``a2a`` keys (and ``retry_delays_s``, a shorthand for ``a2a={"retry_delays_s": ...}``) go into
    the one ``[a2a]`` table; ``extra_config`` is appended as is and must not open ``[a2a]`` as well.

    ``netns`` maps node index -> (namespace name, address): that node then listens on that address,
    its certificate carries it as an IP SAN and peers dial it (testbed/mesh/netns.py makes the namespaces).
    """
    if not 2 <= nodes <= MAX_NODES:
        raise TestbedError("bad_node_count", f"--nodes must be between 2 and {MAX_NODES}, got {nodes}")
    longest = root.resolve() / f"node-{nodes}" / "run" / "node.sock"
    if len(str(longest)) > MAX_UNIX_PATH:
        raise TestbedError("dir_too_long", f"{root.resolve()} is too long: a node's local MCP socket "
                                           f"({longest}) would exceed the {MAX_UNIX_PATH}-byte unix socket path "
                                           "limit; choose a shorter --dir")
    if root.exists() and any(root.iterdir()):
        raise TestbedError("dir_not_empty",
                           f"{root} is not empty (another testbed?); use `testbed down` or another --dir")
    if base_port is None:
        ports = free_ports(3 * nodes)
    else:
        ports = list(range(base_port, base_port + 3 * nodes))
        if ports[-1] > 65535:
            raise TestbedError("bad_port", f"--base-port {base_port} leaves no room for {nodes} nodes")
        check_ports_free(ports)
    root.mkdir(parents=True, exist_ok=True)
    ca_dir = root / "ca"
    ca.init_ca(ca_dir)
    layout = MeshLayout(root=root)
    for i in range(1, nodes + 1):
        home = root / f"node-{i}"
        ident = keys.generate_identity(home / "keys", agent_id_for(i))
        (home / "tls").mkdir(parents=True, exist_ok=True)
        ns_name, host = (netns or {}).get(i, (None, "127.0.0.1"))
        ca.issue_node_cert(ca_dir, ident.agent_id, ident.pub_path, home / "tls" / "node.crt",
                           extra_ips=() if host == "127.0.0.1" else (host,))
        shutil.copyfile(ca_dir / ca.CA_CERT_NAME, home / "tls" / "ca.crt")
        layout.nodes.append(NodeSpec(index=i, agent_id=ident.agent_id, home=home, port=ports[3 * (i - 1)],
                                     health_port=ports[3 * (i - 1) + 1],
                                     mcp_http_port=ports[3 * (i - 1) + 2] if mcp_http else 0,
                                     fingerprint=ident.fingerprint, host=host, netns=ns_name))
    for spec in layout.nodes:
        exchange_pubs(layout, spec)
        spec.config_path.write_text(render_config(layout, spec, extra_config, retry_delays_s, a2a),
                                    encoding="utf-8")
    return layout


def exchange_pubs(layout: MeshLayout, spec: NodeSpec) -> None:
    """Import every other node's .pub into this node's peers/ (the file operators hand each other)."""
    for other in layout.nodes:
        if other.agent_id != spec.agent_id:
            peerkeys.import_peer(spec.home / "peers", other.home / "keys" / f"{other.agent_id}.pub")


def render_config(layout: MeshLayout, spec: NodeSpec, extra: str = "",
                  retry_delays_s: tuple[float, ...] | None = None, a2a: dict[str, object] | None = None) -> str:
    a2a = dict(a2a or {})
    if retry_delays_s is not None:
        a2a["retry_delays_s"] = [float(d) for d in retry_delays_s]
    if a2a and any(line.strip() == "[a2a]" for line in extra.splitlines()):
        raise ValueError("extra_config opens [a2a] while a2a=/retry_delays_s= write that table too; "
                         "pass the [a2a] keys as a2a={...}")
    lines = [
        f'agent_id = "{spec.agent_id}"',
        f'home = "{spec.home}"',
        "",
        "[mesh]",
        f'listen_host = "{spec.host}"',
        f"listen_port = {spec.port}",
        f"health_port = {spec.health_port}",
        "reconnect_max_s = 1.0",
        "",
    ]
    if a2a:
        lines += ["[a2a]", *(f"{k} = {_toml_value(v)}" for k, v in a2a.items()), ""]
    lines += ["[mcp]", f"http_port = {spec.mcp_http_port}", ""]
    for other in layout.nodes:
        if other.agent_id != spec.agent_id:
            lines += ["[[mesh.peers]]", f'agent_id = "{other.agent_id}"', f'url = "{other.url}"', ""]
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


def _toml_value(v: object) -> str:
    """A TOML literal for a config value: bool, int, float, str or a list of those."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string (ASCII-escaped) is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as a TOML value")
