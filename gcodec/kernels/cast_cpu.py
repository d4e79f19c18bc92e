"""float32 <-> binary16 / bfloat16 conversions with round-to-nearest-even (specs/codecs/fp16.md, bf16.md)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

CHUNK = 1 << 16


@njit(cache=True, inline="always")
def f32_to_f16_bits(x: np.float32) -> np.uint16:  # pragma: no cover - jitted
    # Branch-free so that LLVM vectorises it: all three cases are computed, one is selected.
    u = np.float32(x).view(np.uint32)
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    af = np.uint32(a).view(np.float32)
    # normal binary16 range: rebias the exponent by -112 and round the 13 dropped bits to even
    odd = (a >> np.uint32(13)) & np.uint32(1)
    normal = np.uint32(a + np.uint32(0xC8000FFF) + odd) >> np.uint32(13)
    # below 2**-14: a binary16 subnormal (or zero) holds round(|x| * 2**24) in its mantissa
    small = af if af < np.float32(6.103515625e-05) else np.float32(6.103515625e-05)
    sub = np.uint32(np.rint(small * np.float32(16777216.0)))
    # |x| >= 65520 rounds to infinity; NaN becomes the quiet NaN 0x7E00
    big = np.uint32(0x7E00) if a > np.uint32(0x7F800000) else np.uint32(0x7C00)
    o = big if a >= np.uint32(0x477FF000) else (sub if a < np.uint32(0x38800000) else normal)
    return np.uint16(o | sign)


@njit(cache=True, inline="always")
def f16_bits_to_f32(h: np.uint16) -> np.float32:  # pragma: no cover - jitted
    hu = np.uint32(h)
    sign = (hu & np.uint32(0x8000)) << np.uint32(16)
    em = hu & np.uint32(0x7FFF)
    normal = np.uint32((em << np.uint32(13)) + np.uint32(0x38000000))
    special = np.uint32((em << np.uint32(13)) + np.uint32(0x70000000))  # inf, NaN (payload kept)
    subf = np.float32(em) * np.float32(5.9604644775390625e-08)  # em * 2**-24, exact
    sub = np.uint32(np.float32(subf).view(np.uint32))
    u = special if em >= np.uint32(0x7C00) else (sub if em < np.uint32(0x0400) else normal)
    return np.uint32(u | sign).view(np.float32)


@njit(cache=True, inline="always")
def f32_to_bf16_bits(x: np.float32) -> np.uint16:  # pragma: no cover - jitted
    u = np.float32(x).view(np.uint32)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN: the quiet NaN 0x7FC0, sign kept
        return np.uint16(((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    odd = (u >> np.uint32(16)) & np.uint32(1)
    return np.uint16((u + np.uint32(0x7FFF) + odd) >> np.uint32(16))


@njit(cache=True, parallel=True)
def encode_f16(x, out):  # pragma: no cover - jitted
    n = x.shape[0]
    nchunks = (n + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        for i in range(lo, hi):
            out[i] = f32_to_f16_bits(np.float32(x[i]))


@njit(cache=True, parallel=True)
def encode_bf16(x, out):  # pragma: no cover - jitted
    n = x.shape[0]
    nchunks = (n + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        for i in range(lo, hi):
            out[i] = f32_to_bf16_bits(np.float32(x[i]))


@njit(cache=True, parallel=True)
def decode_f16(h, out, accumulate):  # pragma: no cover - jitted
    n = h.shape[0]
    nchunks = (n + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        if accumulate:
            for i in range(lo, hi):
                out[i] += f16_bits_to_f32(h[i])
        else:
            for i in range(lo, hi):
                out[i] = f16_bits_to_f32(h[i])


@njit(cache=True, parallel=True)
def decode_bf16(h, out, accumulate):  # pragma: no cover - jitted
    n = h.shape[0]
    nchunks = (n + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        if accumulate:
            for i in range(lo, hi):
                out[i] += np.uint32(np.uint32(h[i]) << np.uint32(16)).view(np.float32)
        else:
            for i in range(lo, hi):
                out[i] = np.uint32(np.uint32(h[i]) << np.uint32(16)).view(np.float32)
