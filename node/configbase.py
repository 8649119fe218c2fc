"""The floor of the node's configuration: its error and the checks every section's parser uses
(node/config.py, node/transcriptconfig.py)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from base.errors import ProjectError


class ConfigCode(StrEnum):
    """The codes a ConfigError carries."""

    CONFIG_NOT_FOUND = "config_not_found"
    CONFIG_MALFORMED = "config_malformed"
    CONFIG_UNKNOWN_KEY = "config_unknown_key"
    CONFIG_INVALID = "config_invalid"
    CONFIG_UNREADABLE = "config_unreadable"


class ConfigError(ProjectError):
    """A configuration that cannot be used; ``code`` is stable, the message names key and value."""


def expect(typ: type | tuple[type, ...], key: str, value: Any) -> Any:
    if isinstance(value, bool) and typ is not bool and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"{key} must be {tname(typ)}, got {value!r}")
    if not isinstance(value, typ):
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"{key} must be {tname(typ)}, got {value!r}")
    return value


def tname(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"{key} must be > 0, got {value!r}")
