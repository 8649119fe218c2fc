"""ArgValidator's compiled fast path never accepts what jsonschema (Draft 2020-12) refuses, on every tool's schema.

The fast path only ever says yes; every no is jsonschema's. So the one way it could go wrong is a yes where
jsonschema says no: these tests throw schema-shaped and arbitrary JSON at both (booleans where integers go,
integral floats, strings and lists at and past their bounds, unknown and missing keys, enum near-misses).
"""

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from node.config import KgConfig, LimitsConfig
from node.errors import ServiceError
from node.mcp.registry import loader_specs, tool_specs
from node.mcp.validate import ArgValidator

SPECS = {s.name: s for s in (*tool_specs(LimitsConfig(), KgConfig()), *loader_specs())}
VALIDATOR = ArgValidator(tuple(SPECS.values()))

JSON_SCALARS = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
ANY_JSON = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def _near(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values at and around what ``schema`` allows, mixed with arbitrary JSON."""
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    options: list[st.SearchStrategy[Any]] = [ANY_JSON]
    if "enum" in schema:
        options.append(st.sampled_from([*schema["enum"], *(str(v).upper() for v in schema["enum"]), 0, 1, True]))
    if "string" in types:
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 16)
        options.append(st.text(min_size=max(0, lo - 1), max_size=min(hi + 2, 300)))
        options.append(st.integers(hi - 1, hi + 1).map(lambda n: "x" * max(n, 0)))
    if "integer" in types or "number" in types:
        lo, hi = schema.get("minimum", -5), schema.get("maximum", schema.get("minimum", 0) + 20)
        options += [st.integers(lo - 2, hi + 2), st.integers(lo - 2, hi + 2).map(float), st.booleans(),
                    st.floats(lo - 2, hi + 2, allow_nan=False)]
    if "array" in types:
        item = schema.get("items", {})
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", 4)
        options.append(st.lists(_near(item) if isinstance(item, dict) else ANY_JSON,
                                min_size=max(0, lo - 1), max_size=min(hi + 1, 6)))
    if "object" in types:
        options.append(_object(schema))
    return st.one_of(options)


def _object(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    props = schema.get("properties", {})
    optional = {k: _near(v) for k, v in props.items()}
    extra = st.dictionaries(st.text(max_size=6), ANY_JSON, max_size=1)
    return st.builds(lambda chosen, more: {**more, **chosen},
                     st.fixed_dictionaries({}, optional=optional), extra)


@pytest.mark.parametrize("name", sorted(SPECS))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_fast_path_accepts_nothing_jsonschema_refuses(name: str, data: st.DataObject) -> None:
    schema = SPECS[name].schema
    args = data.draw(_object(schema) | st.dictionaries(st.text(max_size=6), ANY_JSON, max_size=3))
    slow_errors = list(Draft202012Validator(schema).iter_errors(args))
    try:
        got = VALIDATOR.check(name, args)
    except ServiceError as e:
        assert slow_errors, f"refused what jsonschema accepts: {e.message}"
        return
    assert not slow_errors, f"accepted {args!r}, which jsonschema refuses: {slow_errors[0].message}"
    assert got == args  # nothing filled in or changed


def test_a_refusal_still_names_the_argument_and_bound() -> None:
    links = [{"src_id": "a", "dst_id": "b", "relation": "r"}] * 101
    with pytest.raises(ServiceError) as e:
        VALIDATOR.check("memory_link_many", {"links": links})
    assert e.value.code == "too_large" and "101 items" in e.value.message
    with pytest.raises(ServiceError) as e:
        VALIDATOR.check("memory_recall", {"query": "q", "limit": True})
    assert e.value.code == "bad_input" and "'limit'" in e.value.message


def test_defaults_are_not_filled_in() -> None:
    args = {"query": "q"}
    assert VALIDATOR.check("memory_recall", args) == {"query": "q"} and args == {"query": "q"}
