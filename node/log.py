"""Structured JSON-lines logging: one object per line with ts, level, logger, event and fields.

Rooms log with ``log.warning("event_name", extra={"ev": {...fields}})``; this formatter renders it.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson


class JsonLines(logging.Formatter):
    def __init__(self, agent_id: str) -> None:
        super().__init__()
        self.agent_id = agent_id

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": round(time.time(), 3), "level": record.levelname.lower(), "node": self.agent_id,
                "logger": record.name, "event": record.getMessage()}
        fields = getattr(record, "ev", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def setup(agent_id: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines(agent_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
