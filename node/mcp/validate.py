"""Tool arguments checked against their registry schema before any handler runs, so a bad call never
reaches the service."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import fastjsonschema

from node.errors import ServiceError
from node.mcp.registry import Args, ToolSpec

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]


class ArgValidator:
    """Compiled validators for every tool; ``check`` raises ServiceError naming the argument.

    Arguments first meet a schema compiled to Python by fastjsonschema (no defaults filled in, no formats):
    what it accepts is accepted. Anything it refuses is decided by jsonschema's Draft 2020-12 validator,
    whose error names the argument, so a refusal and its message are jsonschema's. The two agree on the
    keywords the tool schemas use (tests/mcp/test_arg_validator.py checks that the fast one accepts
    nothing jsonschema refuses); the fast one is ~30x cheaper: 5.7 ms -> 0.19 ms for a 100-link
    memory_link_many, 86 -> 3 us for a memory_store (docs/perf-history.md, issue 16). jsonschema is imported
    at the first refusal, not before: its import is ~40 ms of every ``ai-memory mcp`` start (PERFORMANCE.md,
    "Start-up"), and a session whose calls are all valid never needs it."""

    def __init__(self, specs: Iterable[ToolSpec[Any]]) -> None:
        self.specs = {s.name: s for s in specs}
        self._validators: dict[str, Any] = {}
        # Each tool's fast check is compiled at its first call (~1.5 ms a tool): compiling all of them before a
        # door answers was ~25 ms of every `ai-memory mcp --embedded` and `serve` start.
        self._fast: dict[str, Callable[[Any], Any]] = {}

    def check(self, name: str, args: Any) -> Args:
        """A fresh copy of ``args`` when tool ``name`` takes them (nothing filled in); ServiceError
        (unknown_tool, bad_input or too_large) naming the tool and the argument otherwise."""
        if name not in self.specs:
            raise ServiceError("unknown_tool", f"no tool named {name!r}; tools: {', '.join(self.specs)}")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ServiceError("bad_input", f"{name}: arguments must be a JSON object, got {type(args).__name__}")
        fast = self._fast.get(name)
        if fast is None:
            fast = self._fast[name] = fastjsonschema.compile(self.specs[name].schema, use_default=False,
                                                             use_formats=False, detailed_exceptions=False)
        try:
            fast(args)
        except fastjsonschema.JsonSchemaException:
            error = self._refusal(name, args)
            if error is not None:
                raise _arg_error(name, error) from None
        return dict(args)

    def _refusal(self, name: str, args: dict[str, Any]) -> ValidationError | None:
        """jsonschema's best error for ``args`` (None: it accepts them), its validator built once a tool."""
        from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
        from jsonschema.exceptions import best_match

        validator = self._validators.get(name)
        if validator is None:
            validator = self._validators[name] = Draft202012Validator(self.specs[name].schema)
        return best_match(validator.iter_errors(args))


def _arg_error(tool: str, e: ValidationError) -> ServiceError:
    """bad_input naming the argument; size bounds give too_large, as the service's own checks do."""
    arg = ".".join(str(p) for p in e.absolute_path)
    if e.validator == "required":
        missing = e.message.split("'")[1] if "'" in e.message else e.message
        return ServiceError("bad_input", f"{tool}: missing required argument {missing!r}")
    if e.validator == "additionalProperties":
        return ServiceError("bad_input", f"{tool}: unknown argument(s): {e.message.split('(')[-1].rstrip(')')}")
    where = f"argument {arg!r}" if arg else "arguments"
    if e.validator == "maxLength":
        return ServiceError("too_large",
                            f"{tool}: {where} is {len(e.instance)} chars, the limit is {e.validator_value}")
    if e.validator == "maxItems":
        return ServiceError("too_large",
                            f"{tool}: {where} has {len(e.instance)} items, the limit is {e.validator_value}")
    value = repr(e.instance)
    if len(value) > 60:
        value = value[:57] + "..."
    return ServiceError("bad_input", f"{tool}: {where} {value} is invalid: {_schema_rule(e)}")


def _schema_rule(e: ValidationError) -> str:
    v, val = e.validator, e.validator_value
    if v == "type":
        return f"must be of type {' or '.join(val) if isinstance(val, list) else val}"
    if v == "minimum":
        return f"must be >= {val}"
    if v == "maximum":
        return f"must be <= {val}"
    if v == "minLength":
        return "must not be empty" if val == 1 else f"must be at least {val} characters"
    return str(e.message)
