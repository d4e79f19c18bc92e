"""float32 <-> binary16 / bfloat16 conversions with round-to-nearest-even (specs/codecs/fp16.md, bf16.md).

The results are exactly the ones the spec tables give; the formulations below are chosen so that
LLVM vectorises every loop with 32-bit lanes (eight elements per AVX2 instruction):

* the scalar helpers are branch-free (every case is computed, one is selected) and wrap every
  integer step in ``np.uint32(...)``: Numba widens integer arithmetic to 64 bits, and without the
  truncations the vectoriser works on 64-bit lanes (half the elements per instruction);
* the rounding of ``f32_to_f16_bits`` is done by the FPU: adding a power of two whose ulp is the
  binary16 ulp of ``|v|`` makes the float addition round to nearest even at exactly the right bit,
  for normal and subnormal results alike;
* kernels index with unsigned offsets (``base + np.uint64(j)``): with a signed run-time index
  Numba emits a negative-index wraparound select that hides the access pattern from the
  vectoriser.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .threads import run_chunks

CHUNK = 1 << 16


@njit(cache=True, inline="always")
def f32_to_f16_bits(x: np.float32) -> np.uint16:  # pragma: no cover - jitted
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


@njit(cache=True, inline="always")
def f16_bits_to_f32(h: np.uint16) -> np.float32:  # pragma: no cover - jitted
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


@njit(cache=True, inline="always")
def f32_to_bf16_bits(x: np.float32) -> np.uint16:  # pragma: no cover - jitted
    u = np.float32(x).view(np.uint32)
    odd = np.uint32(np.uint32(u >> np.uint32(16)) & np.uint32(1))
    r = np.uint32(np.uint32(u + np.uint32(0x7FFF) + odd) >> np.uint32(16))
    # NaN: the quiet NaN 0x7FC0, sign kept
    nan = np.uint32(np.uint32(np.uint32(u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    return np.uint16(nan if np.uint32(u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else r)


@njit(cache=True, inline="always")
def bf16_bits_to_f32(h: np.uint16) -> np.float32:  # pragma: no cover - jitted
    return np.uint32(np.uint32(h) << np.uint32(16)).view(np.float32)


@njit(cache=True, nogil=True)
def _encode_f16_range(x, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        out[i] = f32_to_f16_bits(np.float32(x[i]))
    return 0


@njit(cache=True, nogil=True)
def _encode_bf16_range(x, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        out[i] = f32_to_bf16_bits(np.float32(x[i]))
    return 0


@njit(cache=True, nogil=True)
def _decode_f16_range(h, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        out[i] = f16_bits_to_f32(h[i])
    return 0


@njit(cache=True, nogil=True)
def _add_f16_range(h, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        out[i] += f16_bits_to_f32(h[i])
    return 0


@njit(cache=True, nogil=True)
def _decode_bf16_range(h, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        out[i] = bf16_bits_to_f32(h[i])
    return 0


@njit(cache=True, nogil=True)
def _add_bf16_range(h, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        out[i] += bf16_bits_to_f32(h[i])
    return 0


@njit(cache=True, nogil=True)
def _sum2_f16_range(a, b, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    bad = np.uint32(0)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        s = np.float32(np.float32(0) + f16_bits_to_f32(a[i]))  # from +0, as an accumulator sums
        h = f32_to_f16_bits(np.float32(s + f16_bits_to_f32(b[i])))
        out[i] = h
        bad += np.uint32(np.uint32(h & np.uint32(0x7C00)) == np.uint32(0x7C00))  # infinity or NaN
    return bad


@njit(cache=True, nogil=True)
def _sum2_bf16_range(a, b, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    bad = np.uint32(0)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        s = np.float32(np.float32(0) + bf16_bits_to_f32(a[i]))  # from +0, as an accumulator sums
        h = f32_to_bf16_bits(np.float32(s + bf16_bits_to_f32(b[i])))
        out[i] = h
        bad += np.uint32(np.uint32(h & np.uint32(0x7F80)) == np.uint32(0x7F80))  # infinity or NaN
    return bad


def encode_f16(x: np.ndarray, out: np.ndarray) -> None:
    """out[i] = binary16 bits of x[i] (float32 or float64 input), round to nearest even."""
    run_chunks(_encode_f16_range, x.shape[0], CHUNK, x, out)


def encode_bf16(x: np.ndarray, out: np.ndarray) -> None:
    """out[i] = bfloat16 bits of x[i] (float32 or float64 input), round to nearest even."""
    run_chunks(_encode_bf16_range, x.shape[0], CHUNK, x, out)


def decode_f16(h: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """out[i] (+)= float32(binary16 h[i]) (out float32 or float64)."""
    run_chunks(_add_f16_range if accumulate else _decode_f16_range, h.shape[0], CHUNK, h, out)


def decode_bf16(h: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """out[i] (+)= float32(bfloat16 h[i]) (out float32 or float64)."""
    run_chunks(_add_bf16_range if accumulate else _decode_bf16_range, h.shape[0], CHUNK, h, out)


def sum2_f16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """out[i] = binary16 bits of the float32 sum (0 + float32(a[i])) + float32(b[i]), rounded once
    to nearest even (a, b, out binary16 bits; out may be a or b). The leading +0 is kept on
    purpose: it is how an accumulator that starts at zero sums, and it makes -0 + -0 give +0.
    Returns how many results are infinite or NaN."""
    return run_chunks(_sum2_f16_range, a.shape[0], CHUNK, a, b, out)


def sum2_bf16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """As :func:`sum2_f16` for bfloat16 bits."""
    return run_chunks(_sum2_bf16_range, a.shape[0], CHUNK, a, b, out)
