"""The mesh room's exception family: a stable code plus a human sentence."""

from __future__ import annotations


class MeshError(Exception):
    """A trust-fabric or wire failure.

    ``code`` is stable snake_case (callers and HTTP map on it); ``message`` is
    a sentence for humans, naming the file or peer involved and what to do.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"MeshError({self.code!r}, {self.message!r})"
