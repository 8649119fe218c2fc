"""Skip marks for tests that use a system tool; what is looked for and how to install it is testbed/env/doctor.py."""

from __future__ import annotations

import pytest

from testbed.env import doctor


def needs(*tools: str) -> pytest.MarkDecorator:
    """Skip unless every named tool of ``testbed.env.doctor.TOOLS`` is usable; the reason names its install command."""
    reason = doctor.missing(*tools)
    return pytest.mark.skipif(reason is not None, reason=f"{reason}")
