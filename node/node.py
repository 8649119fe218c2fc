"""The node process: service + mesh server + peer links + outbox sender + catch-up, with one lifecycle.

``serve(cfg, load)`` runs until SIGTERM/SIGINT, then drains: stop accepting, stop the sender, give ACK
waits ``drain_timeout_s``, close sockets and the database, and logs ``node_stopped`` with the signal. SIGHUP
reads the configuration again (``load``) and puts its live settings in force (``node.reload``: peers' links
started and stopped, namespace policies, the log level, the hooks and permission rules files read now), naming
what needs a restart; a file that does not load is refused in one log line and the running configuration kept.
A failure after ``node_ready`` is logged ``node_crashed`` before the process exits non-zero; a start that fails
leaves none of the files it created behind. Every task is owned by one TaskGroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from a2a import Backoff, RetrySchedule, SeenCache
from base.errors import ProjectError, describe
from mesh import tls
from mesh.heap import keep_tls_reads_on_the_heap
from mesh.keys import Identity
from mesh.link import PeerLink
from mesh.linkstate import LinkState
from mesh.receive import Receiver
from mesh.server import MeshServer, ServerHooks
from node import files, reload
from node.assemble import Store, assemble, open_store
from node.config import NodeConfig, PeerConfig
from node.events.delivery import WebhookDelivery
from node.federation.outbound import AckSignal, DeliveryFeedback, PeerAccepts
from node.federation.restore import RestoreProgress, prepare
from node.federation.sender import OutboxSender
from node.federation.sync import PeerSync, PullSettings
from node.hooks import HookEvent
from node.hooks.config import load_hooks
from node.hooks.pipeline import HookPipeline
from node.log import REPEAT_WINDOW_S, STATE_CHANGE, flush_repeats
from node.mcp.backend import ServiceBackend
from node.mcp.peers import peer_rows
from node.metrics import NodeMetrics, PeerScrape, Scrape, StorageScrape
from node.pause import StoragePause
from node.permissions.gate import load_rules_file
from node.readiness import WATCH_S, ReadyLog
from node.sdnotify import Notifier
from node.service import now_ms
from node.trust import load_node_identity
from node.version import version
from storage.errors import StorageCode, StorageError
from storage.watch import StoreWatch

log = logging.getLogger("node")

GIL_SWITCH_INTERVAL_S = 0.0005
# The store's conditions /metrics always shows (0 or 1 each), whichever backend.
STORAGE_CONDITIONS = (StorageCode.STORAGE_UNAVAILABLE, StorageCode.STORAGE_CORRUPT, StorageCode.STORAGE_FULL)


class TlsContexts(NamedTuple):
    """The node's mutual-TLS contexts, built from its key and certificates before its store is opened."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    @classmethod
    def of(cls, cfg: NodeConfig) -> TlsContexts:
        ident = load_node_identity(cfg, required=True)
        assert ident is not None  # required=True raises instead
        return cls(tls.server_context(cfg.cert_path, ident.priv_path, cfg.ca_cert_path),
                   tls.client_context(cfg.cert_path, ident.priv_path, cfg.ca_cert_path))


@dataclass
class Signals:
    """What the process's signals ask of the node: stop (``reason``: the signal's name) or read its configuration
    again (``reload``, SIGHUP)."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    reload: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""

    def stop_for(self, reason: str) -> None:
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()

    def install(self) -> None:
        """SIGTERM and SIGINT stop (drain), SIGHUP reloads: from now on, before the node is even open."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_for, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self.reload.set)


# Reads the node's configuration file again (the one it was started with, the same environment).
Load = Callable[[], NodeConfig]


class Node:
    """One node process on an opened store: it builds its peer links and outbox sender, then the federation and
    the service with the sender as their delivery (``node.assemble``), and runs them under one lifecycle.
    ``load`` reads the configuration again on SIGHUP."""

    def __init__(self, cfg: NodeConfig, store: Store, contexts: TlsContexts, load: Load,
                 restore: RestoreProgress | None = None) -> None:
        self.cfg = cfg
        # A restore from the mesh in progress (`serve --restore`, or resumed): its pulls, /readyz and status.
        self.restore = restore
        self.started_at = time.time()
        ident = store.identity
        assert ident is not None
        self.identity: Identity = ident
        self.keyring = store.keyring
        self.hooks = store.hooks
        self.gate = store.gate
        self.db = store.db
        self._load = load
        self.server_ssl, self.client_ssl = contexts
        self.links = {p.agent_id: self._link(p) for p in cfg.mesh.peers}
        accepts, acks = PeerAccepts(), AckSignal()
        self.accepts = accepts
        self.metrics = NodeMetrics(self.scrape)
        self.sender = OutboxSender(store.db, self.links, RetrySchedule(cfg.a2a.retry_delays_s), now_ms,
                                   DeliveryFeedback(acks, accepts, self.metrics),
                                   window_bytes=cfg.federation.send_window_bytes)
        built = assemble(store, clock=now_ms, delivery=self.sender, accepts=accepts, acks=acks)
        self.svc, self.fed, self.webhooks = built.service, built.federation, built.webhooks
        self.webhook_delivery = WebhookDelivery(built.webhooks)
        self.seen = SeenCache(maxsize=cfg.a2a.seen_cache_size, on_evict=self._seen_evicted)
        self.receiver = Receiver(ident.agent_id, self.seen, self.fed.apply, max_bytes=cfg.a2a.max_message_bytes,
                                 clock_ms=now_ms, apply_timeout_s=cfg.a2a.apply_timeout_s,
                                 apply_now=self.fed.apply_now)
        self.server = MeshServer(ServerHooks(receiver=self.receiver, pinned=self.pinned_keys,
                                             health=self.health, sync=self.fed.serve_sync, member=self.is_member,
                                             ready=self.readiness, metrics=self._render_metrics,
                                             member_generation=self.member_generation),
                                 self.server_ssl, cfg.mesh.listen_host, cfg.mesh.listen_port, cfg.mesh.health_port,
                                 cfg.mesh.health_host)
        # Each peer's catch-up: its pull loop, cursor, stats and "sync wanted".
        self.syncs = {peer: self._sync(peer) for peer in self.links}
        # Each peer's link and catch-up tasks, so that a reload can stop a removed peer's.
        self._peer_tasks: dict[str, list[asyncio.Task[None]]] = {}
        # SQLite's integrity check (at start and every storage.integrity_check_interval_s) and the full-disk probe.
        # A store past storage.start_check_max_bytes is checked by the watch's first tick, once the node serves:
        # the check reads the whole file, and start-up must not grow with the store.
        self.check_at_start = store.db.bytes_used() <= cfg.storage.start_check_max_bytes
        self.watch = StoreWatch(store.db, integrity_every_s=cfg.storage.integrity_check_interval_s,
                                check_first=not self.check_at_start)
        self.extra_services: list[Any] = []
        # Set on drain: the approval sweep and the webhooks stop at their next turn.
        self._closing = False
        # Set once the node serves (node_ready): a failure before it is a failed start, after it a crash.
        self.ready = False
        # The tool backend the local MCP doors share (its call counts feed /metrics); set at start.
        self.backend: ServiceBackend | None = None

    def _link(self, p: PeerConfig) -> PeerLink:
        cfg = self.cfg
        return PeerLink(p.agent_id, p.url, self.client_ssl, pinned=self.pinned_keys,
                        backoff=Backoff(cfg.mesh.reconnect_min_s, cfg.mesh.reconnect_max_s),
                        ack_timeout_s=cfg.a2a.ack_timeout_s, max_bytes=cfg.a2a.max_message_bytes,
                        member=self.is_member)

    def _sync(self, peer: str) -> PeerSync:
        return PeerSync(peer, self.links, self.fed.pulled, self.accepts, self.db, PullSettings.of(self.cfg),
                        self.restore)

    def is_member(self, agent_id: str) -> bool:
        """May ``agent_id`` (from a valid mesh certificate) talk to this node at all?"""
        return self.cfg.mesh.trust == "ca" or self.keyring.is_member(agent_id)

    def member_generation(self) -> int:
        """Moves whenever ``is_member``'s answers may have changed (the keyring reloaded)."""
        return self.keyring.generation

    def _seen_evicted(self, correlation_id: str, expires_at: int) -> None:
        self.hooks.notify(HookEvent.ON_INDEX_EVICTION, {
            "index": "seen_cache", "key": correlation_id, "expires_at": expires_at, "size": len(self.seen),
            "maxsize": self.seen.maxsize})

    def pinned_keys(self) -> dict[str, Ed25519PublicKey]:
        """Keys certificates must match: every trusted peer's, and our own (a CA-issued certificate naming
        this node over another key must not pass as us)."""
        ident = self.identity
        return {**self.keyring.peer_keys, ident.agent_id: ident.public_key}

    @classmethod
    async def open(cls, cfg: NodeConfig, load: Load, *, restore: bool = False) -> Node:
        """Check the home's files, the key, certificates and rules file, then open the store: a home this node
        cannot run on is refused before any file is created in it. ``restore``: a restore from the mesh (refused
        unless the store is empty), also resumed when one was in progress."""
        files.check(cfg.home, cfg.home_files(serving=True))
        contexts = TlsContexts.of(cfg)
        load_rules_file(cfg.permissions_path)  # the gate reads it after the store opens; refuse a bad one first
        store = await open_store(cfg, require_identity=True)
        try:
            progress = await prepare(cfg, store.db, requested=restore, now_ms=now_ms())
            node = cls(cfg, store, contexts, load, progress)
            # Before anything is served: a damaged file is not ready from the first /readyz on.
            if node.check_at_start:
                await node.watch.check()
        except BaseException:
            await store.close()
            raise
        return node

    # ---- lifecycle ------------------------------------------------------------------------

    async def run(self, signals: Signals, notifier: Notifier | None = None,
                  started: Mapping[str, Any] | None = None) -> None:
        """Serve until ``signals.stop``, then drain; SIGHUP (``signals.reload``) reloads the configuration.
        ``notifier`` tells systemd (``Type=notify``) when the node serves, reloads and drains; ``started``: fields
        the ``node_ready`` line carries besides the bound port (``banner()``)."""
        notifier = notifier or Notifier(None)
        try:
            # Every listener is bound before any task starts: a port or socket in use is one plain error. The
            # local socket and MCP HTTP first, so that /healthz answering means every listener is up.
            await self._start_extras()
            port = await self.server.start()
            self._warn_unpinned_peers(list(self.links))
            async with asyncio.TaskGroup() as tg:
                for peer in self.links:
                    self._start_peer(peer, tg)
                sender = tg.create_task(self.sender.run(), name="outbox")
                background = [tg.create_task(self._sweep_loop(), name="approvals:sweep"),
                              tg.create_task(self.webhook_delivery.run(lambda: self._closing), name="webhooks"),
                              # Cancelled on drain: a lifecycle pass is one transaction, safe to cut short.
                              tg.create_task(self.svc.transcripts.run_lifecycle(), name="transcripts"),
                              tg.create_task(self.watch.run(), name="storage:watch"),
                              tg.create_task(self._reloads(signals, tg, notifier), name="config:reload"),
                              tg.create_task(self._readiness_watch(), name="readiness"),
                              tg.create_task(self._repeats_loop(), name="log:repeats")]
                self._write_status(port)
                self.ready = True
                log.info("node_ready", extra={"ev": {**(started or {}), "port": port, "peers": list(self.links),
                                                     "pid": os.getpid()}})
                notifier.ready(self._serving_status())
                await signals.stop.wait()
                notifier.stopping(signals.reason)
                log.info("node_draining", extra={"ev": {"reason": signals.reason,
                                                        "timeout_s": self.cfg.mesh.drain_timeout_s}})
                await self._drain(sender, background)
        finally:
            await self._stop_extras()
            await self.server.stop(self.cfg.mesh.drain_timeout_s)
            await self.svc.close()
            self._status_path.unlink(missing_ok=True)

    def _start_peer(self, peer: str, tg: asyncio.TaskGroup) -> None:
        link = self.links[peer]
        link.on_up(partial(self._link_up, peer))
        self._peer_tasks[peer] = [tg.create_task(link.run(), name=f"link:{peer}"),
                                  tg.create_task(self.syncs[peer].run(), name=f"sync:{peer}")]

    async def _stop_peer(self, peer: str) -> None:
        """End a peer's catch-up and link (a reload removed it); its outbox worker ends with it."""
        self.syncs.pop(peer).stop()
        await self.links.pop(peer).close()
        for task in self._peer_tasks.pop(peer, []):
            task.cancel()

    def _link_up(self, peer: str) -> None:
        """A link came up: its outbox worker sends what waited for it and looks in the database, and its catch-up
        pulls now."""
        self.sender.link_up(peer)
        self.syncs[peer].want()

    def _warn_unpinned_peers(self, peers: list[str]) -> None:
        for peer in peers:
            if peer not in self.keyring.peer_keys:
                log.warning("peer_without_pub", extra={"ev": {
                    "peer": peer, "trust": self.cfg.mesh.trust,
                    "effect": ("its connections are refused (not_a_member) and its links cannot be pinned; import "
                               "its .pub with `ai-memory identity import`") if self.cfg.mesh.trust == "pinned"
                    else "trusted on the mesh CA alone; its signatures cannot be verified (unsigned)"}})

    # ---- configuration reload (SIGHUP) ----------------------------------------------------

    async def _reloads(self, signals: Signals, tg: asyncio.TaskGroup, notifier: Notifier) -> None:
        while True:
            await signals.reload.wait()
            signals.reload.clear()
            notifier.reloading()
            await self.reload_config(tg)  # a file that does not load is refused: the node serves on either way
            notifier.ready(self._serving_status())

    def _serving_status(self) -> str:
        """systemd's one-line STATUS (``systemctl status``) while the node serves."""
        return f"serving on {self.cfg.mesh.listen_host}:{self.server.port}, {len(self.links)} peer(s) configured"

    async def reload_config(self, tg: asyncio.TaskGroup) -> None:
        """Read the configuration again and put its live settings in force (``node.reload``); a file that does not
        load, or a hooks or rules file that does not, is refused in one log line and nothing changes."""
        try:
            new = await asyncio.to_thread(self._load)
            await asyncio.to_thread(_check_reread_files, self.cfg)
        except Exception as e:  # refused whole: the node keeps serving on the configuration it has
            d = describe(_explained(e, self.cfg.home))
            log.error("config_reload_refused", extra={"ev": {"code": d.code, "error": d.message,
                                                             "kept": "the running configuration"}})
            return
        plan = reload.plan(self.cfg, new)
        for peer in plan.peers_removed:
            await self._stop_peer(peer)
        self.cfg = plan.in_force
        self.fed.reconfigure(self.cfg)
        for p in plan.peers_added:
            self.links[p.agent_id] = self._link(p)
            self.syncs[p.agent_id] = self._sync(p.agent_id)
            self._start_peer(p.agent_id, tg)
        if plan.peers_added or plan.peers_removed:
            self.sender.peers_changed()
            self._warn_unpinned_peers([p.agent_id for p in plan.peers_added])
        logging.getLogger().setLevel(self.cfg.log.level.upper())
        if isinstance(self.hooks, HookPipeline):
            self.hooks.reload_now()
        try:
            await self.gate.refresh()
        except Exception as e:  # the store may be away: the gate looks again at its next check
            log.warning("permissions_refresh_failed", extra={"ev": {"error": describe(e).message}})
        log.info("config_reloaded", extra={"ev": {
            "changed": list(plan.live), "peers_added": [p.agent_id for p in plan.peers_added],
            "peers_removed": list(plan.peers_removed), "peers": list(self.links)}})
        if plan.needs_restart:
            log.warning("config_needs_restart", extra={"ev": {
                "settings": list(plan.needs_restart),
                "effect": "these keep their running values: they need a restart to change"}})

    async def _drain(self, sender: asyncio.Task[None], background: list[asyncio.Task[Any]]) -> None:
        """Stop accepting, let in-flight sends finish (bounded), then close links and stop their tasks."""
        self._closing = True
        for sync in self.syncs.values():
            sync.stop()
        await self.server.stop_accepting()
        self.sender.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(sender), self.cfg.mesh.drain_timeout_s)
        sender.cancel()
        for link in self.links.values():
            await link.close()
        # A link may be mid-handshake or in its backoff sleep: nothing of value is lost by cancelling it.
        for task in [*background, *(t for tasks in self._peer_tasks.values() for t in tasks)]:
            task.cancel()

    async def _start_extras(self) -> None:
        """The HMAC approval API when configured, and the local MCP transports (stdio joins over the socket;
        HTTP when configured)."""
        if self.cfg.approval.enabled and self.cfg.approval.http_port:
            from node.permissions.approval_api import start_approval_api
            self.extra_services.append(await start_approval_api(self.svc, self.cfg))
        from node.mcp.socket import start_local_socket

        backend = self.backend = ServiceBackend(self.svc, runtime=self)
        self.extra_services.append(await start_local_socket(backend, self.cfg.socket_path))
        if self.cfg.mcp.http_port:
            # The MCP SDK (most of a start's CPU) loads only for the HTTP door: the local socket speaks our own
            # frames, and `ai-memory mcp` joined over it imports the SDK in its own process.
            from mesh.agentkeys import AgentTokens
            from node.mcp import server as mcp_server
            # A request carrying an agent's bearer token acts as that agent (docs/mcp.md, "Agents").
            self.extra_services.append(await mcp_server.start_http(backend, self.cfg.mcp.http_host,
                                                                   self.cfg.mcp.http_port, self.cfg.mcp.profile,
                                                                   tokens=AgentTokens(self.cfg.keys_dir)))

    async def _stop_extras(self) -> None:
        for handle in reversed(self.extra_services):
            with contextlib.suppress(Exception):
                await handle.stop()
        self.extra_services.clear()

    @property
    def _status_path(self) -> Path:
        return self.cfg.status_path

    def _write_status(self, port: int) -> None:
        self._status_path.parent.mkdir(parents=True, exist_ok=True)
        status = {"agent_id": self.svc.agent_id, "pid": os.getpid(), "port": port, "started_at": self.started_at,
                  "mcp_http_port": self.cfg.mcp.http_port or None, "socket": str(self.cfg.socket_path)}
        tmp = self._status_path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(status))
        os.replace(tmp, self._status_path)

    # ---- pending actions ------------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        """Expire pending actions past their time every ``approval.sweep_interval_s``; while the database refuses
        (away, full, damaged) the rounds pause instead, logged once (node/pause.py)."""
        approvals = self.svc.approvals
        pause = StoragePause("approvals:sweep", log)
        while not self._closing and approvals is not None:
            wait_s = self.cfg.approval.sweep_interval_s
            try:
                await approvals.sweep()
            except StorageError as e:
                wait_s = min(wait_s, pause.failed(e, "sweep"))
            except Exception as e:  # anything else: the next round retries
                log.warning("approval_sweep_failed", extra={"ev": {"error": f"{type(e).__name__}: {e}"}})
            else:
                pause.ok()
            await asyncio.sleep(wait_s)

    async def _repeats_loop(self) -> None:
        """Every REPEAT_WINDOW_S until the drain: the warnings held back from a source that did not warn again are
        written with their count (node/log.py ``flush_repeats``), so a burst's size is told even when it ends."""
        while not self._closing:
            await asyncio.sleep(REPEAT_WINDOW_S)
            flush_repeats()

    async def _readiness_watch(self) -> None:
        """Log each switch of /readyz, both ways (node/readiness.py), looking every WATCH_S until the drain."""
        seen = ReadyLog()
        while not self._closing:
            ok, body = self.readiness()
            switch = seen.observe(ok, body["reasons"], time.monotonic())
            if switch is not None:
                log.log(logging.getLevelName(switch.level.upper()), switch.event,
                        extra={"ev": dict(switch.fields), STATE_CHANGE: True})
            await asyncio.sleep(WATCH_S)

    # ---- live state -----------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "agent_id": self.svc.agent_id,
                "peers": {p: link.state.value for p, link in self.links.items()}}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready unless degraded: peers are configured and no link is up, the store is away, damaged or full
        (``storage.health``), or the storage writer is stuck."""
        reasons = []
        states = {p: link.state.value for p, link in self.links.items()}
        if states and LinkState.UP.value not in states.values():
            reasons.append({"code": "no_peer_link", "message": f"none of the {len(states)} configured peer links "
                                                               "is up"})
        for condition in self.svc.db.health.conditions():
            reasons.append({"code": str(condition.code), "message": condition.message})
        restoring = self.restore.reason() if self.restore is not None else None
        if restoring is not None:
            reasons.append(restoring)
        busy = self.svc.db.writer_busy_s()
        if busy >= self.cfg.mesh.ready_writer_stuck_s:
            reasons.append({"code": "writer_stuck", "message": f"the storage writer has been in one batch for "
                                                               f"{busy:.1f} s (mesh.ready_writer_stuck_s = "
                                                               f"{self.cfg.mesh.ready_writer_stuck_s:g})"})
        return not reasons, {"ready": not reasons, "agent_id": self.svc.agent_id, "reasons": reasons,
                             "peers": states}

    async def scrape(self) -> Scrape:
        """The node's metrics as plain values, read now (without the peers' stored counts while the database
        refuses: /metrics still answers, with aimem_ready 0 and the storage conditions)."""
        try:
            rows = await peer_rows(self.svc, self.links, self.sender)
        except StorageError:
            rows = []
        now = time.monotonic()
        peers = {r["agent_id"]: PeerScrape(
            state=r["link_state"], outbox_depth=r["outbox_depth"], dead_letters=r["dead_letters"],
            last_sync_seq=r["last_sync_seq"], parked=r["parked"], parked_unknown_key=r["parked_unknown_key"],
            sync_last_pull_unix_s=self._sync_last_pull(r["agent_id"], now),
            sync_lag_seqs=self.syncs[r["agent_id"]].progress.lag(),
            sync_pulled=self.syncs[r["agent_id"]].progress.pulled)
            for r in rows if r["agent_id"] in self.links}
        rejections: Counter[str] = Counter()
        for counters in (self.receiver.counters, self.fed.counters):
            for key, n in counters.items():
                if key.startswith(("rejected:", "protocol_error:")):
                    rejections[key.split(":", 1)[1]] += n
        hooks = {(h["name"], outcome): n for h in self.svc.hooks.snapshot()["hooks"]
                 for outcome, n in h["counts"].items()}
        health = self.svc.db.health
        storage = {str(code): StorageScrape(in_force=code in health, began=health.began.get(code, 0))
                   for code in STORAGE_CONDITIONS}
        last = self.watch.last
        return Scrape(peers=peers, rejections=rejections, hooks=hooks,
                      mcp_calls=dict(self.backend.calls) if self.backend else {}, ready=self.readiness()[0],
                      writer_busy_s=min(self.svc.db.writer_busy_s(), 1e9), delivered=self.sender.delivered,
                      dead_lettered=self.sender.dead_lettered, storage=storage,
                      integrity_check_s=None if last is None else last.seconds, storage_bytes=self._storage_bytes(),
                      mcp_latency=dict(self.backend.latency.by_key) if self.backend else {}, version=version(),
                      agent_calls=dict(self.svc.agents.calls))

    def _sync_last_pull(self, peer: str, now: float) -> float | None:
        """When ``peer``'s last pull completed, unix seconds (time.monotonic() ``now``); None before the first."""
        synced_at = self.syncs[peer].synced_at
        return None if synced_at is None else time.time() - (now - synced_at)

    async def _render_metrics(self, accept: str) -> tuple[bytes, str]:
        return await self.metrics.render(accept)

    def _storage_bytes(self) -> int | None:
        try:
            return self.svc.db.bytes_used()
        except OSError:  # the file went away between its check and its stat
            return None

    async def peers(self) -> list[dict[str, Any]]:
        return await peer_rows(self.svc, self.links, self.sender)

    def transports(self) -> list[str]:
        out = [f"mesh:mtls:{self.cfg.mesh.listen_host}:{self.server.port}", f"mcp:socket:{self.cfg.socket_path}"]
        if self.cfg.mcp.http_port:
            out.append(f"mcp:http:http://{self.cfg.mcp.http_host}:{self.cfg.mcp.http_port}/mcp")
        return out

    def restore_progress(self) -> dict[str, Any] | None:
        """The restore from the mesh this node runs (or ran since it started), or None."""
        return self.restore.snapshot() if self.restore is not None else None

    def catch_up(self) -> dict[str, dict[str, Any]]:
        """Each peer's catch-up: items pulled, its head vs our cursor, the percentage (sync.CatchUp)."""
        return {peer: sync.progress.snapshot() for peer, sync in sorted(self.syncs.items())}

    def a2a_stats(self) -> dict[str, Any]:
        synced: Counter[str] = Counter()
        for sync in self.syncs.values():
            synced.update(sync.stats)
        return {"seen_cache_size": len(self.seen), "seen_cache_max": self.seen.maxsize,
                "seen_cache_live_evictions": self.seen.evictions_live, "received": dict(self.receiver.counters),
                "federation": dict(self.fed.counters), "delivered": self.sender.delivered,
                "dead_lettered": self.sender.dead_lettered, "sync": dict(synced),
                "links_put_to": sorted(p for p in self.links if self.fed.accepts.takes_link_batches(p)),
                # Peers known to read memory versions with their signed sharing list (restricted ones go only there).
                "memory_put_v2_to": sorted(p for p in self.links if self.fed.accepts.reads_signed_sharing(p)),
                "links_put_unpacked": self.sender.unpacked,
                "signature_batches": self.fed.verifier.batches}


def _check_reread_files(cfg: NodeConfig) -> None:
    """The hooks and permission rules files a reload re-reads must load (HookError / ConfigError otherwise)."""
    load_hooks(cfg.hooks_path)
    load_rules_file(cfg.permissions_path)


def _explained(exc: BaseException, home: Path) -> BaseException:
    """``exc`` itself, or the first error inside an exception group, a file this user may not use as one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, OSError):
        return files.explain(exc, home) or exc
    return exc


def _created_by_start(cfg: NodeConfig) -> list[Path]:
    """The paths a start may create in the home that do not exist yet, deepest first (removed after a failed start)."""
    paths = [cfg.socket_path, cfg.status_path, cfg.socket_path.parent, cfg.status_path.parent]
    db = cfg.db_path
    # Only a database this start makes, with its -wal and -shm: those of one that exists may be another process's.
    if cfg.storage.backend == "sqlite" and not os.path.lexists(db):
        paths += [db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), db,
                  *(d for d in db.parents if d != cfg.home and cfg.home in d.parents)]
    return sorted({p for p in paths if not os.path.lexists(p)}, key=lambda p: len(p.parts), reverse=True)


def _remove_created(paths: list[Path]) -> None:
    for p in paths:
        with contextlib.suppress(OSError):  # a directory some other process put a file in stays
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink(missing_ok=True)


async def serve(cfg: NodeConfig, load: Load, *, restore: bool = False, config_path: Path | None = None) -> int:
    """Run the node until SIGTERM/SIGINT; 0 after a clean stop, 1 after a crash (logged ``node_crashed``).
    A start that fails raises (the CLI's one line) and leaves none of the files it created."""
    signals = Signals()
    signals.install()
    notifier = Notifier.from_environment()  # before any hook program starts: they must not inherit it
    created = _created_by_start(cfg)
    node: Node | None = None
    try:
        node = await Node.open(cfg, load, restore=restore)
        await node.run(signals, notifier, banner(cfg, config_path))
    except Exception as e:
        exc = _explained(e, cfg.home)
        if node is None or not node.ready:
            _remove_created(created)
            raise exc from None
        d = describe(exc)
        log.error("node_crashed", extra={"ev": {"code": d.code, "error": d.message}},
                  exc_info=None if isinstance(exc, ProjectError) else exc)
        return 1
    log.info("node_stopped", extra={"ev": {"reason": signals.reason}})
    return 0


def banner(cfg: NodeConfig, config_path: Path | None) -> dict[str, Any]:
    """The start-up line's fields (``node_ready``, once everything is bound: a start that fails is one error line):
    what runs, from which file, on what, where it listens and whom it trusts. The DSN without its password."""
    from storage.pglink import redact

    st = cfg.storage
    mesh = cfg.mesh
    return {"version": version(), "config": None if config_path is None else str(config_path.absolute()),
            "home": str(cfg.home), "backend": st.backend,
            "store": redact(st.dsn) if st.backend == "postgres" else str(cfg.db_path),
            "mesh": f"{mesh.listen_host}:{mesh.listen_port}",
            "health": f"{mesh.health_host}:{mesh.health_port}" if mesh.health_port else None,
            "mcp_socket": str(cfg.socket_path),
            "mcp_http": f"{cfg.mcp.http_host}:{cfg.mcp.http_port}" if cfg.mcp.http_port else None,
            "trust": mesh.trust}


def run_serve(cfg: NodeConfig, load: Load, *, restore: bool = False, config_path: Path | None = None) -> int:
    """Run the node until a stop signal, under uvloop when it is installed; ``load`` reads the configuration
    again on SIGHUP; ``restore``: ``serve --restore``; ``config_path``: the file it came from, for the start-up
    line (``node_ready``)."""
    # The event loop hands work to the storage writer, the readers and the verifier thread; with the
    # default 5 ms GIL switch interval each hand-off can wait that long. bench/storage_bench.py
    # --switch-interval shows the effect (group-commit inserts/s roughly 1.7x at 0.5 ms here).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    keep_tls_reads_on_the_heap()  # no mmap/munmap per TLS read (mesh/heap.py)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(cfg, load, restore=restore, config_path=config_path))
    return uvloop.run(serve(cfg, load, restore=restore, config_path=config_path))
