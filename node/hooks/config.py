"""``hooks.toml``: the operator's hooks, parsed and validated at the edge into ``HookSpec`` values.

Every error is a HookError with code config_invalid / config_unknown_key / config_malformed whose
message names the file and the key (``hooks[2].timeout_ms``).
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from node.hooks.decision import FailMode, ordered
from node.hooks.errors import HookCode, HookError
from node.hooks.events import READ_CLASSES, SPECS, HookEvent

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HOOK_KEYS = frozenset({"name", "events", "command", "mode", "priority", "timeout_ms", "fail_mode", "enabled", "env"})
PRIORITY_RANGE = (-1000, 1000)
E = TypeVar("E", bound=StrEnum)


class Mode(StrEnum):
    EXEC = "exec"      # one subprocess per fire: JSON on stdin, the decision on stdout
    DAEMON = "daemon"  # one long-lived child: JSON-RPC 2.0 over NDJSON on stdin/stdout


@dataclass(frozen=True)
class HookSpec:
    """One hook as configured. Equal specs share a runner across reloads (a daemon keeps running)."""

    name: str
    events: tuple[HookEvent, ...]
    command: tuple[str, ...]
    mode: Mode
    priority: int
    timeout_ms: int
    fail_mode: FailMode
    env: tuple[tuple[str, str], ...]
    cwd: Path


@dataclass(frozen=True)
class HooksFile:
    path: Path | None
    hooks: tuple[HookSpec, ...]
    # Enabled hooks per event, in chain order (priority descending, then file order).
    by_event: Mapping[HookEvent, tuple[HookSpec, ...]]

    @classmethod
    def empty(cls, path: Path | None = None) -> HooksFile:
        return cls(path, (), MappingProxyType({}))


def load_hooks(path: Path) -> HooksFile | None:
    """Parse and validate the hooks file; None when it does not exist (no hooks)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise HookError(HookCode.CONFIG_MALFORMED, f"hooks file {path} is not UTF-8 text") from None
    except OSError as e:
        raise HookError(HookCode.CONFIG_MALFORMED, f"hooks file {path} cannot be read: {e.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HookError(HookCode.CONFIG_MALFORMED, f"hooks file {path} is not valid TOML: {e}") from None
    return parse_hooks(raw, path=path)


def parse_hooks(raw: dict[str, Any], *, path: Path) -> HooksFile:
    """Validate a decoded hooks file; relative commands and the hooks' cwd are the file's directory."""
    where = str(path)
    unknown = set(raw) - {"hooks"}
    if unknown:
        raise _unknown(where, ", ".join(sorted(unknown)), ["hooks"])
    items = raw.get("hooks", [])
    if not isinstance(items, list):
        raise _invalid(where, "hooks", "must be an array of tables ([[hooks]])", items)
    specs = [_hook(where, i, item, path.parent.absolute()) for i, item in enumerate(items)]
    names = [s.name for s, _ in specs]
    for n in names:
        if names.count(n) > 1:
            raise HookError(HookCode.CONFIG_INVALID, f"{where}: hook name {n!r} is used twice")
    enabled = [s for s, on in specs if on]
    by_event = {ev: ordered(s for s in enabled if ev in s.events) for ev in HookEvent}
    return HooksFile(path, tuple(s for s, _ in specs),
                     MappingProxyType({ev: hs for ev, hs in by_event.items() if hs}))


def _hook(where: str, i: int, item: Any, base: Path) -> tuple[HookSpec, bool]:
    key = f"hooks[{i}]"
    if not isinstance(item, dict):
        raise _invalid(where, key, "must be a table", item)
    unknown = set(item) - HOOK_KEYS
    if unknown:
        raise _unknown(where, ", ".join(f"{key}.{u}" for u in sorted(unknown)), sorted(HOOK_KEYS))
    name = item.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _invalid(where, f"{key}.name", "must be 1-64 letters, digits, '_', '.', '-'", name)
    key = f"hooks[{i}] ({name})"
    events = _events(where, key, item.get("events"))
    command = _command(where, key, item.get("command"), base)
    deadline = min(SPECS[e].deadline_ms for e in events)
    tightest = min(events, key=lambda e: SPECS[e].deadline_ms)
    all_read = all(SPECS[e].event_class in READ_CLASSES for e in events)
    mode = _choice(where, f"{key}.mode", item.get("mode", Mode.DAEMON if all_read else Mode.EXEC), Mode)
    fail_mode = _choice(where, f"{key}.fail_mode", item.get("fail_mode", FailMode.OPEN), FailMode)
    priority = _int(where, f"{key}.priority", item.get("priority", 0))
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise _invalid(where, f"{key}.priority", f"must be in {PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}", priority)
    timeout_ms = _int(where, f"{key}.timeout_ms", item.get("timeout_ms", deadline))
    if timeout_ms <= 0:
        raise _invalid(where, f"{key}.timeout_ms", "must be > 0", timeout_ms)
    if timeout_ms > deadline:
        cls = SPECS[tightest].event_class
        raise _invalid(where, f"{key}.timeout_ms",
                       f"is above the {cls} class deadline of {tightest} ({deadline} ms)", timeout_ms)
    enabled = item.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _invalid(where, f"{key}.enabled", "must be true or false", enabled)
    env = item.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise _invalid(where, f"{key}.env", "must be a table of strings", env)
    spec = HookSpec(name=name, events=events, command=command, mode=mode, priority=priority,
                    timeout_ms=timeout_ms, fail_mode=fail_mode, env=tuple(sorted(env.items())), cwd=base)
    return spec, enabled


def _events(where: str, key: str, value: Any) -> tuple[HookEvent, ...]:
    if not isinstance(value, list) or not value:
        raise _invalid(where, f"{key}.events", "must be a non-empty list of event names", value)
    known = {e.value for e in HookEvent}
    out: list[HookEvent] = []
    for j, e in enumerate(value):
        if e not in known:
            raise _invalid(where, f"{key}.events[{j}]", f"is not an event; events: {', '.join(sorted(known))}", e)
        if HookEvent(e) not in out:
            out.append(HookEvent(e))
    return tuple(out)


def _command(where: str, key: str, value: Any, base: Path) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as e:
            raise _invalid(where, f"{key}.command", f"does not split into words ({e})", value) from None
    if not isinstance(value, list) or not value or not all(isinstance(w, str) and w for w in value):
        raise _invalid(where, f"{key}.command", "must be a non-empty list of non-empty strings", value)
    program = value[0]
    # "./x" or "hooks/x" is relative to the hooks file; a bare name is looked up on PATH.
    if "/" in program and not Path(program).is_absolute():
        program = str(base / program)
    return (program, *value[1:])


def _choice(where: str, key: str, value: Any, enum: type[E]) -> E:
    try:
        return enum(value)
    except ValueError:
        raise _invalid(where, key, f"must be one of {' | '.join(m.value for m in enum)}", value) from None


def _int(where: str, key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(where, key, "must be an integer", value)
    return value


def _invalid(where: str, key: str, rule: str, value: Any) -> HookError:
    return HookError(HookCode.CONFIG_INVALID, f"{where}: {key} {rule}, got {value!r}")


def _unknown(where: str, keys: str, known: list[str]) -> HookError:
    return HookError(HookCode.CONFIG_UNKNOWN_KEY, f"{where}: unknown key(s) {keys}; known: {', '.join(known)}")
