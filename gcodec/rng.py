"""The counter-based generator every stochastic codec uses (specs/rng.md).

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), keyed by a
64-bit ``seed`` and addressed by a 64-bit ``stream`` and a 64-bit element index. Element ``i`` of
stream ``s`` under seed ``k`` is word ``i mod 4`` of

    Philox4x32-10(counter = (lo32(i // 4), hi32(i // 4), lo32(s), hi32(s)),
                  key     = (lo32(k), hi32(k)))

so any element can be computed on its own, in any order, on any device, with identical bits.
No global state is touched. ``uniform01`` maps a word ``w`` to the float32 ``(w >> 8) * 2**-24``,
in [0, 1) with 24 random bits, exact in float32.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["philox4x32", "random_u32", "random_uniform01", "u32_to_uniform01", "MASK64"]

MASK64 = (1 << 64) - 1
_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint32(0x9E3779B9)
_W1 = np.uint32(0xBB67AE85)


@njit(cache=True, inline="always")
def philox4x32(c0, c1, c2, c3, k0, k1):  # pragma: no cover - jitted
    """Philox4x32 with 10 rounds on one counter block; returns four uint32 words."""
    c0 = np.uint32(c0)
    c1 = np.uint32(c1)
    c2 = np.uint32(c2)
    c3 = np.uint32(c3)
    k0 = np.uint32(k0)
    k1 = np.uint32(k1)
    for _ in range(10):
        p0 = _M0 * np.uint64(c0)
        p1 = _M1 * np.uint64(c2)
        hi0 = np.uint32(p0 >> np.uint64(32))
        lo0 = np.uint32(p0 & np.uint64(0xFFFFFFFF))
        hi1 = np.uint32(p1 >> np.uint64(32))
        lo1 = np.uint32(p1 & np.uint64(0xFFFFFFFF))
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    return c0, c1, c2, c3


@njit(cache=True, inline="always")
def u32_to_uniform01(w):  # pragma: no cover - jitted
    """The float32 (w >> 8) * 2**-24: uniform on the 2**24 multiples of 2**-24 in [0, 1)."""
    return np.float32(np.uint32(w) >> np.uint32(8)) * np.float32(5.9604644775390625e-08)


@njit(cache=True, inline="always")
def word_at(seed_lo, seed_hi, stream_lo, stream_hi, i):  # pragma: no cover - jitted
    """Word ``i`` of the stream (recomputes its block; use the block loops below for speed)."""
    b = np.uint64(i) >> np.uint64(2)
    r = philox4x32(
        np.uint32(b & np.uint64(0xFFFFFFFF)), np.uint32(b >> np.uint64(32)), stream_lo, stream_hi, seed_lo, seed_hi
    )
    j = i & 3
    return r[0] if j == 0 else (r[1] if j == 1 else (r[2] if j == 2 else r[3]))


@njit(cache=True, parallel=True)
def _fill_u32(out, start, seed_lo, seed_hi, stream_lo, stream_hi):  # pragma: no cover - jitted
    """out[j] = word (start + j) of the stream; ``start`` must be a multiple of 4."""
    n = out.shape[0]
    nblocks = (n + 3) // 4
    b0 = np.uint64(start) >> np.uint64(2)
    for b in prange(nblocks):
        bb = b0 + np.uint64(b)
        r0, r1, r2, r3 = philox4x32(
            np.uint32(bb & np.uint64(0xFFFFFFFF)), np.uint32(bb >> np.uint64(32)), stream_lo, stream_hi, seed_lo, seed_hi
        )
        j = b * 4
        out[j] = r0
        if j + 1 < n:
            out[j + 1] = r1
        if j + 2 < n:
            out[j + 2] = r2
        if j + 3 < n:
            out[j + 3] = r3


def _split(v: int) -> tuple[np.uint32, np.uint32]:
    v &= MASK64
    return np.uint32(v & 0xFFFFFFFF), np.uint32(v >> 32)


def random_u32(seed: int, stream: int, n: int, start: int = 0) -> np.ndarray:
    """Words ``start .. start+n-1`` of stream ``stream`` under ``seed`` (uint32 array)."""
    if start % 4:
        raise ValueError("start must be a multiple of 4")
    out = np.empty(n, dtype=np.uint32)
    sl, sh = _split(seed)
    tl, th = _split(stream)
    _fill_u32(out, start, sl, sh, tl, th)
    return out


def random_uniform01(seed: int, stream: int, n: int, start: int = 0) -> np.ndarray:
    """float32 uniforms in [0, 1) for elements ``start .. start+n-1``."""
    w = random_u32(seed, stream, n, start)
    return (w >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
