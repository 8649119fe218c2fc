"""Numbered, idempotent schema migrations recorded in ``PRAGMA user_version``, and the open-time guard.

Every statement is ``CREATE ... IF NOT EXISTS`` (or otherwise harmless to repeat), so running a
migration twice is a no-op; each migration runs inside one transaction together with the
``user_version`` bump, so a crash leaves either the old or the new schema, never half of one.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from storage.errors import StorageCode, StorageError, translate

# 'AMSH' in ASCII: marks the file as ours in the SQLite header (PRAGMA application_id).
APPLICATION_ID = 0x414D5348


@dataclass(frozen=True)
class Migration:
    """One schema step: its SQLite statements (storage/pg.py translates them for Postgres), statements that
    only a Postgres store runs after those, and statements that only an SQLite store runs after those."""

    version: int
    name: str
    statements: tuple[str, ...]
    postgres: tuple[str, ...] = ()
    sqlite: tuple[str, ...] = ()  # statements only an SQLite store runs, after ``statements``


_M1_CORE = Migration(1, "core", (
    f"PRAGMA application_id = {APPLICATION_ID}",
    """CREATE TABLE IF NOT EXISTS memories (
        id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        content TEXT NOT NULL,
        tags TEXT NOT NULL DEFAULT '[]',
        priority INTEGER NOT NULL DEFAULT 5,
        confidence REAL NOT NULL DEFAULT 1.0,
        source TEXT NOT NULL DEFAULT '',
        origin TEXT NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS memories_created ON memories(created_at)",
    "CREATE INDEX IF NOT EXISTS memories_ns_created ON memories(namespace, created_at)",
    # External content: the text lives once, in memories; the FTS index refers to memories.rowid.
    # memories has no INTEGER PRIMARY KEY, so a VACUUM may renumber rowids: run memories.rebuild_fts after one.
    """CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(
        title, content, tags, content='memories', content_rowid='rowid'
    )""",
    # Title hits weigh more than body hits (bm25 column weights: title, content, tags).
    "INSERT INTO memories_fts(memories_fts, rank) VALUES('rank', 'bm25(2.0, 1.0, 1.5)')",
    """CREATE TRIGGER IF NOT EXISTS memories_fts_ai AFTER INSERT ON memories BEGIN
        INSERT INTO memories_fts(rowid, title, content, tags) VALUES (new.rowid, new.title, new.content, new.tags);
    END""",
    """CREATE TRIGGER IF NOT EXISTS memories_fts_ad AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts(memories_fts, rowid, title, content, tags)
            VALUES ('delete', old.rowid, old.title, old.content, old.tags);
    END""",
    """CREATE TRIGGER IF NOT EXISTS memories_fts_au AFTER UPDATE OF title, content, tags ON memories BEGIN
        INSERT INTO memories_fts(memories_fts, rowid, title, content, tags)
            VALUES ('delete', old.rowid, old.title, old.content, old.tags);
        INSERT INTO memories_fts(rowid, title, content, tags) VALUES (new.rowid, new.title, new.content, new.tags);
    END""",
    """CREATE TABLE IF NOT EXISTS memory_links (
        link_id TEXT PRIMARY KEY,
        src_id TEXT NOT NULL,
        dst_id TEXT NOT NULL,
        relation TEXT NOT NULL,
        observed_by TEXT NOT NULL,
        valid_from INTEGER NOT NULL,
        valid_until INTEGER NULL,
        confidence REAL NULL,
        signature BLOB NULL,
        attest_level TEXT NOT NULL CHECK (attest_level IN ('unsigned','self_signed','peer_attested')),
        signed_by TEXT NULL,
        received_from TEXT NULL,
        created_at INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS memory_links_src ON memory_links(src_id)",
    "CREATE INDEX IF NOT EXISTS memory_links_dst ON memory_links(dst_id)",
    "CREATE INDEX IF NOT EXISTS memory_links_attest ON memory_links(attest_level)",
    """CREATE TABLE IF NOT EXISTS signed_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        event_type TEXT NOT NULL,
        link_id TEXT NULL,
        agent_id TEXT NOT NULL,
        payload_hash TEXT NOT NULL,
        signature BLOB NULL,
        prev_hash TEXT NOT NULL,
        event_hash TEXT NOT NULL,
        created_at INTEGER NOT NULL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS signed_events_link_once ON signed_events(link_id) WHERE event_type = 'link'",
    """CREATE TRIGGER IF NOT EXISTS signed_events_no_update BEFORE UPDATE ON signed_events BEGIN
        SELECT RAISE(ABORT, 'signed_events is append-only');
    END""",
    """CREATE TRIGGER IF NOT EXISTS signed_events_no_delete BEFORE DELETE ON signed_events BEGIN
        SELECT RAISE(ABORT, 'signed_events is append-only');
    END""",
))

_M2_FEDERATION = Migration(2, "federation", (
    """CREATE TABLE IF NOT EXISTS a2a_outbox (
        id INTEGER PRIMARY KEY,
        correlation_id TEXT NOT NULL,
        peer TEXT NOT NULL,
        kind TEXT NOT NULL,
        envelope BLOB NOT NULL,
        expires_at INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at INTEGER NOT NULL,
        last_error TEXT NULL,
        created_at INTEGER NOT NULL,
        UNIQUE (correlation_id, peer)
    )""",
    "CREATE INDEX IF NOT EXISTS a2a_outbox_due ON a2a_outbox(next_attempt_at)",
    "CREATE INDEX IF NOT EXISTS a2a_outbox_peer ON a2a_outbox(peer, id)",
    """CREATE TABLE IF NOT EXISTS a2a_dead_letters (
        id INTEGER PRIMARY KEY,
        correlation_id TEXT NOT NULL,
        peer TEXT NOT NULL,
        kind TEXT NOT NULL,
        envelope BLOB NOT NULL,
        expires_at INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        last_error TEXT NULL,
        created_at INTEGER NOT NULL,
        dead_at INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS a2a_dead_letters_peer ON a2a_dead_letters(peer, id)",
    """CREATE TABLE IF NOT EXISTS change_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL CHECK (kind IN ('memory','link')),
        ref_id TEXT NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        created_at INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS peer_state (
        peer TEXT PRIMARY KEY,
        last_sync_seq INTEGER NOT NULL DEFAULT 0,
        last_ack_at INTEGER NULL
    )""",
    """CREATE TABLE IF NOT EXISTS counters (
        name TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    )""",
))

_M3_TRUST = Migration(3, "trust", (
    # Signed memory versions: ``origin`` stays the creator, ``writer`` wrote this version and signed it.
    "ALTER TABLE memories ADD COLUMN writer TEXT NOT NULL DEFAULT ''",
    "UPDATE memories SET writer = origin WHERE writer = ''",
    "ALTER TABLE memories ADD COLUMN signature BLOB NULL",
    "ALTER TABLE memories ADD COLUMN signed_by TEXT NULL",
    "ALTER TABLE memories ADD COLUMN attest_level TEXT NOT NULL DEFAULT 'unsigned' "
    "CHECK (attest_level IN ('unsigned','self_signed','peer_attested'))",
    # JSON list of the agents the origin shares this memory's namespace with; NULL = unrestricted.
    "ALTER TABLE memories ADD COLUMN share_with TEXT NULL",
    "ALTER TABLE memories ADD COLUMN received_from TEXT NULL",
    # Sync items a pull could not apply yet: retried on later rounds, parked after federation.sync_park_after.
    """CREATE TABLE IF NOT EXISTS sync_pending (
        peer TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        ref_id TEXT NOT NULL,
        code TEXT NOT NULL,
        rounds INTEGER NOT NULL DEFAULT 1,
        item BLOB NOT NULL,
        parked INTEGER NOT NULL DEFAULT 0,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (peer, seq)
    )""",
))

# Number 3 belongs to the signed memory versions; the knowledge graph starts at 4.
_M4_KG = Migration(4, "knowledge_graph", (
    # Links are signed and immutable: an invalidation is a signed record of its own that ends one.
    """CREATE TABLE IF NOT EXISTS link_invalidations (
        inval_id TEXT PRIMARY KEY,
        link_id TEXT NOT NULL,
        observed_by TEXT NOT NULL,
        valid_until INTEGER NOT NULL,
        signature BLOB NULL,
        attest_level TEXT NOT NULL CHECK (attest_level IN ('unsigned','self_signed','peer_attested')),
        signed_by TEXT NULL,
        received_from TEXT NULL,
        created_at INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS link_invalidations_link ON link_invalidations(link_id, valid_until)",
))

_M5_PERMISSIONS = Migration(5, "permissions", (
    # Permission rules added at run time (`ai-memory permissions add`); the file's rules are not stored.
    """CREATE TABLE IF NOT EXISTS permission_rules (
        id INTEGER PRIMARY KEY,
        agent TEXT NOT NULL,
        namespace TEXT NOT NULL,
        operations TEXT NOT NULL,
        action TEXT NOT NULL CHECK (action IN ('allow','deny','ask','approved')),
        inherit INTEGER NOT NULL DEFAULT 1,
        created_by TEXT NOT NULL,
        created_at INTEGER NOT NULL
    )""",
))

_M6_APPROVALS = Migration(6, "approvals", (
    # Operations parked by an `ask` (a rule or a hook): applied exactly once on approval, or never.
    """CREATE TABLE IF NOT EXISTS pending_actions (
        id TEXT PRIMARY KEY,
        agent TEXT NOT NULL,
        operation TEXT NOT NULL,
        namespace TEXT NOT NULL,
        call TEXT NOT NULL,
        prompt TEXT NOT NULL,
        options TEXT NOT NULL,
        default_choice TEXT NOT NULL,
        asked_by TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending','applied','denied','expired','failed')),
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        decided_at INTEGER NULL,
        decided_by TEXT NULL,
        result TEXT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS pending_actions_status ON pending_actions(status, expires_at)",
))

_M7_SUBSCRIPTIONS = Migration(7, "subscriptions", (
    # Webhook subscriptions and their deliveries (signed, retried, dead-lettered, replayable).
    """CREATE TABLE IF NOT EXISTS subscriptions (
        id INTEGER PRIMARY KEY,
        url TEXT NOT NULL,
        events TEXT NOT NULL,
        secret TEXT NOT NULL,
        created_at INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS subscription_deliveries (
        id INTEGER PRIMARY KEY,
        subscription_id INTEGER NOT NULL,
        event TEXT NOT NULL,
        body BLOB NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending','delivered','dead')),
        last_error TEXT NULL,
        created_at INTEGER NOT NULL,
        delivered_at INTEGER NULL
    )""",
    "CREATE INDEX IF NOT EXISTS subscription_deliveries_due ON subscription_deliveries(status, next_attempt_at)",
))

# Transcripts: zstd-compressed conversation trails and the spans memories cite (docs/transcripts.md).
# A transcript moves from the hot table to the archive table after
# its TTL, so the links name it by id (checked in the write) and only the memory by foreign key.
_M8_TRANSCRIPTS = Migration(8, "transcripts", tuple(
    f"""CREATE TABLE IF NOT EXISTS {table} (
        id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        agent TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        body BLOB NOT NULL,
        raw_bytes INTEGER NOT NULL,
        stored_bytes INTEGER NOT NULL,
        content_hash TEXT NOT NULL,
        signature BLOB NULL,
        attest_level TEXT NOT NULL CHECK (attest_level IN ('unsigned','self_signed','peer_attested')),
        signed_by TEXT NULL,
        received_from TEXT NULL{extra}
    )""" for table, extra in (("memory_transcripts", ""),
                              ("memory_transcripts_archive", ",\n        archived_at INTEGER NOT NULL"))
) + (
    "CREATE INDEX IF NOT EXISTS memory_transcripts_ns_created ON memory_transcripts(namespace, created_at)",
    "CREATE INDEX IF NOT EXISTS memory_transcripts_archive_ns ON memory_transcripts_archive(namespace, archived_at)",
    """CREATE TABLE IF NOT EXISTS memory_transcript_links (
        memory_id TEXT NOT NULL REFERENCES memories(id),
        transcript_id TEXT NOT NULL,
        span_start INTEGER NOT NULL CHECK (span_start >= 0),
        span_end INTEGER NOT NULL CHECK (span_end >= span_start),
        PRIMARY KEY (memory_id, transcript_id, span_start, span_end)
    )""",
    "CREATE INDEX IF NOT EXISTS memory_transcript_links_tx ON memory_transcript_links(transcript_id)",
))

# The sharing list signed with the memory version (docs/protocol.md, "The version step").
_M9_SIGNED_SHARING = Migration(9, "signed_sharing", (
    # Which field set a version's signature covers: 1 without share_with (every version stored before), 2 with it.
    "ALTER TABLE memories ADD COLUMN signed_set INTEGER NOT NULL DEFAULT 1 CHECK (signed_set IN (1, 2))",
    # Pull every peer's change log once more from the start: while this node read no memory.put.v2, its peers
    # left restricted memories out of the pages they served it, and its cursors went past them.
    "UPDATE peer_state SET last_sync_seq = 0",
))

# What each peer reads beyond the common kinds, as its last sync page said: kept so that every process writing to
# the store (the CLI beside a node, an embedded MCP) queues the forms the node's peers read.
_M10_PEER_ACCEPTS = Migration(10, "peer_accepts", (
    # A JSON array of payload kinds; NULL: this node never heard from the peer.
    "ALTER TABLE peer_state ADD COLUMN accepts TEXT",
))

# ---- agents ----------------------------------------------------------------------------------------------
# Agents as principals (docs/security.md, "Agents"): the delegations nodes signed for their agents and the
# revocations that end them, each a signed record kept as received; and the per-agent storage quota's read.
_M11_AGENTS = Migration(11, "agents", (
    """CREATE TABLE IF NOT EXISTS agent_delegations (
        delegation_id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        agent_key BLOB NOT NULL,
        issuer TEXT NOT NULL,
        valid_from INTEGER NOT NULL,
        valid_until INTEGER NOT NULL,
        signature BLOB NOT NULL,
        attest_level TEXT NOT NULL CHECK (attest_level IN ('self_signed','peer_attested')),
        received_from TEXT NULL,
        created_at INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS agent_delegations_agent ON agent_delegations(agent_id, valid_from)",
    """CREATE TABLE IF NOT EXISTS agent_revocations (
        revocation_id TEXT PRIMARY KEY,
        delegation_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        issuer TEXT NOT NULL,
        revoked_at INTEGER NOT NULL,
        signature BLOB NOT NULL,
        attest_level TEXT NOT NULL CHECK (attest_level IN ('self_signed','peer_attested')),
        received_from TEXT NULL,
        created_at INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS agent_revocations_delegation ON agent_revocations(delegation_id, revoked_at)",
    # The per-agent storage quota (on by default now) sums one writer's memories.
    "CREATE INDEX IF NOT EXISTS memories_writer ON memories(writer)",
))

# Recall on Postgres (storage/memories.py recall_pg; PERFORMANCE.md, "Recall on Postgres"). Nothing on SQLite.
_M14_PG_RECALL = Migration(14, "pg_recall", (), postgres=(
    # With fastupdate (the default) new rows' words wait in the GIN index's pending list, which every search
    # reads through and which the planner prices so high that it scanned the whole table instead: recall p50
    # 20 ms -> 0.5 ms at 10k memories once the list was flushed. Rows go straight into the index instead.
    "ALTER INDEX memories_fts_gin SET (fastupdate = off)",
    "SELECT gin_clean_pending_list('memories_fts_gin'::regclass)",
))

# An outbox row says which dead letter it was replayed from, so the node logs the replay when it sends it.
# (Dead-letter ids come from the counter dead_letter_id since: storage/outbox.py.)
_M17_REPLAYED_FROM = Migration(17, "replayed_from", (
    "ALTER TABLE a2a_outbox ADD COLUMN replayed_from INTEGER NULL",
))

# Who wrote each change, as the item names it (a memory version's writer, a link's or an invalidation's observer):
# a sync page skips the writers its puller gets from their own nodes in SQL, rather than reading each row's item
# to find its author (node/federation/sync.py). NULL: not recorded (rows written before, and the kinds that do not
# record it); such a row's author is read from its item as before.
_M18_CHANGE_AUTHOR = Migration(18, "change_author", (
    "ALTER TABLE change_log ADD COLUMN author TEXT NULL",
))

# Each writer's stored bytes (content + title, UTF-8), kept by triggers: the storage quota read a sum over every
# memory its agent wrote, once a second and once per concurrent store when stale, so at a million memories the
# readers spent seconds of CPU a second on it and the fill fell to ~200/s (PERFORMANCE.md, "A node at a million
# memories"). One row per writer, a few microseconds per insert. SQLite only: Postgres still sums (the gate
# shares one sum among the checks that find it stale). Derived from ``memories``, so `ai-memory migrate` does
# not move it (DERIVED_TABLES).
_WRITER_BYTES = "length(CAST({r}.content AS BLOB)) + length(CAST({r}.title AS BLOB))"
_ADD_WRITER_BYTES = ("INSERT INTO writer_bytes (writer, bytes) VALUES (NEW.writer, " + _WRITER_BYTES.format(r="NEW")
                     + ") ON CONFLICT (writer) DO UPDATE SET bytes = bytes + excluded.bytes;")
_SUB_WRITER_BYTES = ("UPDATE writer_bytes SET bytes = bytes - (" + _WRITER_BYTES.format(r="OLD")
                     + ") WHERE writer = OLD.writer;")
_M20_WRITER_BYTES = Migration(20, "writer_bytes", (), sqlite=(
    "CREATE TABLE IF NOT EXISTS writer_bytes (writer TEXT PRIMARY KEY, bytes INTEGER NOT NULL)",
    "DELETE FROM writer_bytes",
    "INSERT INTO writer_bytes (writer, bytes) SELECT writer, coalesce(sum(" + _WRITER_BYTES.format(r="memories")
    + "), 0) FROM memories GROUP BY writer",
    f"CREATE TRIGGER IF NOT EXISTS writer_bytes_ai AFTER INSERT ON memories BEGIN {_ADD_WRITER_BYTES} END",
    f"CREATE TRIGGER IF NOT EXISTS writer_bytes_ad AFTER DELETE ON memories BEGIN {_SUB_WRITER_BYTES} END",
    "CREATE TRIGGER IF NOT EXISTS writer_bytes_au AFTER UPDATE OF writer, content, title ON memories BEGIN "
    f"{_SUB_WRITER_BYTES} {_ADD_WRITER_BYTES} END",
))

MIGRATIONS: tuple[Migration, ...] = (_M1_CORE, _M2_FEDERATION, _M3_TRUST, _M4_KG, _M5_PERMISSIONS,
                                     _M6_APPROVALS, _M7_SUBSCRIPTIONS, _M8_TRANSCRIPTS, _M9_SIGNED_SHARING,
                                     _M10_PEER_ACCEPTS, _M11_AGENTS, _M14_PG_RECALL, _M17_REPLAYED_FROM,
                                     _M18_CHANGE_AUTHOR, _M20_WRITER_BYTES)
MAX_SUPPORTED_SCHEMA: int = MIGRATIONS[-1].version

# Every name our migrations create, including FTS5 shadow tables and sqlite's own bookkeeping.
OUR_TABLES = frozenset({
    "memories", "memories_fts", "memories_fts_data", "memories_fts_idx", "memories_fts_docsize",
    "memories_fts_config", "memory_links", "signed_events", "a2a_outbox", "a2a_dead_letters",
    "change_log", "peer_state", "counters", "sync_pending", "link_invalidations", "permission_rules",
    "pending_actions", "subscriptions", "subscription_deliveries", "memory_transcripts", "memory_transcripts_archive",
    "memory_transcript_links", "sqlite_sequence", "sqlite_stat1", "sqlite_stat4",
    "agent_delegations", "agent_revocations",  # migration 11 (agents)
    "writer_bytes",  # migration 20
})
# Tables kept from others by triggers (SQLite only): rebuilt where rows land, never copied by `ai-memory migrate`.
DERIVED_TABLES = frozenset({"writer_bytes"})


def run_statements(conn: sqlite3.Connection, migration: Migration) -> None:
    """Execute one migration's statements on ``conn`` (no transaction, no version bump).

    Idempotent by construction (an ``ALTER TABLE ... ADD COLUMN`` is skipped when the column exists);
    exposed so tests can prove that repeating a migration changes nothing.
    """
    for sql in migration.statements + migration.sqlite:
        added = _ADD_COLUMN.match(sql)
        if added and added["column"] in {r[1] for r in conn.execute(f"PRAGMA table_info({added['table']})")}:
            continue
        conn.execute(sql)


_ADD_COLUMN = re.compile(r"ALTER TABLE (?P<table>\w+) ADD COLUMN (?P<column>\w+) ")


def apply(conn: sqlite3.Connection, migration: Migration) -> bool:
    """Apply ``migration`` in its own IMMEDIATE transaction if the file is below its version.

    ``conn`` must be in autocommit mode (isolation_level=None). Returns True when it ran.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current > MAX_SUPPORTED_SCHEMA:
            raise _too_new(current)
        if current >= migration.version:
            conn.execute("ROLLBACK")
            return False
        run_statements(conn, migration)
        conn.execute(f"PRAGMA user_version = {migration.version:d}")
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def migrate(conn: sqlite3.Connection) -> int:
    """Bring ``conn``'s database up to MAX_SUPPORTED_SCHEMA; returns the resulting schema version."""
    try:
        for m in MIGRATIONS:
            apply(conn, m)
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as e:
        raise translate(e, "running schema migrations") from e


def _too_new(found: int) -> StorageError:
    return StorageError(
        StorageCode.SCHEMA_TOO_NEW,
        f"the database was written by schema {found}, this build supports up to {MAX_SUPPORTED_SCHEMA}; "
        "upgrade attested-mesh to open it (the file was left unchanged)",
    )


def guard(path: Path) -> None:
    """Refuse, without changing a byte of the file, a database this build must not touch.

    Opens the file read-only and checks: it is SQLite (else ``not_a_database``), its schema is not
    newer than ours (``schema_too_new``), and it is ours or empty (``foreign_database``).
    A missing or zero-length file passes: it becomes a new database.
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as e:
        raise translate(e, f"opening {path} read-only") from e
    try:
        user_version = conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e) or getattr(e, "sqlite_errorname", "") == "SQLITE_NOTADB":
            raise StorageError(StorageCode.NOT_A_DATABASE,
                               f"{path} is not an SQLite database; refusing to touch it (left unchanged)") from e
        raise translate(e, f"reading the header of {path}") from e
    finally:
        conn.close()
    if user_version > MAX_SUPPORTED_SCHEMA:
        raise _too_new(user_version)
    if app_id not in (0, APPLICATION_ID):
        raise StorageError(StorageCode.FOREIGN_DATABASE,
                           f"{path} belongs to another application (application_id {app_id:#x}); left unchanged")
    foreign = sorted(n for n in names if n not in OUR_TABLES)
    if foreign or (user_version > 0 and app_id != APPLICATION_ID):
        shown = ", ".join(foreign[:5]) or f"user_version {user_version} without our application_id"
        raise StorageError(StorageCode.FOREIGN_DATABASE,
                           f"{path} is an SQLite database of another application ({shown}); left unchanged")
