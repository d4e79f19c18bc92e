"""1-bit sign compression with a mean-|x| scale per group (specs/codecs/sign.md), fused kernels.

Encoding a sub-block computes each group's scale (the float64 lane sum of |v| divided by the group's
length, rounded to float32) and packs one bit per element, 1 for ``v < 0``, eight elements per
byte, least significant bit first. Decoding writes ``-s`` or ``+s``. :func:`sign_encode_feedback`
fuses error feedback into the same pass: ``c = x + e`` is formed, encoded and its new residual
``c - decode(c)`` written, reading ``x`` and ``e`` once and writing the residual once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...layout.quant import RULE_MEANABS
from .cast import pos_nan
from .quant import CHUNK, geometry
from .scales import _scale, lane_sum, large_group_scales
from .simd import add_signs8, put_signs8, sign_bits64, store_u64
from .threads import run_chunks

__all__ = ["encode", "encode_feedback", "fuses_feedback", "sign_decode", "sign_encode", "sign_encode_feedback"]

_E16 = np.empty(0, np.uint16)


@njit(cache=True, inline="always")
def _pack_signs(v, b0, b1, codes):  # pragma: no cover - jitted
    """codes[b0/8 ..] = bits (v_i < 0) of elements [b0, b1), b0 a multiple of 64, LSB first.

    64 elements make one uint64 (:func:`sign_bits64`: a vector compare and a bit mask), stored as
    8 little-endian bytes.
    """
    base = np.uint64(b0)
    o0 = np.uint64(b0 // 8)
    m = b1 - b0
    zero = np.float32(0.0)
    for j in range(m // 64):
        store_u64(codes, o0 + np.uint64(8 * j), sign_bits64(v, base + np.uint64(64 * j)))
    r = m % 64
    if r:
        k = base + np.uint64(m - r)
        word = np.uint64(0)
        for t in range(r):
            word |= np.uint64(np.float32(v[k + np.uint64(t)]) < zero) << np.uint64(t)
        o = o0 + np.uint64(m // 64 * 8)
        for t in range((r + 7) // 8):
            codes[o + np.uint64(t)] = np.uint8((word >> np.uint64(8 * t)) & np.uint64(0xFF))


@njit(cache=True, inline="always")
def _mean_abs_scales(v, scales, G, b0, b1):  # pragma: no cover - jitted
    """scales[g] = float32(mean |v|) of the groups g that start in [b0, b1); returns how many are
    not finite."""
    n = v.shape[0]
    bad = 0
    for gi in range(b0 // G, (b1 - 1) // G + 1):
        lo = gi * G
        hi = min(lo + G, n)
        s, _h, isbad = _scale(RULE_MEANABS, np.uint32(0), lane_sum(v, lo, hi, 1), 0.0, hi - lo, 1, 0.0, False)
        scales[gi] = s
        bad += isbad
    return bad


@njit(cache=True, nogil=True)
def _encode_chunk(x, codes, scales, G, L, fused, c0, c1):  # pragma: no cover - jitted
    n = x.shape[0]
    bad = 0
    for b0 in range(c0, c1, L):
        b1 = min(b0 + L, n)
        if fused:
            bad += _mean_abs_scales(x, scales, G, b0, b1)
        _pack_signs(x, b0, b1, codes)
    return bad


def sign_encode(x, codes, scales, G, L, C, fused):  # type: ignore[no-untyped-def]
    """Bits and (when ``fused``) scales of flat ``x``; returns the number of non-finite groups.

    ``G, L, C, fused`` come from :func:`gcodec.kernels.quant_cpu.geometry`; when not ``fused`` the
    scales must be computed first (``large_group_scales`` with ``RULE_MEANABS``).
    """
    return run_chunks(_encode_chunk, x.shape[0], C, x, codes, scales, G, L, fused)


@njit(cache=True, inline="always")
def _put_sign(codes, out, i, s, accumulate):  # pragma: no cover - jitted
    """out[i] (+)= -s or +s by bit i (one element; for group edges inside a byte; a NaN sum made
    positive, format.md §10)."""
    neg = (codes[np.uint64(i >> 3)] >> np.uint8(i & 7)) & np.uint8(1)
    v = np.float32(-1.0 if neg else 1.0) * s
    if accumulate:
        out[i] = pos_nan(out[i] + v)
    else:
        out[i] = v


@njit(cache=True, nogil=True)
def _decode_chunk(codes, scales, out, G, accumulate, c0, c1):  # pragma: no cover - jitted
    """Elements [c0, c1) of :func:`sign_decode`: whole bytes of a group give eight outputs at once
    (:func:`put_signs8`), the elements of bytes that a group edge cuts go one by one."""
    for gi in range(c0 // G, (c1 - 1) // G + 1):
        lo = max(gi * G, c0)
        hi = min(gi * G + G, c1)
        s = scales[gi]
        j0 = min((lo + 7) // 8, hi // 8)  # the whole bytes [j0, j1) of [lo, hi)
        j1 = max(hi // 8, j0)
        for i in range(lo, 8 * j0):
            _put_sign(codes, out, i, s, accumulate)
        if accumulate:
            for j in range(j0, j1):
                add_signs8(out, np.uint64(8 * j), codes[np.uint64(j)], s)
        else:
            for j in range(j0, j1):
                put_signs8(out, np.uint64(8 * j), codes[np.uint64(j)], s)
        for i in range(max(8 * j1, lo), hi):
            _put_sign(codes, out, i, s, accumulate)
    return 0


def sign_decode(codes, scales, out, G, accumulate):  # type: ignore[no-untyped-def]
    """out[i] (+)= -s or +s (bit i set or clear), s the scale of element i's group."""
    run_chunks(_decode_chunk, out.shape[0], CHUNK, codes, scales, out, G, accumulate)


@njit(cache=True, inline="always")
def _corrected(x, e, has_e, enew, lo, hi):  # pragma: no cover - jitted
    """enew[lo:hi] = c = float32(x) + e, a NaN sum made positive (format.md §10), or float32(x)
    without a residual."""
    base = np.uint64(lo)
    if has_e:
        for j in range(hi - lo):
            i = base + np.uint64(j)
            enew[i] = pos_nan(np.float32(x[i]) + e[i])
    else:
        for j in range(hi - lo):
            i = base + np.uint64(j)
            enew[i] = np.float32(x[i])


@njit(cache=True, inline="always")
def _residuals(enew, lo, hi, s):  # pragma: no cover - jitted
    """enew[lo:hi] = c - decode(c) = c - (-s if c < 0 else s); returns how many are not finite."""
    base = np.uint64(lo)
    ns = -s
    nonfinite = 0
    for j in range(hi - lo):
        i = base + np.uint64(j)
        c = enew[i]
        r = c - (ns if c < np.float32(0.0) else s)
        enew[i] = r
        nonfinite += not (abs(r) <= np.float32(3.4028234663852886e38))
    return nonfinite


@njit(cache=True, inline="always")
def _feedback_group(x, e, enew, codes, scales, gi, G):  # pragma: no cover - jitted
    """One whole group of ``G`` elements (a literal multiple of 64) with a residual, while it is in
    L1: c = x + e into ``enew``, the lane sum of |c| (qsgd.md §3) and the scale, the bits of c,
    then the residuals in place of c."""
    lo = gi * G
    _corrected(x, e, True, enew, lo, lo + G)
    s, _h, bad = _scale(RULE_MEANABS, np.uint32(0), lane_sum(enew, lo, lo + G, 1), 0.0, G, 1, 0.0, False)
    scales[gi] = s
    _pack_signs(enew, lo, lo + G, codes)
    return bad + _residuals(enew, lo, lo + G, s)


@njit(cache=True)
def _feedback_span(x, e, has_e, enew, codes, scales, G, b0, b1):  # pragma: no cover - jitted
    """Sub-block [b0, b1) of :func:`sign_encode_feedback`, any group size and residual: the same
    steps as :func:`_feedback_group`, each over the whole sub-block."""
    _corrected(x, e, has_e, enew, b0, b1)
    bad = _mean_abs_scales(enew, scales, G, b0, b1)
    _pack_signs(enew, b0, b1, codes)
    n = x.shape[0]
    for gi in range(b0 // G, (b1 - 1) // G + 1):
        bad += _residuals(enew, max(gi * G, b0), min(gi * G + G, n), scales[gi])
    return bad


@njit(cache=True, nogil=True)
def _feedback_chunk(x, e, has_e, enew, codes, scales, G, L, c0, c1):  # pragma: no cover - jitted
    """One chunk of :func:`sign_encode_feedback` (groups no longer than a sub-block)."""
    n = x.shape[0]
    bad = 0
    for b0 in range(c0, c1, L):
        b1 = min(b0 + L, n)
        if G == 256 and has_e and b1 - b0 == L:  # the default, with a residual: literal group size
            for gi in range(b0 // 256, b1 // 256):
                bad += _feedback_group(x, e, enew, codes, scales, gi, 256)
        else:
            bad += _feedback_span(x, e, has_e, enew, codes, scales, G, b0, b1)
    return bad


def sign_encode_feedback(x, e, has_e, enew, codes, scales, G, L, C):  # type: ignore[no-untyped-def]
    """Encode ``c = x + e`` (float32) and write ``enew = c - decode(c)``, in one pass.

    Bit-identical to encoding ``c`` with :func:`sign_encode` and subtracting its decode. Requires
    groups no longer than a sub-block. Returns the number of non-finite groups plus non-finite
    residuals (the caller then discards ``enew``).
    """
    return run_chunks(_feedback_chunk, x.shape[0], C, x, e, has_e, enew, codes, scales, G, L)


def encode(flat: np.ndarray, bits: np.ndarray, scales: np.ndarray, group_size: int) -> int:
    """Run the sign kernels for one tensor; returns the number of groups that could not be encoded."""
    n = flat.size
    if n == 0:
        return 0
    g, sub, chunk, fused = geometry(n, group_size, 64)
    nbad = 0
    if not fused:
        nbad += large_group_scales(flat, scales, _E16, g, RULE_MEANABS, 1, 0.0)
    nbad += sign_encode(flat, bits, scales, g, sub, chunk, fused)
    return nbad


def fuses_feedback(n: int, group_size: int) -> bool:
    """Whether :func:`encode_feedback` applies (each group fits in one sub-block)."""
    return geometry(n, group_size, 64)[3]


def encode_feedback(
    flat: np.ndarray,
    e: np.ndarray,
    has_e: bool,
    new_e: np.ndarray,
    bits: np.ndarray,
    scales: np.ndarray,
    group_size: int,
) -> int:
    """Sign-encode ``flat + e`` and write the new residual into ``new_e`` in one pass (float32, when
    :func:`fuses_feedback`); returns the number of groups or residuals that are not finite."""
    g, sub, chunk, _ = geometry(flat.size, group_size, 64)
    return sign_encode_feedback(flat, e, has_e, new_e, bits, scales, g, sub, chunk)
