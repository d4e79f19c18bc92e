"""Strict JSON for reports: what ``gcodec inspect --json``, ``gcodec demo --json`` and the benchmarks write."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["json_safe"]


def _leaf(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_safe(obj: Any) -> Any:
    """NaN and infinities become None (strict JSON); tuples become lists; NumPy scalars, Python.

    Walked with an explicit stack: a payload's params may be nested as deep as ``max_nesting``
    allows (1000 levels, specs/format.md F8), beyond Python's frame limit.
    """
    root: list[Any] = [None]
    # (value to convert, the container that receives it, its key or index there)
    todo: list[tuple[Any, Any, Any]] = [(obj, root, 0)]
    while todo:
        v, parent, key = todo.pop()
        if isinstance(v, dict):
            new: Any = {}
            parent[key] = new
            # reversed onto the stack, so that keys are converted, and inserted, in their order
            todo.extend((val, new, str(k)) for k, val in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            new = [None] * len(v)
            parent[key] = new
            todo.extend((val, new, j) for j, val in reversed(list(enumerate(v))))
        else:
            parent[key] = _leaf(v)
    return root[0]
