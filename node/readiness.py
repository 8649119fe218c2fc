"""When /readyz switches, as a value: the node looks at its readiness every ``WATCH_S`` and logs each switch once,
both ways (``not_ready`` with the reasons' codes and messages, a warning; ``ready`` with how long it was not, info).
Pure: no I/O, no clock of its own (times are time.monotonic() seconds)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# How often the node looks (readiness is computed on each /readyz; a switch is logged within this).
WATCH_S = 1.0


@dataclass(frozen=True)
class Switch:
    """One line to log: ``event`` ("ready" or "not_ready"), at ``level`` (logging's), with ``fields``."""
    event: str
    level: str
    fields: Mapping[str, Any]


class ReadyLog:
    """The readiness last logged; ``observe`` returns the switch to log, or None when nothing changed. The first
    observation always logs (the start says where it stands). A change of reasons while not ready logs again."""

    def __init__(self) -> None:
        self._ready: bool | None = None
        self._codes: tuple[str, ...] = ()
        self._since = 0.0

    def observe(self, ready: bool, reasons: Sequence[Mapping[str, str]], now: float) -> Switch | None:
        codes = tuple(r["code"] for r in reasons)
        if ready == self._ready and (ready or codes == self._codes):
            return None
        was, since = self._ready, self._since
        if ready != was:
            self._since = now
        self._ready, self._codes = ready, codes
        if ready:
            down = None if was is None else round(now - since, 3)
            return Switch("ready", "info", {"not_ready_s": down})
        return Switch("not_ready", "warning", {"reasons": list(codes),
                                                "messages": [r.get("message", "") for r in reasons]})
