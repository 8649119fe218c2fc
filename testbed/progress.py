"""A small text progress bar on stderr (no dependency): redrawn in place on a terminal,
one line per change otherwise (logs and CI stay readable)."""

from __future__ import annotations

import sys
from typing import TextIO

WIDTH = 30


class Progress:
    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(total, 1)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last = -1  # last tenth printed (non-terminal only)

    def update(self, done: int, note: str = "") -> None:
        if not self.tty:
            # Off a terminal, one line per tenth (and the last) keeps logs short.
            step = done * 10 // self.total
            if step == self.last and done != self.total:
                return
            self.last = step
        filled = WIDTH * done // self.total
        line = f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{self.total} {note}"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
