"""Strict JSON for reports: what ``gcodec inspect --json``, ``gcodec demo --json`` and the benchmarks write."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["json_safe"]


def json_safe(obj: Any) -> Any:
    """NaN and infinities become None (strict JSON); tuples become lists; NumPy scalars, Python."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
