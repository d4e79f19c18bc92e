"""The check every per-codec ``test_rule`` makes of an invalid golden vector."""

from __future__ import annotations

import pytest

import gcodec


def assert_refused(bad: bytes, error: str, rule: str) -> None:
    """Both ``validate`` and ``decode`` refuse ``bad`` with the error class named ``error``, and the
    message starts with the rule tag (``"C2:"``, ``"T3:"``...), as specs/format.md requires."""
    for fn in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.GcodecError) as ei:
            fn(bad)
        assert type(ei.value).__name__ == error
        assert str(ei.value).startswith(f"{rule}:"), str(ei.value)
