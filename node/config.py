"""Node configuration: one frozen dataclass tree, loaded from TOML, with defaults and validation.

Every tunable of the node lives here (retry delays, TTL, seen-cache size, limits, ports);
the rest of the code reads it and never repeats a literal.

Precedence for the node home: built-in default < the config file's directory < ``home`` in the TOML file
(relative to the file's directory) < ``AI_MEMORY_HOME``. Relative paths in the file are resolved against
the home.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2a.kinds import LINKS_PUT_MAX_ITEMS
from a2a.retry import RETRY_DELAYS_S
from a2a.seen import SEEN_CACHE_SIZE
from mesh.receive import APPLY_TIMEOUT_S
from node import agentconfig, priority
from node.configbase import ConfigCode as ConfigCode
from node.configbase import ConfigError as ConfigError
from node.configbase import expect, positive
from node.files import HomeFile, Need, explain
from node.priority import MAX_NICE
from node.transcriptconfig import REPLAY_MODES as REPLAY_MODES
from node.transcriptconfig import TranscriptPolicy as TranscriptPolicy
from node.transcriptconfig import TranscriptsConfig, parse_transcripts

DEFAULT_HOME = "~/.config/ai-memory"
HOME_ENV = "AI_MEMORY_HOME"
HOOKS_CONFIG_ENV = "AI_MEMORY_HOOKS_CONFIG"
LOG_LEVEL_ENV = "AI_MEMORY_LOG_LEVEL"


@dataclass(frozen=True)
class LimitsConfig:
    max_content_bytes: int = 65_536
    max_title_chars: int = 512
    max_namespace_chars: int = 128
    max_tags: int = 32
    max_tag_chars: int = 64
    max_relation_chars: int = 64
    max_id_chars: int = 128
    max_source_chars: int = 256
    max_recall_limit: int = 100
    max_query_chars: int = 1_000
    # Links one memory_link_many call may make.
    max_links_per_call: int = 100
    requests_per_second: int = 100
    # Live messages one peer may send per second (bursts of one second's worth); past it each is refused
    # rate_limited, retryable, so its sender backs off. 0 = no limit.
    peer_requests_per_second: int = 10_000
    max_db_bytes: int = 100 * 1024 * 1024


# storage.fts_merge_pages' default: docs/perf-history.md, "Recall at 100k" says what one step costs.
FTS_MERGE_PAGES = 16
# storage.integrity_check_interval_s' default: one quick_check reads the whole file, 0.09 s of one core at 100k
# memories (docs/operations.md, "A damaged database"): every 10 minutes is 0.015% of a core.
INTEGRITY_CHECK_INTERVAL_S = 600.0


@dataclass(frozen=True)
class StorageConfig:
    path: Path = Path("data/memory.db")
    # Upper bound on jobs folded into one group-commit transaction.
    batch_max: int = 512
    readers: int = 2
    # "full": an ACK (and a local commit) survives power loss; "normal": a process crash only, faster.
    synchronous: str = "full"
    # SQLite: pages of full-text index merged per step while the writer is idle (fewer FTS5 segments, faster
    # recall; a write waits for at most one step). 0 = no idle merging.
    fts_merge_pages: int = FTS_MERGE_PAGES
    # SQLite: seconds between two integrity checks (PRAGMA quick_check) while the node runs; 0 = only at start.
    integrity_check_interval_s: float = INTEGRITY_CHECK_INTERVAL_S
    # SQLite: a store (file and WAL) up to this size is checked before the node serves, a larger one just after.
    start_check_max_bytes: int = 256 * 1024 * 1024
    # "sqlite" (the file at ``path``) or "postgres" (the database at ``dsn``).
    backend: str = "sqlite"
    dsn: str = ""
    # Apache AGE for the graph walks on Postgres: "auto" = use it when the extension is installed
    # and enabled below, "on" = required, "off" = recursive CTEs. PERFORMANCE.md says why "off" is the default.
    age: str = "off"


@dataclass(frozen=True)
class KgConfig:
    # Hops a knowledge-graph walk may take (memory_kg_query depth, memory_find_paths max_depth).
    max_depth: int = 5
    # Most neighbours one memory_kg_query returns; past it the result says truncated.
    max_results: int = 1000
    # Most paths one memory_find_paths returns.
    max_paths: int = 100
    # Most candidate paths a memory_find_paths walk collects before ranking; past it: truncated.
    path_scan_cap: int = 10_000
    # Relations one query may filter on.
    max_relations: int = 16
    # Most links memory_kg_timeline lists.
    max_timeline: int = 1000


@dataclass(frozen=True)
class A2AConfig:
    ttl_s: float = 60.0
    ack_timeout_s: float = 2.0
    retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S
    seen_cache_size: int = SEEN_CACHE_SIZE
    max_message_bytes: int = 1024 * 1024
    # Longest one inbound apply may take; past it no ACK is sent (the sender retries; apply is idempotent).
    apply_timeout_s: float = APPLY_TIMEOUT_S


@dataclass(frozen=True)
class PeerConfig:
    agent_id: str
    url: str


@dataclass(frozen=True)
class MeshConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 7443
    # 0 = no separate health port; /healthz is then served behind mTLS only.
    health_port: int = 0
    health_host: str = "127.0.0.1"  # where the health port listens: an address a remote Prometheus reaches
    ca_cert: Path = Path("tls/ca.crt")
    cert: Path = Path("tls/node.crt")
    peers: tuple[PeerConfig, ...] = ()
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 10.0
    drain_timeout_s: float = 5.0
    # "pinned": inbound connections only from peers with a .pub in <home>/peers; "ca": any mesh-CA certificate.
    trust: str = "pinned"
    # /readyz is 503 once the storage writer has spent this long in one batch (stuck disk, lock).
    ready_writer_stuck_s: float = 10.0


@dataclass(frozen=True)
class NamespacePolicy:
    peers: tuple[str, ...] = ()
    # Agents besides a memory's creator allowed to write versions of memories in this namespace.
    writers: tuple[str, ...] = ()


# Envelope bytes in flight to one peer at once (federation.send_window_bytes): two full links.put, or ~170
# single-link envelopes; what a peer takes in at once is what its other answers wait behind (PERFORMANCE.md).
SEND_WINDOW_BYTES = 64 * 1024


@dataclass(frozen=True)
class FederationConfig:
    # 1 = return after the local commit; "majority" or an int W = wait for W ACKs, self included.
    write_quorum: int | str = 1
    quorum_timeout_s: float = 5.0
    namespaces: dict[str, NamespacePolicy] = field(default_factory=dict)
    sync_page_limit: int = 500
    # Each peer's change log is also pulled this often, not only on reconnect (a one-way outage heals).
    sync_interval_s: float = 30.0
    # How long an inbound link whose memories are not here yet is held before rejecting it.
    orphan_hold_s: float = 2.0
    # An inbound version's updated_at may be at most this far ahead of this node's clock.
    max_clock_skew_s: float = 300.0
    # An inbound version may be at most this many versions ahead of the stored one (a new memory: of 0).
    max_version_step: int = 1_000_000
    # A sync item that cannot be applied for this many pull rounds is parked and the cursor moves on.
    sync_park_after: int = 3
    # Most sync items from one peer parked as unknown_key (waiting for a key of their signer); past it that peer's
    # change log is not read further until there is room (never skipped past).
    sync_park_max: int = 10_000
    # Envelope bytes in flight to one peer at once, and most links packed into one links.put envelope: what a
    # peer takes in at one time. Smaller keeps a flooded peer quicker to answer everything else (its ping tail),
    # at some cost in links/s (docs/perf-history.md, "Issue 16, eighth round").
    send_window_bytes: int = SEND_WINDOW_BYTES
    links_per_envelope: int = LINKS_PUT_MAX_ITEMS
    # Nice steps below the event loop for the storage writer and the signature verifier (0..19, Linux; 0 = none):
    # a node taking in a flood then answers first (docs/operations.md).
    background_nice: int = 0


@dataclass(frozen=True)
class McpConfig:
    http_host: str = "127.0.0.1"
    # 0 = streamable HTTP off.
    http_port: int = 0
    socket: Path = Path("run/node.sock")
    # `ai-memory mcp` for a home a node serves waits this long for the node's socket (a node restarting opens its
    # store first), then fails; a home no node serves is opened in the MCP process itself (docs/mcp.md).
    join_wait_s: float = 30.0
    # Tool families each MCP session lists at first (docs/mcp.md): core | graph | admin | power | full.
    profile: str = "core"
    # Agents (docs/mcp.md, "Agents"): [[mcp.agents]] quotas, which ids a client may name, how many, delegations' days.
    agents: tuple[agentconfig.AgentConfig, ...] = ()
    agent_ids: str = "open"
    max_agents: int = agentconfig.MAX_AGENTS
    agent_delegation_days: float = agentconfig.DELEGATION_DAYS


@dataclass(frozen=True)
class HooksConfig:
    # The hooks file (docs/hooks.md); no file = no hooks. AI_MEMORY_HOOKS_CONFIG overrides it.
    config: Path = Path("hooks.toml")
    # How often a fire looks at the file's mtime for a hot reload.
    reload_check_s: float = 1.0
    # Requests one daemon hook holds at once; more fires wait for a slot within their deadline.
    daemon_queue_max: int = 64
    # Restart delay after a daemon dies: jittered exponential between these.
    daemon_restart_min_s: float = 0.1
    daemon_restart_max_s: float = 10.0
    # A daemon that lets this many requests in a row time out is killed and restarted.
    daemon_max_timeouts: int = 3
    # On stop or reload, how long a daemon gets to exit after its stdin closes before SIGKILL.
    daemon_stop_grace_s: float = 1.0
    # Largest answer a hook may print (one stdout document, one NDJSON line).
    max_reply_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class PermissionsConfig:
    # The rules file (docs/permissions.md): mode, default and [[rules]]; no file = no file rules.
    config: Path = Path("permissions.toml")
    # How often the gate looks at the file (and at the runtime rules table) for changes.
    reload_check_s: float = 1.0
    # Per-agent storage quota: content + title bytes of the memories an agent wrote (local or peer);
    # a new memory past it is refused (quota_exceeded). 0 = no quota. The design's 100 MB per agent.
    max_bytes_per_agent: int = 100 * 1024 * 1024


@dataclass(frozen=True)
class ApprovalConfig:
    # false turns the approval HTTP API off (pending actions are still decided over the CLI and MCP).
    enabled: bool = True
    # A pending action not decided within this is expired by the sweeper and never applied.
    default_timeout_seconds: float = 300.0
    sweep_interval_s: float = 5.0
    # The HMAC-signed approval API on the local interface; 0 = not served.
    http_host: str = "127.0.0.1"
    http_port: int = 0
    # A signed request's timestamp must be within this of the node's clock; its nonce is kept as long.
    timestamp_window_s: float = 60.0
    # After a key rotation the previous key still verifies for this long.
    key_grace_s: float = 300.0


@dataclass(frozen=True)
class SubscriptionsConfig:
    # A failed webhook delivery is retried after these delays, then dead-lettered (replayable).
    retry_delays_s: tuple[float, ...] = (1.0, 5.0, 25.0)
    # Bound on one delivery's POST.
    timeout_s: float = 5.0
    # How often the sender looks for due deliveries (ones queued by other processes too).
    poll_s: float = 0.5


@dataclass(frozen=True)
class LogConfig:
    # AI_MEMORY_LOG_LEVEL overrides it.
    level: str = "info"
    # "json": one JSON object per line (for collectors); "text": one readable line per record.
    format: str = "json"


@dataclass(frozen=True)
class NodeConfig:
    agent_id: str = ""
    home: Path = Path(DEFAULT_HOME).expanduser()
    limits: LimitsConfig = LimitsConfig()
    storage: StorageConfig = StorageConfig()
    kg: KgConfig = KgConfig()
    transcripts: TranscriptsConfig = TranscriptsConfig()
    a2a: A2AConfig = A2AConfig()
    mesh: MeshConfig = MeshConfig()
    federation: FederationConfig = FederationConfig()
    mcp: McpConfig = McpConfig()
    hooks: HooksConfig = HooksConfig()
    permissions: PermissionsConfig = PermissionsConfig()
    approval: ApprovalConfig = ApprovalConfig()
    subscriptions: SubscriptionsConfig = SubscriptionsConfig()
    log: LogConfig = LogConfig()

    # Derived paths: one place for the home layout (docs/operations.md, "Files, owners and modes").
    @property
    def keys_dir(self) -> Path:
        return self.home / "keys"

    @property
    def peers_dir(self) -> Path:
        return self.home / "peers"

    @property
    def db_path(self) -> Path:
        return self._in_home(self.storage.path)

    @property
    def ca_cert_path(self) -> Path:
        return self._in_home(self.mesh.ca_cert)

    @property
    def cert_path(self) -> Path:
        return self._in_home(self.mesh.cert)

    @property
    def socket_path(self) -> Path:
        return self._in_home(self.mcp.socket)

    @property
    def hooks_path(self) -> Path:
        return self._in_home(self.hooks.config)

    @property
    def permissions_path(self) -> Path:
        return self._in_home(self.permissions.config)

    @property
    def status_path(self) -> Path:
        """run/node.json: written by a node once it serves, removed when it stops cleanly."""
        return self.home / "run" / "node.json"

    def home_files(self, *, serving: bool) -> tuple[HomeFile, ...]:
        """Every path of the home a process opening its store reads or writes, with what it needs there
        (``node.files.check`` looks at them before anything is opened); ``serving``: the node's own as well."""
        f = HomeFile
        out = [f(self.home, "the node home", Need.ENTER),
               f(self.keys_dir, "the keys directory", Need.LIST),
               f(self.keys_dir / "retired", "the retired keys directory", Need.LIST),
               f(self.peers_dir, "the peers' keys directory", Need.LIST),
               f(self.peers_dir / "retired", "the peers' retired keys directory", Need.LIST),
               f(self.hooks_path, "the hooks file", Need.READ),
               f(self.permissions_path, "the permission rules file", Need.READ)]
        if self.storage.backend == "sqlite":
            db = self.db_path
            out += [f(db.parent, "the database directory", Need.CREATE), f(db, "the database", Need.WRITE),
                    *(f(db.with_name(db.name + end), f"the database's {end} file", Need.WRITE)
                      for end in ("-wal", "-shm"))]
        if serving:
            out += [f(self.cert_path, "the node certificate", Need.READ),
                    f(self.ca_cert_path, "the mesh CA certificate", Need.READ),
                    f(self.socket_path.parent, "the directory of the local socket", Need.CREATE),
                    f(self.status_path.parent, "the run directory", Need.CREATE)]
        return tuple(out)

    def _in_home(self, p: Path) -> Path:
        p = p.expanduser()
        return p if p.is_absolute() else self.home / p

    def quorum_size(self, nodes: int) -> int:
        """Number of ACKs (self included) a write waits for in a federation of ``nodes`` nodes."""
        q = self.federation.write_quorum
        if q == "majority":
            return nodes // 2 + 1
        return min(int(q), nodes)


_SECTIONS: dict[str, type] = {
    "limits": LimitsConfig,
    "storage": StorageConfig,
    "kg": KgConfig,
    "transcripts": TranscriptsConfig,
    "a2a": A2AConfig,
    "mesh": MeshConfig,
    "federation": FederationConfig,
    "mcp": McpConfig,
    "hooks": HooksConfig,
    "permissions": PermissionsConfig,
    "approval": ApprovalConfig,
    "subscriptions": SubscriptionsConfig,
    "log": LogConfig,
}


def load_config(path: Path | None = None, *, env: Mapping[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> NodeConfig:
    """Load a node config from TOML (or defaults when ``path`` is None), apply env, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(ConfigCode.CONFIG_NOT_FOUND,
                              f"config file {path} does not exist; check --config, or write it "
                              "(configs/node.example.toml documents every key)") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(ConfigCode.CONFIG_MALFORMED, f"config file {path} is not valid TOML: {e}") from None
        except UnicodeDecodeError:
            raise ConfigError(ConfigCode.CONFIG_MALFORMED, f"config file {path} is not UTF-8 text") from None
        except OSError as e:
            raise ConfigError(ConfigCode.CONFIG_UNREADABLE, _unreadable(Path(path), e)) from None
    if overrides:
        raw = {**raw, **overrides}
    return from_dict(raw, env=env, config_dir=None if path is None else Path(path).absolute().parent)


def _unreadable(path: Path, e: OSError) -> str:
    """The config file's read error as one line with its fix (node.files), else the system's words."""
    err = explain(e, path.absolute().parent, "the config file")
    return err.message if err is not None else f"config file {path} cannot be read: {e.strerror or e}"


def from_dict(raw: dict[str, Any], *, env: Mapping[str, str] | None = None,
              config_dir: Path | None = None) -> NodeConfig:
    """A validated config from a parsed TOML table; ``config_dir`` (the file's directory) is the default home;
    ``env`` the environment to read (None: this process's)."""
    env = os.environ if env is None else env
    raw = dict(raw)
    known = {"agent_id", "home", *_SECTIONS}
    for key in raw:
        if key not in known:
            raise ConfigError(ConfigCode.CONFIG_UNKNOWN_KEY, f"unknown config key {key!r}; known: {sorted(known)}")
    in_file = raw.pop("home", None)
    if env.get(HOME_ENV):
        home = Path(env[HOME_ENV]).expanduser()
    elif in_file is not None:
        home = Path(expect(str, "home", in_file)).expanduser()
        if config_dir is not None and not home.is_absolute():
            home = config_dir / home
    else:
        home = config_dir if config_dir is not None else Path(DEFAULT_HOME).expanduser()
    agent_id = expect(str, "agent_id", raw.pop("agent_id", ""))
    sections = {name: _section(name, cls, raw.get(name, {})) for name, cls in _SECTIONS.items()}
    if env.get(HOOKS_CONFIG_ENV):
        sections["hooks"] = dataclasses.replace(sections["hooks"], config=Path(env[HOOKS_CONFIG_ENV]))
    if env.get(LOG_LEVEL_ENV):
        sections["log"] = dataclasses.replace(sections["log"], level=env[LOG_LEVEL_ENV].lower())
    cfg = NodeConfig(agent_id=agent_id, home=home.absolute(), **sections)
    _validate(cfg)
    return cfg


def _section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"[{name}] must be a table, got {raw!r}")
    if cls is TranscriptsConfig:
        return parse_transcripts(raw)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{name}.{key}"
        if key not in fields:
            raise ConfigError(ConfigCode.CONFIG_UNKNOWN_KEY, f"unknown config key {dotted!r}; known: {sorted(fields)}")
        kwargs[key] = _coerce(dotted, fields[key], value)
    return cls(**kwargs)


def _coerce(dotted: str, f: dataclasses.Field[Any], value: Any) -> Any:
    default = f.default if f.default is not dataclasses.MISSING else None
    if dotted in _TABLES:  # the keys that hold tables of their own
        return _TABLES[dotted](value)
    if dotted == "federation.write_quorum":
        if value == "majority" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"{dotted} must be \"majority\" or an integer >= 1, got {value!r}")
    if isinstance(default, Path):
        return Path(expect(str, dotted, value))
    if isinstance(default, tuple):
        items = expect(list, dotted, value)
        return tuple(float(expect((int, float), f"{dotted}[{i}]", v)) for i, v in enumerate(items))
    if isinstance(default, bool | str):  # before int: a bool is an int
        return expect(type(default), dotted, value)
    if isinstance(default, float):
        return float(expect((int, float), dotted, value))
    if isinstance(default, int):
        return expect(int, dotted, value)
    return value


def _peers(value: Any) -> tuple[PeerConfig, ...]:
    items = expect(list, "mesh.peers", value)
    peers = []
    for i, item in enumerate(items):
        key = f"mesh.peers[{i}]"
        if not isinstance(item, dict) or set(item) != {"agent_id", "url"}:
            raise ConfigError(ConfigCode.CONFIG_INVALID,
                              f"{key} must be a table with exactly agent_id and url, got {item!r}")
        url = expect(str, f"{key}.url", item["url"])
        if not url.startswith("https://"):
            raise ConfigError(ConfigCode.CONFIG_INVALID, f"{key}.url must start with https://, got {url!r}")
        peers.append(PeerConfig(agent_id=expect(str, f"{key}.agent_id", item["agent_id"]), url=url.rstrip("/")))
    return tuple(peers)


def _namespaces(value: Any) -> dict[str, NamespacePolicy]:
    table = expect(dict, "federation.namespaces", value)
    out = {}
    for ns, policy in table.items():
        key = f"federation.namespaces.{ns!r}"
        if not isinstance(policy, dict) or set(policy) - {"peers", "writers"}:
            raise ConfigError(ConfigCode.CONFIG_INVALID, f"{key} must be a table with only 'peers' and 'writers', "
                                                         f"got {policy!r}")
        peers = expect(list, f"{key}.peers", policy.get("peers", []))
        writers = expect(list, f"{key}.writers", policy.get("writers", []))
        out[ns] = NamespacePolicy(peers=tuple(expect(str, f"{key}.peers[]", p) for p in peers),
                                  writers=tuple(expect(str, f"{key}.writers[]", w) for w in writers))
    return out


_TABLES: dict[str, Callable[[Any], Any]] = {"mesh.peers": _peers, "federation.namespaces": _namespaces,
                                            "mcp.agents": lambda v: _agent_settings(agentconfig.parse_agents, v)}
def _validate_hooks(hooks: HooksConfig) -> None:
    for f in dataclasses.fields(HooksConfig):
        if f.name != "config":
            positive(f"hooks.{f.name}", getattr(hooks, f.name))
    if hooks.daemon_restart_min_s > hooks.daemon_restart_max_s:
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"hooks.daemon_restart_min_s ({hooks.daemon_restart_min_s}) must "
                          f"not exceed hooks.daemon_restart_max_s ({hooks.daemon_restart_max_s})")


def _validate_backend(st: StorageConfig) -> None:
    if st.backend not in ("sqlite", "postgres"):
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"storage.backend must be sqlite|postgres, got {st.backend!r}")
    if st.backend == "postgres" and not st.dsn:
        raise ConfigError(ConfigCode.CONFIG_INVALID, "storage.backend is postgres but storage.dsn is empty; "
                                                     "give a libpq DSN, e.g. \"host=/run/postgresql dbname=ai_memory\"")
    if st.age not in ("auto", "on", "off"):
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"storage.age must be auto|on|off, got {st.age!r}")


# Settings that must be > 0, checked in this order (section.name).
_POSITIVE_STORAGE_A2A = ("storage.batch_max", "storage.readers", "a2a.ttl_s", "a2a.ack_timeout_s",
                         "a2a.seen_cache_size", "a2a.max_message_bytes", "a2a.apply_timeout_s")
_POSITIVE_MESH_FEDERATION = ("mesh.reconnect_min_s", "mesh.reconnect_max_s", "mesh.drain_timeout_s",
                             "mesh.ready_writer_stuck_s",
                             "federation.quorum_timeout_s", "federation.sync_page_limit")
_POSITIVE_SYNC = ("federation.sync_interval_s", "federation.max_clock_skew_s", "federation.max_version_step",
                  "federation.sync_park_after", "federation.sync_park_max")
# Below this a links.put of a dozen links (~260 bytes a link) fills the window alone: each such envelope would wait
# for the previous one's ACK.
MIN_SEND_WINDOW_BYTES = 4096
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
MAX_PORT = 65535


def _validate_approval(a: ApprovalConfig) -> None:
    for key in ("default_timeout_seconds", "sweep_interval_s", "timestamp_window_s", "key_grace_s"):
        positive(f"approval.{key}", getattr(a, key))
    if not 0 <= a.http_port <= MAX_PORT:
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"approval.http_port must be in 0..65535, got {a.http_port!r}")
    if a.http_host not in ("127.0.0.1", "::1"):
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"approval.http_host must be 127.0.0.1 or ::1 (the approval API is "
                          f"local only), got {a.http_host!r}")


# Settings where 0 turns the check off.
_ZERO_IS_OFF = frozenset({"peer_requests_per_second"})


def _validate(cfg: NodeConfig) -> None:
    _allpositive(cfg, [f"{section}.{f.name}" for section in ("limits", "kg")
                        for f in dataclasses.fields(getattr(cfg, section)) if f.name not in _ZERO_IS_OFF])
    if cfg.limits.peer_requests_per_second < 0:
        raise ConfigError(ConfigCode.CONFIG_INVALID, "limits.peer_requests_per_second must be >= 0 (0 = no limit), got "
                                                     f"{cfg.limits.peer_requests_per_second}")
    _allpositive(cfg, _POSITIVE_STORAGE_A2A)
    positive("transcripts.lifecycle_batch", cfg.transcripts.lifecycle_batch)
    positive("transcripts.lifecycle_interval_s", cfg.transcripts.lifecycle_interval_s)
    _validate_retry_delays(cfg)
    _validate_listen_addresses(cfg)
    _allpositive(cfg, _POSITIVE_MESH_FEDERATION)
    _validate_sync_mode_and_backoff(cfg)
    _validate_peers(cfg)
    _validate_federation_trust_and_log(cfg)
    _agent_settings(agentconfig.check_agent_settings, cfg.mcp)


def _agent_settings(check: Callable[..., Any], *args: Any) -> Any:
    try:
        return check(*args)
    except agentconfig.AgentConfigError as e:  # the agent settings' own module names the key
        raise ConfigError(ConfigCode.CONFIG_INVALID, str(e)) from None


def _allpositive(cfg: NodeConfig, keys: Iterable[str]) -> None:
    for key in keys:
        section, name = key.split(".")
        positive(key, getattr(getattr(cfg, section), name))


def _validate_retry_delays(cfg: NodeConfig) -> None:
    for i, d in enumerate(cfg.a2a.retry_delays_s):
        if d < 0:
            raise ConfigError(ConfigCode.CONFIG_INVALID, f"a2a.retry_delays_s[{i}] must be >= 0, got {d!r}")


def _validate_listen_addresses(cfg: NodeConfig) -> None:
    for key in ("listen_port", "health_port"):
        port = getattr(cfg.mesh, key)
        if not 0 <= port <= MAX_PORT:
            raise ConfigError(ConfigCode.CONFIG_INVALID, f"mesh.{key} must be in 0..{MAX_PORT}, got {port!r}")
    if not cfg.mesh.health_host.strip():
        raise ConfigError(ConfigCode.CONFIG_INVALID, "mesh.health_host must be an address or host name, got ''")
    positive("mcp.join_wait_s", cfg.mcp.join_wait_s)
    if not 0 <= cfg.mcp.http_port <= MAX_PORT:
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"mcp.http_port must be in 0..{MAX_PORT}, got {cfg.mcp.http_port!r}")
    if cfg.mcp.http_port and cfg.mcp.http_host not in LOOPBACK_HOSTS:
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"mcp.http_host must be a loopback address (127.0.0.1, ::1), got {cfg.mcp.http_host!r}")


def _validate_sync_mode_and_backoff(cfg: NodeConfig) -> None:
    if cfg.storage.synchronous not in ("full", "normal"):
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"storage.synchronous must be full|normal, got {cfg.storage.synchronous!r}")
    _validate_backend(cfg.storage)
    if not 0 <= cfg.storage.fts_merge_pages <= 1_000_000:
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"storage.fts_merge_pages must be in 0..1000000, got {cfg.storage.fts_merge_pages!r}")
    for key in ("integrity_check_interval_s", "start_check_max_bytes"):  # interval 0 = only at start
        if not (value := getattr(cfg.storage, key)) >= 0:
            raise ConfigError(ConfigCode.CONFIG_INVALID, f"storage.{key} must be >= 0, got {value!r}")
    if cfg.mesh.reconnect_min_s > cfg.mesh.reconnect_max_s:
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"mesh.reconnect_min_s ({cfg.mesh.reconnect_min_s}) must not exceed "
                          f"mesh.reconnect_max_s ({cfg.mesh.reconnect_max_s})")


def _validate_peers(cfg: NodeConfig) -> None:
    ids = [p.agent_id for p in cfg.mesh.peers]
    if len(set(ids)) != len(ids):
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"mesh.peers names an agent_id twice: {sorted(ids)}")
    if cfg.agent_id and cfg.agent_id in ids:
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"mesh.peers lists this node itself ({cfg.agent_id!r})")


def _validate_federation_trust_and_log(cfg: NodeConfig) -> None:
    if cfg.federation.orphan_hold_s < 0:
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"federation.orphan_hold_s must be >= 0, got {cfg.federation.orphan_hold_s}")
    _allpositive(cfg, _POSITIVE_SYNC)
    if cfg.federation.send_window_bytes < MIN_SEND_WINDOW_BYTES:
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"federation.send_window_bytes must be >= {MIN_SEND_WINDOW_BYTES} (below "
                          f"it a links.put of a dozen links waits for the previous envelope's "
                          f"ACK), got "
                          f"{cfg.federation.send_window_bytes!r}")
    if not 0 <= cfg.federation.background_nice <= MAX_NICE:
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"federation.background_nice must be in 0..{MAX_NICE}, got "
                                                     f"{cfg.federation.background_nice!r}")
    if cfg.federation.background_nice and not priority.SUPPORTED:
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"federation.background_nice needs Linux (per-thread priorities), "
                                                     f"not {sys.platform}")
    if not 1 <= cfg.federation.links_per_envelope <= LINKS_PUT_MAX_ITEMS:
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"federation.links_per_envelope must be in 1..{LINKS_PUT_MAX_ITEMS} "
                          f"(what a peer reads in one links.put), got "
                          f"{cfg.federation.links_per_envelope!r}")
    if cfg.mesh.trust not in ("pinned", "ca"):
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"mesh.trust must be pinned|ca, got {cfg.mesh.trust!r}")
    _validate_hooks(cfg.hooks)
    _validate_log(cfg.log)
    _validate_profile(cfg.mcp.profile)
    _validate_permissions(cfg)


def _validate_permissions(cfg: NodeConfig) -> None:
    positive("permissions.reload_check_s", cfg.permissions.reload_check_s)
    if cfg.permissions.max_bytes_per_agent < 0:
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"permissions.max_bytes_per_agent must be >= 0 (0 = no quota), "
                                                     f"got {cfg.permissions.max_bytes_per_agent}")
    _validate_approval(cfg.approval)
    positive("subscriptions.timeout_s", cfg.subscriptions.timeout_s)
    positive("subscriptions.poll_s", cfg.subscriptions.poll_s)


def _validate_profile(profile: str) -> None:
    from node.mcp.profiles import parse_family
    try:
        parse_family(profile)
    except ValueError as e:
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"mcp.profile: {e}") from None


def _validate_log(log: LogConfig) -> None:
    if log.level not in ("debug", "info", "warning", "error"):
        raise ConfigError(ConfigCode.CONFIG_INVALID,
                          f"log.level (or {LOG_LEVEL_ENV}) must be debug|info|warning|error, "
                          f"got {log.level!r}")
    if log.format not in ("json", "text"):
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"log.format must be json|text, got {log.format!r}")
