"""The testbed's one error: a stable ``code`` (the CLI maps usage codes to exit 2) and a sentence."""

from __future__ import annotations


class TestbedError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
