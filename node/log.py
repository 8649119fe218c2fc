"""Structured logging on stderr: JSON lines (the default) or plain text, one record per line.

Rooms log with ``log.warning("event_name", extra={"ev": {...fields}})``; both formatters render the event
and its fields, with the time in ISO 8601 UTC (milliseconds).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson

FORMATS = ("json", "text")


def iso_time(created: float) -> str:
    """``created`` (unix seconds) as ISO 8601 UTC with milliseconds, e.g. 2026-01-02T03:04:05.678Z."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_ms(unix_ms: int) -> str:
    """``unix_ms`` (unix milliseconds) as ``iso_time`` writes it: the one time format of the log and the CLI."""
    return iso_time(unix_ms / 1000)


class JsonLines(logging.Formatter):
    def __init__(self, agent_id: str) -> None:
        super().__init__()
        self.agent_id = agent_id

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": iso_time(record.created), "level": record.levelname.lower(), "node": self.agent_id,
                "logger": record.name, "event": record.getMessage()}
        fields = getattr(record, "ev", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextLines(logging.Formatter):
    """``<ts> <level> <logger> <event> key=value ...`` for people reading a terminal or journald."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "ev", None)
        pairs = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items()) if isinstance(fields, dict) else ""
        line = f"{iso_time(record.created)} {record.levelname.lower():<7} {record.name} {record.getMessage()}"
        line = f"{line} {pairs}" if pairs else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(v: object) -> str:
    if isinstance(v, str) and v and " " not in v and "=" not in v:
        return v
    return orjson.dumps(v, default=str).decode()


def setup(agent_id: str, level: str, fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextLines() if fmt == "text" else JsonLines(agent_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
