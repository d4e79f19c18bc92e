"""Philox4x32-10 on the device (specs/rng.md): one counter block per call, any block on any thread.

The words equal ``gcodec.kernels.cpu.philox.random_u32`` bit for bit: only 32x32->64-bit integer
products, XORs and additions are involved, so there is no rounding to get wrong.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...rng import MASK64, split64
from .launch import grid

__all__ = ["block", "random_u32", "u16_to_open01", "u32_to_uniform01", "word"]

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint32(0x9E3779B9)
_W1 = np.uint32(0xBB67AE85)


@cuda.jit(device=True)
def block(b, s0, s1, k0, k1):  # pragma: no cover - device
    """The four words of counter block ``b`` (uint64) of stream (s0, s1) under key (k0, k1)."""
    b = np.uint64(b)
    c0 = np.uint32(b & np.uint64(0xFFFFFFFF))
    c1 = np.uint32(b >> np.uint64(32))
    c2 = np.uint32(s0)
    c3 = np.uint32(s1)
    k0 = np.uint32(k0)
    k1 = np.uint32(k1)
    for _ in range(10):
        p0 = _M0 * np.uint64(c0)
        p1 = _M1 * np.uint64(c2)
        n0 = np.uint32(np.uint32(p1 >> np.uint64(32)) ^ c1 ^ k0)
        n1 = np.uint32(p1 & np.uint64(0xFFFFFFFF))
        n2 = np.uint32(np.uint32(p0 >> np.uint64(32)) ^ c3 ^ k1)
        n3 = np.uint32(p0 & np.uint64(0xFFFFFFFF))
        c0, c1, c2, c3 = n0, n1, n2, n3
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    return c0, c1, c2, c3


@cuda.jit(device=True)
def word(j, s0, s1, k0, k1):  # pragma: no cover - device
    """Word ``j`` of the stream (recomputes its block)."""
    j = np.uint64(j)
    w = block(j >> np.uint64(2), s0, s1, k0, k1)
    r = j & np.uint64(3)
    return w[0] if r == 0 else (w[1] if r == 1 else (w[2] if r == 2 else w[3]))


@cuda.jit(device=True)
def u16_to_open01(r):  # pragma: no cover - device
    """float32((2r + 1)) * 2**-17: exact (an integer below 2**17 times a power of two)."""
    return np.float32(np.int32(r) * np.int32(2) + np.int32(1)) * np.float32(7.62939453125e-06)


@cuda.jit(device=True)
def u32_to_uniform01(w):  # pragma: no cover - device
    return np.float32(np.uint32(w) >> np.uint32(8)) * np.float32(5.9604644775390625e-08)


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
