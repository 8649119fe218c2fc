"""Bounds on memory fields, the same for a local write and for a version received from a peer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from node.config import LimitsConfig, NodeConfig
from node.errors import ServiceError

# C0 control characters other than tab, newline and carriage return (one C-level scan, not a Python loop a char).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def check_memory_fields(lim: LimitsConfig, content: Any, title: Any, namespace: Any, tags: Any, priority: Any,
                        confidence: Any, source: Any) -> None:
    """Raise ServiceError (content_empty | too_large | bad_input) for the first field out of bounds."""
    if not isinstance(content, str) or not content.strip():
        raise ServiceError("content_empty", "content must be a non-empty string")
    size = len(content.encode("utf-8"))
    if size > lim.max_content_bytes:
        raise ServiceError("too_large", f"content is {size} bytes, the limit is {lim.max_content_bytes}")
    check_text("title", title, lim.max_title_chars, allow_empty=True)
    check_text("namespace", namespace, lim.max_namespace_chars, allow_empty=False)
    check_text("source", source, lim.max_source_chars, allow_empty=True)
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        raise ServiceError("bad_input", f"tags must be a list of strings, got {tags!r}")
    if len(tags) > lim.max_tags:
        raise ServiceError("too_large", f"{len(tags)} tags, the limit is {lim.max_tags}")
    for t in tags:
        check_text("tag", t, lim.max_tag_chars, allow_empty=False)
    if not isinstance(priority, int) or isinstance(priority, bool) or not 1 <= priority <= 10:
        raise ServiceError("bad_input", f"priority must be an integer 1..10, got {_short(priority)}")
    check_confidence(confidence)


def check_confidence(confidence: Any) -> None:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.0 <= confidence <= 1.0:
        raise ServiceError("bad_input", f"confidence must be a number in 0..1, got {_short(confidence)}")


def check_text(name: str, value: Any, max_chars: int, *, allow_empty: bool) -> None:
    if not isinstance(value, str):
        raise ServiceError("bad_input", f"{name} must be a string, got {_short(value)}")
    if not allow_empty and not value.strip():
        raise ServiceError("bad_input", f"{name} must not be empty")
    if len(value) > max_chars:
        raise ServiceError("too_large", f"{name} is {len(value)} chars, the limit is {max_chars}")
    if _CONTROL.search(value):
        raise ServiceError("bad_input", f"{name} contains control characters")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_db_budget(cfg: NodeConfig, size: int) -> None:
    """Refuse new memories once the database holds ``size`` bytes, past ``limits.max_db_bytes``
    (``Database.bytes_used``: the SQLite file with its WAL, or Postgres's database size)."""
    if size > cfg.limits.max_db_bytes:
        raise ServiceError("storage_full", f"the database holds {size} bytes, past limits.max_db_bytes "
                                           f"({cfg.limits.max_db_bytes}); new memories are refused")
