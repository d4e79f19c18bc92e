"""The module order of tests/conftest.py names modules that exist (a renamed module would silently
lose its place at the front of a parallel session)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import MODULE_SECONDS


def test_every_module_the_order_names_exists() -> None:
    here = Path(__file__).parent
    missing = [m for m in MODULE_SECONDS if not (here / f"{m}.py").exists()]
    assert not missing, missing
