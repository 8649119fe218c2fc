"""check_text: the bounds every short text field (ids, relation, title, namespace, tags) passes, local or received."""

import pytest

from node.errors import ServiceError
from node.limits import check_text


def _old_rule(value: str) -> bool:
    """The rule as first written: any C0 control character but tab, newline and carriage return."""
    return any(ord(c) < 32 and c not in "\t\n\r" for c in value)


def test_control_characters_are_refused_exactly_as_the_per_character_rule_did() -> None:
    for code in [*range(0, 0x2100), 0x7F, 0x85, 0x2028, 0xFEFF, 0x10FFFF]:
        value = f"a{chr(code)}b"
        refused = False
        try:
            check_text("relation", value, 100, allow_empty=False)
        except ServiceError as e:
            assert e.code == "bad_input" and "control characters" in e.message
            refused = True
        assert refused == _old_rule(value), hex(code)


def test_other_bounds_still_come_first() -> None:
    with pytest.raises(ServiceError, match="must be a string"):
        check_text("relation", 5, 100, allow_empty=False)
    with pytest.raises(ServiceError, match="must not be empty"):
        check_text("relation", " \t", 100, allow_empty=False)
    with pytest.raises(ServiceError, match="the limit is 3") as e:
        check_text("relation", "\x00bcd", 3, allow_empty=False)
    assert e.value.code == "too_large"
    check_text("title", "", 3, allow_empty=True)
