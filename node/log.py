"""Structured logging on stderr: JSON lines (the default) or plain text, one record per line.

Rooms log with ``log.warning("event_name", extra={"ev": {...fields}})``; both formatters render the event
and its fields. One time format: the line's ``ts``, and every field named ``*_at`` that holds unix milliseconds
(``next_attempt_at``, ...), are ISO 8601 UTC with milliseconds. Libraries' own lines (the MCP SDK, psycopg,
uvicorn) go through the same formatter, their free text as the event.

A warning repeated from one source (the same logger, event and peer or remote address, about no message in
particular: a line naming a correlation_id is about that message, and always written) is written once per
``REPEAT_WINDOW_S``; the next one written after the window says how many were left out (``repeated``), and
when none comes, ``flush_repeats`` (the node calls it every window) writes the last one left out with its count.
The CLI's commands write their warnings as ``ai-memory: warning <event> key=value ...`` (``setup_cli``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import orjson

FORMATS = ("json", "text")
# A warning from one source is written at most once per this many seconds (the rest are counted).
REPEAT_WINDOW_S = 10.0
# Sources remembered at once (the oldest forgotten first): bounds the memory a flood of addresses can take.
REPEAT_SOURCES_MAX = 1024
# Fields that name where a warning comes from, in the order looked for.
SOURCE_FIELDS = ("peer", "remote", "agent_id", "loop", "hook")
# A value of a *_at field at or past this is unix milliseconds (2001 on); below it, not a time.
_UNIX_MS_FROM = 10**12


def iso_time(created: float) -> str:
    """``created`` (unix seconds) as ISO 8601 UTC with milliseconds, e.g. 2026-01-02T03:04:05.678Z."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_ms(unix_ms: int) -> str:
    """``unix_ms`` (unix milliseconds) as ``iso_time`` writes it: the one time format of the log and the CLI."""
    return iso_time(unix_ms / 1000)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "ev", None)
    if not isinstance(fields, dict):
        return {}
    return {k: iso_ms(v) if k.endswith("_at") and type(v) is int and v >= _UNIX_MS_FROM else v
            for k, v in fields.items()}


class JsonLines(logging.Formatter):
    def __init__(self, agent_id: str) -> None:
        super().__init__()
        self.agent_id = agent_id

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": iso_time(record.created), "level": record.levelname.lower(), "node": self.agent_id,
                "logger": record.name, "event": record.getMessage()}
        line.update(_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextLines(logging.Formatter):
    """``<ts> <level> <logger> <event> key=value ...`` for people reading a terminal or journald."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{iso_time(record.created)} {record.levelname.lower():<7} {record.name} {record.getMessage()}"
        line = _with_pairs(line, record)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class CliLines(logging.Formatter):
    """``<prefix>: <level> <event> key=value ...``: what a CLI command writes on stderr besides its result."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        return _with_pairs(f"{self.prefix}: {record.levelname.lower()} {record.getMessage()}", record)


def _with_pairs(line: str, record: logging.LogRecord) -> str:
    pairs = " ".join(f"{k}={_text_value(v)}" for k, v in _fields(record).items())
    return f"{line} {pairs}" if pairs else line


def _text_value(v: object) -> str:
    if isinstance(v, str) and v and " " not in v and "=" not in v:
        return v
    return orjson.dumps(v, default=str).decode()


# The record attribute by which a warning says it marks a change of state, which RepeatLimit never holds back.
STATE_CHANGE = "state_change"


class RepeatLimit(logging.Filter):
    """Writes a warning from one source at most once per ``window_s`` (by the records' own times); the first one
    written after the window carries ``repeated``, how many were left out meanwhile (``due`` gives the last one
    left out, with its count, for a source that did not warn again). Errors always pass, and so do state
    changes (a record made with ``extra={..., STATE_CHANGE: True}``: an outage beginning, a link going down):
    their sources already log each once per change, and a second outage within the window is news."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S, max_sources: int = REPEAT_SOURCES_MAX) -> None:
        super().__init__()
        self.window_s = window_s
        self.max_sources = max_sources
        # source -> (when its last line was written, lines left out since, the last one left out)
        self._last: OrderedDict[tuple[str, str, str], tuple[float, int, logging.LogRecord | None]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        fields = getattr(record, "ev", None)
        fields = fields if isinstance(fields, dict) else {}
        if record.levelno != logging.WARNING or "correlation_id" in fields or getattr(record, STATE_CHANGE, False):
            return True  # an error, a line about one message, or a state change: each is news
        source = next((str(fields[k]) for k in SOURCE_FIELDS if fields.get(k) is not None), "")
        key = (record.name, record.getMessage(), source)
        last = self._last.get(key)
        if last is not None and record.created - last[0] < self.window_s:
            self._last[key] = (last[0], last[1] + 1, record)
            return False
        if last is not None and last[1]:
            record.ev = {**fields, "repeated": last[1]}
        self._last[key] = (record.created, 0, None)
        self._last.move_to_end(key)
        while len(self._last) > self.max_sources:
            self._last.popitem(last=False)
        return True

    def due(self, now: float) -> list[logging.LogRecord]:
        """For each source whose window ended by ``now`` (time.time()) with lines left out and no line since: the
        last one left out, carrying ``repeated`` (all of them), to be written now as it is; the count starts
        again from 0."""
        out = []
        for key, (written_at, left_out, record) in list(self._last.items()):
            if left_out and record is not None and now - written_at >= self.window_s:
                fields = getattr(record, "ev", None)
                record.ev = {**(fields if isinstance(fields, dict) else {}), "repeated": left_out}
                self._last[key] = (written_at, 0, None)
                out.append(record)
        return out


def flush_repeats(now: float | None = None) -> int:
    """Write, through each root handler that holds warnings back, the last warning it left out from each source
    that did not warn again after its window (with ``repeated``); returns how many were written."""
    when = time.time() if now is None else now
    written = 0
    for handler in logging.getLogger().handlers:
        for limit in [f for f in handler.filters if isinstance(f, RepeatLimit)]:
            for record in limit.due(when):
                with handler.lock or contextlib.nullcontext():
                    handler.emit(record)
                written += 1
    return written


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record comes (a test's redirect included)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup(agent_id: str, level: str, fmt: str = "json") -> None:
    """The node's logging (``serve``): every logger's lines, the libraries' too, on stderr in ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextLines() if fmt == "text" else JsonLines(agent_id))
    handler.addFilter(RepeatLimit())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def setup_cli(prefix: str = "ai-memory", level: str = "warning") -> None:
    """A CLI command's logging: records at ``level`` and above as ``CliLines`` on stderr. Added once beside any
    handler already there (a test's capture); ``level`` is set on the root logger only when it lets more through."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _Stderr)), None)
    if handler is None:
        handler = _Stderr()
        handler.addFilter(RepeatLimit())
        root.addHandler(handler)
    handler.setFormatter(CliLines(prefix))
    handler.setLevel(level.upper())
    wanted = logging.getLevelName(level.upper())
    if isinstance(wanted, int) and wanted < root.getEffectiveLevel():
        root.setLevel(wanted)
