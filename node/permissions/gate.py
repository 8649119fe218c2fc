"""The permission gate: one object every local operation (service) and every peer write (federation) asks.

It holds the rules file (``<home>/permissions.toml``: ``mode``, ``default``, ``[[rules]]``) and the rules
added at run time (table ``permission_rules``), re-reading either when it changes (checked at most every
``permissions.reload_check_s``), so a mode or rule change takes effect on a running node. The decision
itself is ``node.permissions.rules.decide`` (pure); the gate applies the mode: ``off`` never asks the
rules, ``advisory`` logs what enforcement would have done and lets the operation go ahead, ``enforce``
returns the decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachetools import LRUCache

from node.config import ConfigError, NodeConfig
from node.hooks.decision import ALLOW, AskUser, Decision, Deny
from node.hooks.pipeline import file_stamp
from node.permissions.rules import (
    Action,
    Mode,
    Operation,
    PermissionRuleError,
    Request,
    Rule,
    RuleIndex,
    check_contradictions,
    decide,
    parse_rule,
    parse_rules,
    rule_summary,
)
from storage import permissions as rule_rows
from storage.db import Database

log = logging.getLogger("node.permissions")

# Agents whose stored bytes are remembered between sums (the least recently asked go first).
QUOTA_AGENTS = 4096
# An agent's stored bytes are summed again at most every this many times as long as the last sum took (a sum
# reads every memory the agent wrote: at a million memories a reader would otherwise spend most of its time
# summing), and at least permissions.reload_check_s apart.
QUOTA_SUM_SPACING = 20.0


def sum_every_s(reload_check_s: float, last_sum_s: float) -> float:
    """Seconds between two sums of an agent's stored bytes, after one that took ``last_sum_s``."""
    return max(reload_check_s, QUOTA_SUM_SPACING * last_sum_s)

_FILE_KEYS = {"mode", "default", "rules"}


@dataclass(frozen=True, slots=True)
class RulesFile:
    """The validated rules file; ``mode`` None means "not set" (advisory when any rule exists)."""

    path: Path
    mode: Mode | None
    default: Action
    rules: tuple[Rule, ...]


def load_rules_file(path: Path) -> RulesFile:
    """Parse and validate the rules file; a missing file is no rules. Raises ConfigError naming the key."""
    name = path.name
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return RulesFile(path, None, Action.ALLOW, ())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("config_malformed", f"{path}: not valid UTF-8 TOML: {e}") from None
    except OSError as e:
        raise ConfigError("config_invalid", f"{path}: cannot be read: {e.strerror}") from None
    unknown = sorted(set(raw) - _FILE_KEYS)
    if unknown:
        raise ConfigError("config_unknown_key", f"{name}: unknown key(s) {unknown}; known: {sorted(_FILE_KEYS)}")
    try:
        mode = None if "mode" not in raw else Mode(raw["mode"])
    except (ValueError, TypeError):
        raise ConfigError("config_invalid", f"{name}: mode must be off | advisory | enforce, "
                                            f"got {raw['mode']!r}") from None
    try:
        default = Action(raw.get("default", "allow"))
    except (ValueError, TypeError):
        raise ConfigError("config_invalid", f"{name}: default must be allow | deny | ask, "
                                            f"got {raw['default']!r}") from None
    try:
        rules = parse_rules(raw.get("rules", []), f"{name}: rules")
    except PermissionRuleError as e:
        raise ConfigError("config_invalid", str(e)) from None
    return RulesFile(path, mode, default, rules)


def runtime_rule(row: rule_rows.RuleRow) -> Rule:
    return parse_rule({"agent": row.agent, "namespace": row.namespace, "operations": list(row.operations),
                       "action": row.action, "inherit": row.inherit}, f"runtime #{row.id}")


class Gate:
    """Permission decisions for one node process. ``await Gate.open(cfg, db)``."""

    def __init__(self, cfg: NodeConfig, db: Database) -> None:
        self.cfg = cfg
        self.db = db
        self.path = cfg.permissions_path
        self._file_stamp = file_stamp(self.path)
        # Raises ConfigError: a node does not start on a rules file it cannot use.
        self.file = load_rules_file(self.path)
        self.runtime: tuple[Rule, ...] = ()
        self._db_stamp: tuple[int, int] | None = None
        self.index = RuleIndex(())
        self.mode = Mode.OFF
        self._next_check = 0.0
        self.reload_error: str | None = None
        self.counts: Counter[str] = Counter()
        # Each agent's stored bytes as last summed, and when (time.monotonic()), for the storage quota.
        self._used: LRUCache[str, tuple[int, float]] = LRUCache(QUOTA_AGENTS)
        # The sum in flight for each agent: the calls that find its sum stale together (a pulled page's memories,
        # applied together) share one reader hop, its result or its error (while the store is away, all of them
        # hear it at once, not one after another).
        self._summing: dict[str, asyncio.Future[int]] = {}
        self._sum_every_s = cfg.permissions.reload_check_s
        self._install()

    @classmethod
    async def open(cls, cfg: NodeConfig, db: Database) -> Gate:
        gate = cls(cfg, db)
        await gate.refresh()
        return gate

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.file.rules + self.runtime

    def _install(self) -> None:
        rules = self.rules
        self.index = RuleIndex(rules, self.file.default)
        if self.file.mode is not None:
            self.mode = self.file.mode
        else:
            self.mode = Mode.ADVISORY if rules else Mode.OFF

    async def refresh(self) -> None:
        """Re-read the rules file and the runtime rules if either changed."""
        self._next_check = time.monotonic() + self.cfg.permissions.reload_check_s
        changed = False
        stamp = file_stamp(self.path)
        if stamp != self._file_stamp:
            self._file_stamp = stamp
            try:
                self.file = load_rules_file(self.path)
                self.reload_error = None
                changed = True
            except ConfigError as e:
                # Keep the last good rules; the error shows in capabilities and the log.
                self.reload_error = e.message
                log.warning("permissions_reload_failed", extra={"ev": {"path": str(self.path), "error": e.message}})
        db_stamp = await self.db.read(rule_rows.stamp)
        if db_stamp != self._db_stamp:
            self._db_stamp = db_stamp
            self.runtime = tuple(runtime_rule(r) for r in await self.db.read(rule_rows.all_rules))
            changed = True
        if changed:
            self._install()
            log.info("permissions_loaded", extra={"ev": {"mode": str(self.mode), "rules": len(self.index)}})

    async def enforcing(self) -> bool:
        """False while the mode in force is ``off`` (every ``admit`` would allow): a caller may then skip
        the reads it makes only to ask (e.g. the namespaces of a link's two ends)."""
        if time.monotonic() >= self._next_check:
            await self.refresh()
        return self.mode is not Mode.OFF

    async def admit(self, agent: str, namespace: str, operation: Operation) -> Decision:
        """What to do with ``agent``'s ``operation`` in ``namespace`` under the mode in force: Allow,
        Deny (code ``permission_denied``) or AskUser. Advisory mode logs and allows."""
        if time.monotonic() >= self._next_check:
            await self.refresh()
        if self.mode is Mode.OFF:
            return ALLOW
        decision, rule = decide(self.index, Request(agent, namespace, operation))
        if decision is ALLOW:
            self.counts["allowed"] += 1
            return decision
        what = "denied" if isinstance(decision, Deny) else "asked"
        ev = {"agent": agent, "namespace": namespace, "operation": str(operation), "decision": what,
              "rule": rule.summary() if rule else None, "mode": str(self.mode)}
        if self.mode is Mode.ADVISORY:
            self.counts[f"advisory_{what}"] += 1
            log.warning("permission_advisory", extra={"ev": ev})
            return ALLOW
        self.counts[what] += 1
        log.warning("permission_" + what, extra={"ev": ev})
        return decision

    def quota_of(self, agent: str) -> int:
        """``agent``'s storage quota in bytes (0 = none): its ``[[mcp.agents]] max_bytes``, else
        ``permissions.max_bytes_per_agent``."""
        for a in self.cfg.mcp.agents:
            if a.id == agent and a.max_bytes is not None:
                return a.max_bytes
        return self.cfg.permissions.max_bytes_per_agent

    async def quota_code(self, agent: str, adding_bytes: int) -> str | None:
        """``quota_exceeded`` when storing ``adding_bytes`` more for ``agent`` passes its quota, else None.

        What an agent holds is summed from the store at most every ``permissions.reload_check_s`` (the quota is on
        by default, so not once per insert) and counted up by what this process admits in between; writes by
        other processes count from the next sum."""
        quota = self.quota_of(agent)
        if not quota:
            return None
        used = await self.usage(agent)
        if used + adding_bytes <= quota:
            self._used[agent] = (used + adding_bytes, self._used[agent][1])
            return None
        self.counts["quota_exceeded"] += 1
        log.warning("quota_exceeded", extra={"ev": {"agent": agent, "used": used, "adding": adding_bytes,
                                                    "quota": quota}})
        return "quota_exceeded"

    async def usage(self, agent: str) -> int:
        """The content + title bytes of the memories whose current version ``agent`` wrote (as summed at most
        ``permissions.reload_check_s`` ago, or 20 times as long as the last sum took, plus what was admitted
        since)."""
        cached = self._used.get(agent)
        if cached is not None and time.monotonic() - cached[1] < self._sum_every_s:
            return cached[0]
        running = self._summing.get(agent)
        if running is not None:
            return self._admitted_since(agent, await asyncio.shield(running))
        running = self._summing[agent] = asyncio.get_running_loop().create_future()
        try:
            started = time.monotonic()
            used = await self.db.read(rule_rows.bytes_by_writer, agent)
            self._used[agent] = (used, started)
            self._sum_every_s = sum_every_s(self.cfg.permissions.reload_check_s, time.monotonic() - started)
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                running.cancel()
            else:
                running.set_exception(e)
                running.exception()  # those waiting hear it; none waiting is no unretrieved error
            raise
        else:
            running.set_result(used)
        finally:
            del self._summing[agent]
        return used

    def _admitted_since(self, agent: str, summed: int) -> int:
        """The agent's usage as the cache has it now (the sum, and what was admitted since), else ``summed``."""
        cached = self._used.get(agent)
        return summed if cached is None else cached[0]

    def check(self, agent: str, namespace: str, operation: Operation) -> tuple[Decision, Rule | None]:
        """The rules' own answer, whatever the mode (``ai-memory permissions check``)."""
        return decide(self.index, Request(agent, namespace, operation))

    async def add_rule(self, raw: dict[str, Any], created_by: str, now_ms: int) -> Rule:
        """Validate and store a runtime rule; refused when it contradicts a rule in force."""
        try:
            rule = parse_rule(raw, "new rule")
            check_contradictions((*self.rules, rule))
        except PermissionRuleError as e:
            from node.errors import ServiceError
            raise ServiceError("bad_input", str(e)) from None
        await self.db.write(rule_rows.insert, rule.agent, rule.namespace, [str(o) for o in rule.operations],
                            str(rule.action), rule.inherit, created_by, now_ms)
        await self.refresh()
        return rule

    def snapshot(self) -> dict[str, Any]:
        return {"mode": str(self.mode), "default": str(self.index.default), "config": str(self.path),
                "rules": len(self.index), "rule_summary": rule_summary(self.rules),
                "reload_error": self.reload_error, "counts": dict(self.counts)}


def refusal(decision: Decision) -> tuple[str, str] | None:
    """(code, message) for a decision that stops an operation, None for Allow."""
    match decision:
        case Deny(code, reason):
            return code, reason
        case AskUser(prompt):
            return "approval_required", f"approval required: {prompt}"
    return None
