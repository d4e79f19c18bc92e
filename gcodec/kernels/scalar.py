"""Scalar bodies shared by every backend: written once as plain Python, compiled by each backend
(``numba.njit(inline="always")`` in :mod:`gcodec.kernels.cpu`, ``numba.cuda.jit(device=True)`` in
:mod:`gcodec.kernels.cuda`), so that the bit-level rules of the specs exist in one place.

* binary16 / bfloat16 conversions with round-to-nearest-even (specs/codecs/fp16.md, bf16.md). They
  are branch-free (every case is computed, one is selected) and wrap every integer step in
  ``np.uint32(...)``: Numba widens integer arithmetic to 64 bits, and without the truncations the
  CPU vectoriser works on 64-bit lanes. The rounding of ``f32_to_f16_bits`` is one float addition
  (a power of two whose ulp is the binary16 ulp of ``|v|``), which rounds to nearest even at exactly
  the right bit for normal and subnormal results alike; there is no multiply, so nothing a GPU
  compiler could contract into a fused multiply-add.
* The NaN rule of every addition gcodec defines (specs/format.md §10, "NaN sums"): a NaN sum is
  made positive, whatever IEEE 754 left to the hardware and the compiler.
* Philox4x32-10 (specs/rng.md): its constants and one block.
* The uniform draws made of Philox words (specs/rng.md).

Only NumPy scalar operations that both Numba targets compile appear here.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "M0",
    "M1",
    "W0",
    "W1",
    "bf16_bits_to_f32",
    "f16_bits_to_f32",
    "f32_to_bf16_bits",
    "f32_to_f16_bits",
    "philox4x32",
    "pos_nan",
    "u16_to_open01",
    "u32_to_uniform01",
]

#: Philox4x32 multipliers and Weyl key increments (specs/rng.md).
M0 = np.uint64(0xD2511F53)
M1 = np.uint64(0xCD9E8D57)
W0 = np.uint32(0x9E3779B9)
W1 = np.uint32(0xBB67AE85)


def f32_to_f16_bits(x: np.float32) -> np.uint16:  # pragma: no cover - compiled by each backend
    u = np.float32(x).view(np.uint32)
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    sign = np.uint32(np.uint32(u >> np.uint32(16)) & np.uint32(0x8000))
    # |v| >= 65520 (infinities and NaNs too) is clamped to 65520, which the rounding below carries
    # up to 2**16, that is 0x7C00 (infinity)
    ac = min(a, np.uint32(0x477FF000))
    # m = 2**(e + 13), with e the exponent of |v| but at least -14 (the binary16 subnormal range):
    # the ulp of m + |v| is 2**(e - 10), the binary16 ulp of |v|, so the float addition rounds |v|
    # to nearest even there, and the low bits of m + |v| hold k = round(|v| / 2**(e - 10)) <= 2048
    mb = np.uint32(max(np.uint32(ac & np.uint32(0x7F800000)), np.uint32(0x38800000)) + np.uint32(13 << 23))
    s = np.float32(np.uint32(ac).view(np.float32) + np.uint32(mb).view(np.float32)).view(np.uint32)
    # h = k + ((e + 14) << 10): k carries the implicit leading 1 (1024) of a normal result, and a
    # rounding carry (k = 2048) increments the exponent; e + 140 is the biased exponent of m
    o = np.uint32(np.uint32(s - mb) + np.uint32(np.uint32(mb >> np.uint32(13)) - np.uint32(126 << 10)))
    # NaN: 0x7C00 from the clamp, plus the quiet bit gives 0x7E00
    nan = np.uint32(0x0200) if a > np.uint32(0x7F800000) else np.uint32(0)
    return np.uint16(o | nan | sign)


def f16_bits_to_f32(h: np.uint16) -> np.float32:  # pragma: no cover - compiled by each backend
    hu = np.uint32(h)
    sign = np.uint32(np.uint32(hu & np.uint32(0x8000)) << np.uint32(16))
    em = np.uint32(hu & np.uint32(0x7FFF))
    sh = np.uint32(em << np.uint32(13))
    normal = np.uint32(sh + np.uint32(0x38000000))
    special = np.uint32(sh + np.uint32(0x70000000))  # inf, NaN (payload kept)
    # zero or subnormal: em * 2**-24 = (0.5 + em * 2**-24) - 0.5, both steps exact
    sub = np.float32(np.uint32(em + np.uint32(0x3F000000)).view(np.float32) - np.float32(0.5)).view(np.uint32)
    u = special if em >= np.uint32(0x7C00) else (sub if em < np.uint32(0x0400) else normal)
    return np.uint32(u | sign).view(np.float32)


def f32_to_bf16_bits(x: np.float32) -> np.uint16:  # pragma: no cover - compiled by each backend
    u = np.float32(x).view(np.uint32)
    odd = np.uint32(np.uint32(u >> np.uint32(16)) & np.uint32(1))
    r = np.uint32(np.uint32(u + np.uint32(0x7FFF) + odd) >> np.uint32(16))
    # NaN: the quiet NaN 0x7FC0, sign kept
    nan = np.uint32(np.uint32(np.uint32(u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    return np.uint16(nan if np.uint32(u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else r)


def bf16_bits_to_f32(h: np.uint16) -> np.float32:  # pragma: no cover - compiled by each backend
    return np.uint32(np.uint32(h) << np.uint32(16)).view(np.float32)


def pos_nan(s):  # pragma: no cover - compiled by each backend
    """``s`` with its sign bit cleared when it is a NaN, else ``s`` itself (float32 or float64, the
    type kept): the NaN rule of specs/format.md §10 ("NaN sums"), applied to the result of each
    addition. IEEE 754 leaves the sign and payload of a NaN sum to the implementation (x86 keeps
    the first operand's NaN and makes inf + -inf a negative NaN, AArch64 and CUDA return a positive
    default NaN, compilers may swap the operands), so without it the bits would depend on the
    backend. ``abs`` clears the sign bit alone (a NaN stays a NaN); a select, so loops vectorise."""
    return s if s == s else abs(s)


def philox4x32(c0, c1, c2, c3, k0, k1):  # pragma: no cover - compiled by each backend
    """Philox4x32 with 10 rounds on one counter block; returns four uint32 words (reference form)."""
    c0 = np.uint32(c0)
    c1 = np.uint32(c1)
    c2 = np.uint32(c2)
    c3 = np.uint32(c3)
    k0 = np.uint32(k0)
    k1 = np.uint32(k1)
    for _ in range(10):
        p0 = M0 * np.uint64(c0)
        p1 = M1 * np.uint64(c2)
        hi0 = np.uint32(p0 >> np.uint64(32))
        lo0 = np.uint32(p0 & np.uint64(0xFFFFFFFF))
        hi1 = np.uint32(p1 >> np.uint64(32))
        lo1 = np.uint32(p1 & np.uint64(0xFFFFFFFF))
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = np.uint32(k0 + W0)
        k1 = np.uint32(k1 + W1)
    return c0, c1, c2, c3


def u32_to_uniform01(w):  # pragma: no cover - compiled by each backend
    """The float32 (w >> 8) * 2**-24: uniform on the 2**24 multiples of 2**-24 in [0, 1)."""
    return np.float32(np.uint32(w) >> np.uint32(8)) * np.float32(5.9604644775390625e-08)


def u16_to_open01(r):  # pragma: no cover - compiled by each backend
    """The float32 (2r + 1) * 2**-17 for a 16-bit draw r: the midpoints of 2**16 equal cells of (0, 1), exact."""
    return np.float32(np.int32(r) * np.int32(2) + np.int32(1)) * np.float32(7.62939453125e-06)
