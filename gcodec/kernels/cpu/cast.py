"""float32 <-> binary16 / bfloat16 conversions with round-to-nearest-even (specs/codecs/fp16.md, bf16.md).

The results are exactly the ones the spec tables give; the formulations are chosen so that LLVM
vectorises every loop with 32-bit lanes (eight elements per AVX2 instruction):

* the scalar conversions (:mod:`gcodec.kernels.scalar`, shared with the CUDA backend) are
  branch-free and keep every integer step in 32 bits;
* kernels index with unsigned offsets (``base + np.uint64(j)``): with a signed run-time index
  Numba emits a negative-index wraparound select that hides the access pattern from the
  vectoriser.

Where the CPU has binary16 conversion instructions (:data:`.simd.HAS_F16`: x86 F16C, AArch64),
the binary16 kernels on float32 arrays convert 16 elements at a time with them
(:mod:`.simd`'s ``f16_*`` intrinsics, the spec's NaN bits put back by a select), and only the
last ``n % 16`` elements take the scalar conversions: the same bits, at 2.5-3x the speed of the
integer formulation for the pair sum (measured on the 2-core Zen 4 VM, docs/performance.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import scalar
from . import simd
from .threads import run_chunks

CHUNK = 1 << 16


# The scalar conversions are gcodec.kernels.scalar's, compiled here for the CPU, and so is the NaN
# rule of every addition (specs/format.md §10, "NaN sums"): the CPU kernels' sums go through pos_nan.
_inline = njit(cache=True, inline="always")
f32_to_f16_bits = _inline(scalar.f32_to_f16_bits)
f16_bits_to_f32 = _inline(scalar.f16_bits_to_f32)
f32_to_bf16_bits = _inline(scalar.f32_to_bf16_bits)
bf16_bits_to_f32 = _inline(scalar.bf16_bits_to_f32)
pos_nan = _inline(scalar.pos_nan)


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
        out[i] = pos_nan(out[i] + f16_bits_to_f32(h[i]))
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
        out[i] = pos_nan(out[i] + bf16_bits_to_f32(h[i]))
    return 0


# The NaN rule of specs/format.md §10 in the kernels below that count their infinite or NaN
# results (the pair sums, and the fused feedback kernels, whose residual is NaN where c = x + e is),
# scalar and 16-lane: the sum is NaN exactly where its bits are, so when the count is not 0 a second
# pass over the range writes the bits the spec's conversion gives a positive NaN there (binary16
# 0x7E00, bfloat16 0x7FC0, their float32 0x7FC00000, payloads dropped), and when it is 0, the usual
# case, nothing is done. The same bits as pos_nan on each sum, without its compare and select in
# loops that are compute-bound (8-10 % of the scalar binary16 feedback kernel's time, measured).
@njit(cache=True, nogil=True)
def _nan_bits16(out, lo, hi, exp, qnan):  # pragma: no cover - jitted
    """out[i] = ``qnan`` for each 16-bit NaN pattern in out[lo:hi] (exponent bits ``exp`` all set and a
    mantissa, either sign)."""
    for i in range(lo, hi):
        if np.uint16(out[i] & np.uint16(0x7FFF)) > exp:
            out[i] = qnan


@njit(cache=True, nogil=True)
def _nan_bits32(out, lo, hi):  # pragma: no cover - jitted
    """out[i] = the float32 0x7FC00000 (of binary16 0x7E00 and bfloat16 0x7FC0) for each NaN in out[lo:hi]."""
    q = np.uint32(0x7FC00000).view(np.float32)
    for i in range(lo, hi):
        if out[i] != out[i]:
            out[i] = q


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
    if bad:  # NaN sums: +NaN (format.md §10)
        _nan_bits16(out, lo, hi, np.uint16(0x7C00), np.uint16(0x7E00))
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
    if bad:  # NaN sums: +NaN (format.md §10)
        _nan_bits16(out, lo, hi, np.uint16(0x7F80), np.uint16(0x7FC0))
    return bad


@njit(cache=True, nogil=True)
def _sum2w_f16_range(a, b, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    bad = np.uint32(0)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        s = np.float32(np.float32(0) + f16_bits_to_f32(a[i]))
        h = f32_to_f16_bits(np.float32(s + f16_bits_to_f32(b[i])))
        out[i] = f16_bits_to_f32(h)
        bad += np.uint32(np.uint32(h & np.uint32(0x7C00)) == np.uint32(0x7C00))
    if bad:  # NaN sums: +NaN (format.md §10)
        _nan_bits32(out, lo, hi)
    return bad


@njit(cache=True, nogil=True)
def _sum2w_bf16_range(a, b, out, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    bad = np.uint32(0)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        s = np.float32(np.float32(0) + bf16_bits_to_f32(a[i]))
        h = f32_to_bf16_bits(np.float32(s + bf16_bits_to_f32(b[i])))
        out[i] = bf16_bits_to_f32(h)
        bad += np.uint32(np.uint32(h & np.uint32(0x7F80)) == np.uint32(0x7F80))
    if bad:  # NaN sums: +NaN (format.md §10)
        _nan_bits32(out, lo, hi)
    return bad


# The same kernels 16 elements at a time with the conversion instructions (module docstring); the
# tail of each range goes through the scalar kernel. Only for C-contiguous float32/uint16 arrays.
@njit(cache=True, nogil=True)
def _encode_f16_range_v(x, out, lo, hi):  # pragma: no cover - jitted
    i = lo
    while i + 16 <= hi:
        simd.f16_encode16(x, out, i)
        i += 16
    return _encode_f16_range(x, out, i, hi)


@njit(cache=True, nogil=True)
def _decode_f16_range_v(h, out, lo, hi):  # pragma: no cover - jitted
    i = lo
    while i + 16 <= hi:
        simd.f16_decode16(h, out, i)
        i += 16
    return _decode_f16_range(h, out, i, hi)


@njit(cache=True, nogil=True)
def _add_f16_range_v(h, out, lo, hi):  # pragma: no cover - jitted
    i = lo
    while i + 16 <= hi:
        simd.f16_add16(h, out, i)
        i += 16
    return _add_f16_range(h, out, i, hi)


@njit(cache=True, nogil=True)
def _sum2_f16_range_v(a, b, out, lo, hi):  # pragma: no cover - jitted
    i = lo
    bad = np.uint32(0)
    while i + 16 <= hi:
        bad += simd.f16_sum2_16(a, b, out, i)
        i += 16
    if bad:  # NaN sums: +NaN (format.md §10); the tail's are set by the scalar kernel
        _nan_bits16(out, lo, i, np.uint16(0x7C00), np.uint16(0x7E00))
    return bad + _sum2_f16_range(a, b, out, i, hi)


@njit(cache=True, nogil=True)
def _sum2w_f16_range_v(a, b, out, lo, hi):  # pragma: no cover - jitted
    i = lo
    bad = np.uint32(0)
    while i + 16 <= hi:
        bad += simd.f16_sum2_widen16(a, b, out, i)
        i += 16
    if bad:  # NaN sums: +NaN (format.md §10); the tail's are set by the scalar kernel
        _nan_bits32(out, lo, i)
    return bad + _sum2w_f16_range(a, b, out, i, hi)


# Error feedback fused into the encode (fp16.md §3, §5; docs/error-feedback.md): c = x (+ e) in
# float32, its 16-bit bits, and the new residual c - float32(bits), in one pass over x and e. The
# same IEEE steps as the separate kernels (x + e, encode, decode, subtract), so the same bits; a NaN
# c is made positive by the pass after the loop (format.md §10; its residual, NaN, is refused by the
# caller whatever its sign).
@njit(cache=True, nogil=True)
def _feedback_f16_range(x, e, has_e, out, enew, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    bad = np.uint32(0)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        c = np.float32(x[i] + e[i]) if has_e else np.float32(x[i])
        h = f32_to_f16_bits(c)
        out[i] = h
        r = np.float32(c - f16_bits_to_f32(h))
        enew[i] = r
        bad += np.uint32(np.uint32(r.view(np.uint32) & np.uint32(0x7F800000)) == np.uint32(0x7F800000))
    if has_e and bad:  # a NaN c = x + e (its residual is NaN, so counted) encodes as +NaN (format.md §10)
        _nan_bits16(out, lo, hi, np.uint16(0x7C00), np.uint16(0x7E00))
    return bad


@njit(cache=True, nogil=True)
def _feedback_bf16_range(x, e, has_e, out, enew, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    bad = np.uint32(0)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        c = np.float32(x[i] + e[i]) if has_e else np.float32(x[i])
        h = f32_to_bf16_bits(c)
        out[i] = h
        r = np.float32(c - bf16_bits_to_f32(h))
        enew[i] = r
        bad += np.uint32(np.uint32(r.view(np.uint32) & np.uint32(0x7F800000)) == np.uint32(0x7F800000))
    if has_e and bad:  # a NaN c = x + e (its residual is NaN, so counted) encodes as +NaN (format.md §10)
        _nan_bits16(out, lo, hi, np.uint16(0x7F80), np.uint16(0x7FC0))
    return bad


@njit(cache=True, nogil=True)
def _feedback_f16_range_v(x, e, has_e, out, enew, lo, hi):  # pragma: no cover - jitted
    i = lo
    bad = np.uint32(0)
    if has_e:
        while i + 16 <= hi:
            bad += simd.f16_feedback16(x, e, out, enew, i)
            i += 16
        if bad:  # a NaN c = x + e encodes as +NaN (format.md §10); the tail's is set by the scalar kernel
            _nan_bits16(out, lo, i, np.uint16(0x7C00), np.uint16(0x7E00))
    else:
        while i + 16 <= hi:
            bad += simd.f16_feedback16_noe(x, e, out, enew, i)
            i += 16
    return bad + _feedback_f16_range(x, e, has_e, out, enew, i, hi)


def _vector(*arrays: np.ndarray) -> bool:
    """Whether the 16-lane binary16 kernels take these arrays: the instructions are there, and every
    array is a C-contiguous float32 or uint16 array (what the intrinsics are typed for)."""
    return simd.HAS_F16 and all(a.dtype in (np.float32, np.uint16) and a.flags.c_contiguous for a in arrays)


def encode_f16(x: np.ndarray, out: np.ndarray) -> None:
    """out[i] = binary16 bits of x[i] (float32 or float64 input), round to nearest even."""
    run_chunks(_encode_f16_range_v if _vector(x, out) else _encode_f16_range, x.shape[0], CHUNK, x, out)


def encode_bf16(x: np.ndarray, out: np.ndarray) -> None:
    """out[i] = bfloat16 bits of x[i] (float32 or float64 input), round to nearest even."""
    run_chunks(_encode_bf16_range, x.shape[0], CHUNK, x, out)


def decode_f16(h: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """out[i] (+)= float32(binary16 h[i]) (out float32 or float64)."""
    if _vector(h, out):
        run_chunks(_add_f16_range_v if accumulate else _decode_f16_range_v, h.shape[0], CHUNK, h, out)
    else:
        run_chunks(_add_f16_range if accumulate else _decode_f16_range, h.shape[0], CHUNK, h, out)


def decode_bf16(h: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """out[i] (+)= float32(bfloat16 h[i]) (out float32 or float64)."""
    run_chunks(_add_bf16_range if accumulate else _decode_bf16_range, h.shape[0], CHUNK, h, out)


def sum2_f16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """out[i] = binary16 bits of the float32 sum (0 + float32(a[i])) + float32(b[i]), rounded once
    to nearest even (a, b, out binary16 bits; out may be a or b). The leading +0 is kept on
    purpose: it is how an accumulator that starts at zero sums, and it makes -0 + -0 give +0.
    Returns how many results are infinite or NaN."""
    return run_chunks(_sum2_f16_range_v if _vector(a, b, out) else _sum2_f16_range, a.shape[0], CHUNK, a, b, out)


def sum2_bf16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """As :func:`sum2_f16` for bfloat16 bits."""
    return run_chunks(_sum2_bf16_range, a.shape[0], CHUNK, a, b, out)


def sum2_widen_f16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """out[i] = the float32 value of what :func:`sum2_f16` writes (a, b binary16 bits, out float32):
    the pair sum and its decode in one pass, with no binary16 sums written in between. Returns how
    many sums are infinite or NaN."""
    return run_chunks(_sum2w_f16_range_v if _vector(a, b, out) else _sum2w_f16_range, a.shape[0], CHUNK, a, b, out)


def encode_f16_feedback(x: np.ndarray, e: np.ndarray | None, out: np.ndarray, enew: np.ndarray) -> int:
    """Error feedback fused into the binary16 encode (flat float32 ``x``, ``e`` or None, ``enew``;
    ``out`` binary16 bits): c = x + e (x alone without a residual), out = bits of c, enew = c -
    float32(out), bit for bit what the separate passes give. Returns how many residuals are
    infinite or NaN (the caller then keeps the old residual)."""
    ee = x if e is None else e
    k = _feedback_f16_range_v if _vector(x, ee, out, enew) else _feedback_f16_range
    return int(run_chunks(k, x.shape[0], CHUNK, x, ee, e is not None, out, enew))


def encode_bf16_feedback(x: np.ndarray, e: np.ndarray | None, out: np.ndarray, enew: np.ndarray) -> int:
    """As :func:`encode_f16_feedback` for bfloat16."""
    ee = x if e is None else e
    return int(run_chunks(_feedback_bf16_range, x.shape[0], CHUNK, x, ee, e is not None, out, enew))


def sum2_widen_bf16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """As :func:`sum2_widen_f16` for bfloat16 bits."""
    return run_chunks(_sum2w_bf16_range, a.shape[0], CHUNK, a, b, out)
