"""Timing shared by the benchmarks: interleaved best-of rounds, so that machine noise hits every
contender of a comparison alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_of(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Best wall time (s) of each callable, interleaved over ``repeat`` rounds after one warm-up
    (the warm-up takes JIT compilation and the page faults of fresh outputs)."""
    for f in fns.values():
        f()
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best
