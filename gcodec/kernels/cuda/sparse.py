"""The CUDA backend's ``sparse``: not on the device yet (docs/gpu.md). Every kernel name raises a
ConfigError that says so, instead of an AttributeError deep inside a codec."""

from __future__ import annotations

from .launch import missing


def __getattr__(name: str) -> object:
    raise missing("sparse", name)
