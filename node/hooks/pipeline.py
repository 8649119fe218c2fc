"""The object the service calls: ``await pipeline.fire(event, payload)`` runs the event's hook chain.

It owns the loaded ``hooks.toml`` (re-read when it changes: fires already running finish on the old
config, new fires use the new one), one runner per hook, and the per-hook counters that
``ai-memory doctor --hooks`` and ``memory_capabilities`` report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from node.config import HooksConfig, NodeConfig
from node.hooks.config import HooksFile, HookSpec, load_hooks
from node.hooks.decision import (
    Allow,
    ApprovalRequired,
    Ask,
    AskUser,
    Chain,
    Decision,
    Deny,
    Failure,
    HookRefused,
    Modify,
    Proceed,
    Refuse,
    on_failure,
)
from node.hooks.errors import HookError
from node.hooks.events import SPECS, HookEvent
from node.hooks.executor import HookFailed, Runner, make_runner

log = logging.getLogger("node.hooks")

# Notifications (on_* events fired from synchronous code) in flight at once; more are dropped and counted.
NOTIFY_MAX = 64
# Bound on stopping runners retired by a reload, and on close.
CLOSE_TIMEOUT_S = 10.0

_DECISION_COUNTER = {Allow: "allowed", Modify: "modified", Deny: "denied", AskUser: "asked"}


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells a changed file apart; None when it is absent (or cannot even be looked at)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class HookPipeline:
    """Hook chains for one node process. ``HookPipeline.open(cfg)``; ``await close()`` reaps every child."""

    def __init__(self, path: Path, settings: HooksConfig) -> None:
        self.path = path
        self.settings = settings
        self._stamp = file_stamp(path)
        # Raises HookError: a node does not start on a hooks file it cannot use.
        self._file = load_hooks(path) or HooksFile.empty(path)
        self._runners: dict[HookSpec, Runner] = {s: make_runner(s, settings) for s in self._file.hooks}
        self._counts: dict[str, Counter[str]] = {}
        self._next_check = time.monotonic() + settings.reload_check_s
        self._background: set[asyncio.Task[None]] = set()
        self.reloads = 0
        self.reload_error: str | None = None
        self.notify_dropped = 0
        self._closed = False

    @classmethod
    def open(cls, cfg: NodeConfig) -> HookPipeline:
        return cls(cfg.hooks_path, cfg.hooks)

    # ---- firing ---------------------------------------------------------------------------

    async def fire(self, event: HookEvent, payload: dict[str, Any]) -> dict[str, Any]:
        """Run ``event``'s chain; returns the payload to go ahead with (Modify deltas applied).

        Raises HookRefused (the denying hook's code) or ApprovalRequired when the event can be refused.
        """
        now = time.monotonic()
        if now >= self._next_check:
            self._check_reload(now)
        hooks = self._file.by_event.get(event)
        if not hooks:
            return payload
        runners = self._runners  # a reload swaps the dict: this fire keeps the config it started with
        spec = SPECS[event]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.deadline_ms / 1000
        chain = Chain.start(spec, payload)
        for hook in hooks:
            decision = await self._ask(runners[hook], hook, event, dict(chain.payload), deadline - loop.time())
            chain = chain.step(hook.name, decision)
            if chain.done:
                break
        for sentence in chain.warnings:
            log.warning("hook_decision_ignored", extra={"ev": {"event": str(event), "why": sentence}})
        match chain.outcome():
            case Proceed(result):
                return dict(result)
            case Refuse(hook_name, deny):
                raise HookRefused(hook_name, str(event), deny)
            case Ask(hook_name, ask, result):
                raise ApprovalRequired(hook_name, str(event), ask, dict(result))
        raise AssertionError("unreachable")

    async def _ask(self, runner: Runner, hook: HookSpec, event: HookEvent, payload: Mapping[str, Any],
                   remaining_s: float) -> Decision:
        """One hook's decision within min(its timeout, what is left of the class deadline)."""
        counts = self._counts.setdefault(hook.name, Counter())
        counts["fired"] += 1
        budget = min(remaining_s, hook.timeout_ms / 1000)
        try:
            if budget <= 0:
                raise HookFailed(Failure.TIMEOUT, f"got no time: earlier hooks spent the {event} deadline")
            decision = await runner.call(event, payload, budget)
        except HookFailed as f:
            counts[str(f.failure)] += 1
            log.warning("hook_failed", extra={"ev": {"hook": hook.name, "event": str(event),
                                                     "failure": str(f.failure), "detail": f.detail,
                                                     "fail_mode": str(hook.fail_mode)}})
            return on_failure(hook.name, hook.fail_mode, f.failure, f.detail)
        counts[_DECISION_COUNTER[type(decision)]] += 1
        return decision

    def notify(self, event: HookEvent, payload: dict[str, Any]) -> None:
        """Fire a notification from synchronous code: runs as an owned task; never raises, never blocks."""
        if self._closed or not self._file.by_event.get(event):
            return
        if len(self._background) >= NOTIFY_MAX:
            self.notify_dropped += 1
            return
        self._own(self._notify(event, payload), f"hooks:notify:{event}")

    def attached(self, event: HookEvent) -> bool:
        """``event`` has hooks in the config as last loaded (a reload due is left to the next fire: the
        answer only tells a caller whether to fire many payloads concurrently)."""
        return bool(self._file.by_event.get(event))

    async def _notify(self, event: HookEvent, payload: dict[str, Any]) -> None:
        with contextlib.suppress(HookError):
            await self.fire(event, payload)

    def _own(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- hot reload -----------------------------------------------------------------------

    def reload_now(self) -> None:
        """Look at the hooks file now rather than at the next check (a SIGHUP): reloaded if it changed."""
        self._check_reload(time.monotonic())

    def _check_reload(self, now: float) -> None:
        self._next_check = now + self.settings.reload_check_s
        stamp = file_stamp(self.path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            new = load_hooks(self.path) or HooksFile.empty(self.path)
        except HookError as e:
            # Keep running on the last good config; the error shows in doctor and capabilities.
            self.reload_error = e.message
            log.warning("hooks_reload_failed", extra={"ev": {"path": str(self.path), "error": e.message}})
            return
        self._install(new)

    def _install(self, new: HooksFile) -> None:
        old = self._runners
        runners = {s: old.get(s) or make_runner(s, self.settings) for s in new.hooks}
        self._file, self._runners = new, runners
        self.reloads += 1
        self.reload_error = None
        retired = [r for s, r in old.items() if s not in runners]
        grace = max(s.deadline_ms for s in SPECS.values()) / 1000
        for runner in retired:
            self._own(runner.retire(grace), f"hooks:retire:{runner.spec.name}")
        log.info("hooks_reloaded", extra={"ev": {"path": str(self.path), "hooks": [s.name for s in new.hooks],
                                                 "retired": [r.spec.name for r in retired]}})

    # ---- state and lifecycle --------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Live state: hooks per event in chain order, each hook's settings, counters and runner."""
        enabled = {s for hooks in self._file.by_event.values() for s in hooks}
        return {
            "config": str(self.path),
            "config_present": self._stamp is not None,
            "reloads": self.reloads,
            "reload_error": self.reload_error,
            "by_event": {str(ev): [s.name for s in hooks] for ev, hooks in self._file.by_event.items()},
            "hooks": [{"name": s.name, "events": [str(e) for e in s.events], "mode": str(s.mode),
                       "priority": s.priority, "timeout_ms": s.timeout_ms, "fail_mode": str(s.fail_mode),
                       "enabled": s in enabled, "counts": dict(self._counts.get(s.name, {})),
                       "runner": self._runners[s].state()} for s in self._file.hooks],
            "notify_dropped": self.notify_dropped,
        }

    async def close(self) -> None:
        """Let the notifications in flight finish (a CLI command's ``on_approval_*`` hooks run before it exits;
        each is bounded by its class deadline), then stop every runner (daemons get their grace, then SIGKILL)
        and wait for retired ones; all within CLOSE_TIMEOUT_S."""
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_TIMEOUT_S
        if self._background:  # stopping a runner first would kill the hook a notification is waiting on
            await asyncio.wait(list(self._background), timeout=CLOSE_TIMEOUT_S)
        for runner in self._runners.values():
            self._own(runner.close(), f"hooks:close:{runner.spec.name}")
        if self._background:
            _, pending = await asyncio.wait(list(self._background), timeout=max(0.0, deadline - loop.time()))
            for task in pending:
                task.cancel()
