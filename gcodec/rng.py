"""Facts of the counter-based generator (specs/rng.md) that need no kernel.

Every stochastic codec draws from Philox4x32-10 keyed by a 64-bit ``seed`` and addressed by a
64-bit ``stream`` and a word index; the kernels of each backend (``gcodec.kernels.cpu.philox``)
produce the words. Seeds and streams travel to the kernels as two uint32 halves.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MASK64", "split64"]

MASK64 = (1 << 64) - 1


def split64(v: int) -> tuple[np.uint32, np.uint32]:
    """(lo32, hi32) of a 64-bit integer, as the kernels take it."""
    v &= MASK64
    return np.uint32(v & 0xFFFFFFFF), np.uint32(v >> 32)
