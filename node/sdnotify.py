"""systemd's readiness protocol (sd_notify(3)), with the standard library: one datagram per state change to the
unix socket systemd names in ``$NOTIFY_SOCKET``, so a ``Type=notify`` unit is "active" only once the node serves,
shows "reloading" while SIGHUP is applied and "deactivating" while it drains.

The messages are newline-separated ``KEY=VALUE`` lines (``READY=1``, ``RELOADING=1``, ``STOPPING=1``,
``STATUS=...``). Outside systemd (no ``$NOTIFY_SOCKET``) every call does nothing. The variable is taken out of
the process's environment when read, so hook programs the node starts do not inherit it (systemd would refuse
their messages anyway under ``NotifyAccess=main``). A message systemd cannot take is logged, never raised: the
node serves whether or not its supervisor hears it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import MutableMapping

log = logging.getLogger("node")

ENV = "NOTIFY_SOCKET"
# A datagram to systemd's socket never waits longer than this (its queue full: the message is dropped).
SEND_TIMEOUT_S = 1.0


class Notifier:
    """Tells the service manager the node's state; ``Notifier(None)`` (no manager) does nothing."""

    def __init__(self, address: str | None) -> None:
        # "@name" is a socket in the abstract namespace (a leading NUL byte), "/path" one on the filesystem.
        self.address = "\0" + address[1:] if address and address.startswith("@") else address

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None) -> Notifier:
        """The manager ``$NOTIFY_SOCKET`` names, removed from ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ
        address = env.pop(ENV, None)
        if address and not address.startswith(("/", "@")):
            log.warning("sd_notify_unsupported", extra={"ev": {
                "address": address, "effect": "readiness is not reported (only unix socket addresses are)"}})
            address = None
        return cls(address or None)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: str | int) -> bool:
        """One message of ``KEY=VALUE`` lines; True when the manager's socket took it."""
        if self.address is None:
            return False
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.settimeout(SEND_TIMEOUT_S)
                s.connect(self.address)
                s.sendall(message)
        except OSError as e:
            log.warning("sd_notify_failed", extra={"ev": {"message": message.decode(), "error": str(e)}})
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd 253+ (Type=notify-reload) tell this reload from an earlier one.
        return self.send(RELOADING=1, STATUS="reloading the configuration (SIGHUP)",
                         MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self, reason: str) -> bool:
        return self.send(STOPPING=1, STATUS=f"draining ({reason})")
