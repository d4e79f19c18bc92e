"""Philox4x32-10 on the device (specs/rng.md): one counter block per call, any block on any thread.

The words equal ``gcodec.kernels.cpu.philox.random_u32`` bit for bit: only 32x32->64-bit integer
products, XORs and additions are involved, so there is no rounding to get wrong.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...rng import MASK64, split64
from .. import scalar
from .launch import grid

__all__ = ["block", "random_u32", "u16_to_open01", "u32_to_uniform01", "word"]

_philox4x32 = cuda.jit(device=True)(scalar.philox4x32)


@cuda.jit(device=True)
def block(b, s0, s1, k0, k1):  # pragma: no cover - device
    """The four words of counter block ``b`` (uint64) of stream (s0, s1) under key (k0, k1):
    gcodec.kernels.scalar's Philox4x32-10, the CPU backend's too."""
    b = np.uint64(b)
    return _philox4x32(np.uint32(b & np.uint64(0xFFFFFFFF)), np.uint32(b >> np.uint64(32)), s0, s1, k0, k1)


@cuda.jit(device=True)
def word(j, s0, s1, k0, k1):  # pragma: no cover - device
    """Word ``j`` of the stream (recomputes its block)."""
    j = np.uint64(j)
    w = block(j >> np.uint64(2), s0, s1, k0, k1)
    r = j & np.uint64(3)
    return w[0] if r == 0 else (w[1] if r == 1 else (w[2] if r == 2 else w[3]))


u16_to_open01 = cuda.jit(device=True)(scalar.u16_to_open01)
u32_to_uniform01 = cuda.jit(device=True)(scalar.u32_to_uniform01)


@cuda.jit
def _fill(out, b0, s0, s1, k0, k1):  # pragma: no cover - device
    n = out.shape[0]
    nb = (n + 3) // 4
    for b in range(cuda.grid(1), nb, cuda.gridsize(1)):
        w = block(np.uint64(b0) + np.uint64(b), s0, s1, k0, k1)
        for t in range(4):
            j = 4 * b + t
            if j < n:
                out[j] = w[t]


def random_u32(seed: int, stream: int, n: int, start: int = 0):  # type: ignore[no-untyped-def]
    """Words ``start .. start+n-1`` of the stream, as a device uint32 array."""
    for name, v in (("seed", seed), ("stream", stream)):
        if not 0 <= v <= MASK64:
            raise ValueError(f"{name} must be in [0, 2**64), got {v}")
    if start % 4 or start < 0:
        raise ValueError("start must be a non-negative multiple of 4")
    out = cuda.device_array(n, np.uint32)
    if n:
        k0, k1 = split64(seed)
        s0, s1 = split64(stream)
        _fill[grid((n + 3) // 4)](out, np.uint64(start // 4), s0, s1, k0, k1)
    return out
