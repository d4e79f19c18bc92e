"""1-bit sign compression with a mean-|x| scale per group (specs/codecs/sign.md), fused kernels.

Encoding a sub-block computes each group's scale (the float64 lane sum of |v| divided by the group's
length, rounded to float32) and packs one bit per element, 1 for ``v < 0``, eight elements per
byte, least significant bit first. Decoding writes ``-s`` or ``+s``. :func:`sign_encode_feedback`
fuses error feedback into the same pass: ``c = x + e`` is formed, encoded and its new residual
``c - decode(c)`` written, reading ``x`` and ``e`` once and writing the residual once.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .quant_cpu import CHUNK, RULE_MEANABS, SB, _group_stats, _scale, lane_sum

__all__ = ["sign_decode", "sign_encode", "sign_encode_feedback"]

_E16 = np.empty(0, np.uint16)


@njit(cache=True, inline="always")
def _pack_signs(v, b0, b1, codes):  # pragma: no cover - jitted
    """codes[b0/8 ..] = bits (v_i < 0) of elements [b0, b1), b0 a multiple of 64, LSB first.

    64 elements make one uint64 (an OR-reduction LLVM vectorises), stored as 8 little-endian bytes.
    """
    base = np.uint64(b0)
    o0 = np.uint64(b0 // 8)
    m = b1 - b0
    zero = np.float32(0.0)
    for j in range(m // 64):
        k = base + np.uint64(64 * j)
        word = np.uint64(0)
        for t in range(64):
            word |= np.uint64(np.float32(v[k + np.uint64(t)]) < zero) << np.uint64(t)
        o = o0 + np.uint64(8 * j)
        for t in range(8):
            codes[o + np.uint64(t)] = np.uint8((word >> np.uint64(8 * t)) & np.uint64(0xFF))
    r = m % 64
    if r:
        k = base + np.uint64(m - r)
        word = np.uint64(0)
        for t in range(r):
            word |= np.uint64(np.float32(v[k + np.uint64(t)]) < zero) << np.uint64(t)
        o = o0 + np.uint64(m // 64 * 8)
        for t in range((r + 7) // 8):
            codes[o + np.uint64(t)] = np.uint8((word >> np.uint64(8 * t)) & np.uint64(0xFF))


def _make_lut() -> np.ndarray:
    """LUT[b, t] = -1.0 if bit t of b is set else +1.0."""
    b = np.arange(256, dtype=np.uint32)[:, None] >> np.arange(8, dtype=np.uint32)[None, :]
    return np.where(b & 1, np.float32(-1.0), np.float32(1.0)).astype(np.float32)


_LUT = _make_lut()


@njit(cache=True, inline="always")
def _expand_signs(codes, b0, m, lut, sb):  # pragma: no cover - jitted
    """sb[0:roundup(m, 8)] = +-1.0 for the bits of elements b0 .. (b0 a multiple of 8)."""
    o0 = np.uint64(b0 // 8)
    for j in range((m + 7) // 8):
        b = np.uint64(codes[o0 + np.uint64(j)])
        k = np.uint64(8 * j)
        for t in range(8):
            sb[k + np.uint64(t)] = lut[b, t]


@njit(cache=True)
def _encode_chunk(x, codes, scales, G, L, fused, c0, c1):  # pragma: no cover - jitted
    n = x.shape[0]
    bad = 0
    for b0 in range(c0, c1, L):
        b1 = min(b0 + L, n)
        if fused:
            for gi in range(b0 // G, (b1 - 1) // G + 1):
                lo = gi * G
                hi = min(lo + G, n)
                mb, s1, s2 = _group_stats(x, lo, hi, RULE_MEANABS, 0.0)
                s, _h, isbad = _scale(RULE_MEANABS, mb, s1, s2, hi - lo, 1, 0.0, False)
                scales[gi] = s
                bad += isbad
        _pack_signs(x, b0, b1, codes)
    return bad


@njit(cache=True, parallel=True)
def sign_encode(x, codes, scales, G, L, C, fused):  # pragma: no cover - jitted
    """Bits and (when ``fused``) scales of flat ``x``; returns the number of non-finite groups.

    ``G, L, C, fused`` come from :func:`gcodec.kernels.quant_cpu.geometry`; when not ``fused`` the
    scales must be computed first (``large_group_scales`` with ``RULE_MEANABS``).
    """
    n = x.shape[0]
    nchunks = (n + C - 1) // C
    nbad = 0
    for c in prange(nchunks):
        nbad += _encode_chunk(x, codes, scales, G, L, fused, c * C, min(c * C + C, n))
    return nbad


@njit(cache=True)
def _decode_chunk(codes, scales, out, G, accumulate, lut, c0, c1):  # pragma: no cover - jitted
    sb = np.empty(SB + 8, np.float32)
    for b0 in range(c0, c1, SB):
        b1 = min(b0 + SB, c1)
        if G % 8 == 0 and b1 - b0 == SB:  # groups are whole bytes: expand straight into out
            for gi in range(b0 // G, (b1 - 1) // G + 1):
                lo = max(gi * G, b0)
                hi = min(gi * G + G, b1)
                s = scales[gi]
                o0 = np.uint64(lo // 8)
                for j in range((hi - lo) // 8):
                    b = np.uint64(codes[o0 + np.uint64(j)])
                    k = np.uint64(lo + 8 * j)
                    if accumulate:
                        for t in range(8):
                            out[k + np.uint64(t)] += lut[b, t] * s
                    else:
                        for t in range(8):
                            out[k + np.uint64(t)] = lut[b, t] * s
            continue
        _expand_signs(codes, b0, b1 - b0, lut, sb)
        for gi in range(b0 // G, (b1 - 1) // G + 1):
            lo = max(gi * G, b0)
            hi = min(gi * G + G, b1)
            s = scales[gi]
            base = np.uint64(lo)
            so = np.uint64(lo - b0)
            if accumulate:
                for j in range(hi - lo):
                    jj = np.uint64(j)
                    out[base + jj] += sb[so + jj] * s
            else:
                for j in range(hi - lo):
                    jj = np.uint64(j)
                    out[base + jj] = sb[so + jj] * s


@njit(cache=True, parallel=True)
def sign_decode(codes, scales, out, G, accumulate):  # pragma: no cover - jitted
    """out[i] (+)= -s or +s (bit i set or clear), s the scale of element i's group."""
    n = out.shape[0]
    nchunks = (n + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        _decode_chunk(codes, scales, out, G, accumulate, _LUT, c * CHUNK, min(c * CHUNK + CHUNK, n))


@njit(cache=True, inline="always")
def _feedback_group(x, e, has_e, enew, codes, scales, gi, G):  # pragma: no cover - jitted
    """One whole group whose length G is a multiple of 64, in two passes over it (in L1).

    Pass 1 forms c = x + e into ``enew`` and takes the lane sum of |c| (qsgd.md §3) while the
    group is in L1; then its signs are packed and its residuals written (two more passes in L1). ``has_e`` and ``G``
    are literals at the call sites.
    """
    lo = np.uint64(gi * G)
    if has_e:
        for j in range(G):
            i = lo + np.uint64(j)
            enew[i] = np.float32(x[i]) + e[i]
    else:
        for j in range(G):
            i = lo + np.uint64(j)
            enew[i] = np.float32(x[i])
    total = lane_sum(enew, gi * G, gi * G + G, 1)
    s, _h, bad = _scale(RULE_MEANABS, np.uint32(0), total, 0.0, G, 1, 0.0, False)
    scales[gi] = s
    ns = -s
    _pack_signs(enew, gi * G, gi * G + G, codes)
    zero = np.float32(0.0)
    nonfinite = 0
    for j in range(G):
        i = lo + np.uint64(j)
        c = enew[i]
        r = c - (ns if c < zero else s)
        enew[i] = r
        nonfinite += not (abs(r) <= np.float32(3.4028234663852886e38))
    return bad + nonfinite


@njit(cache=True)
def _feedback_chunk(x, e, has_e, enew, codes, scales, G, L, c0, c1):  # pragma: no cover - jitted
    """One chunk of :func:`sign_encode_feedback` (groups no longer than a sub-block)."""
    n = x.shape[0]
    bad = 0
    for b0 in range(c0, c1, L):
        b1 = min(b0 + L, n)
        if G % 64 == 0 and b1 - b0 == L:  # whole groups of whole words: the two-pass form
            for gi in range(b0 // G, b1 // G):
                if G == 256 and has_e:
                    bad += _feedback_group(x, e, True, enew, codes, scales, gi, 256)
                elif has_e:
                    bad += _feedback_group(x, e, True, enew, codes, scales, gi, G)
                else:
                    bad += _feedback_group(x, e, False, enew, codes, scales, gi, G)
            continue
        base = np.uint64(b0)
        # step 1: the corrected values c = x + e, kept in enew until the residual replaces them
        if has_e:
            for j in range(b1 - b0):
                i = base + np.uint64(j)
                enew[i] = np.float32(x[i]) + e[i]
        else:
            for j in range(b1 - b0):
                i = base + np.uint64(j)
                enew[i] = np.float32(x[i])
        # step 2: scales from c, then the bits of c
        for gi in range(b0 // G, (b1 - 1) // G + 1):
            lo = gi * G
            hi = min(lo + G, n)
            mb, s1, s2 = _group_stats(enew, lo, hi, RULE_MEANABS, 0.0)
            s, _h, isbad = _scale(RULE_MEANABS, mb, s1, s2, hi - lo, 1, 0.0, False)
            scales[gi] = s
            bad += isbad
        _pack_signs(enew, b0, b1, codes)
        # step 3: the residual c - decode(c), and whether any is NaN or infinite
        for gi in range(b0 // G, (b1 - 1) // G + 1):
            lo = gi * G
            hi = min(lo + G, n)
            s = scales[gi]
            ns = -s
            gb = np.uint64(lo)
            nonfinite = 0
            for j in range(hi - lo):
                i = gb + np.uint64(j)
                c = enew[i]
                r = c - (ns if c < np.float32(0.0) else s)
                enew[i] = r
                nonfinite += not (abs(r) <= np.float32(3.4028234663852886e38))
            bad += nonfinite
    return bad


@njit(cache=True, parallel=True)
def sign_encode_feedback(x, e, has_e, enew, codes, scales, G, L, C):  # pragma: no cover - jitted
    """Encode ``c = x + e`` (float32) and write ``enew = c - decode(c)``, in one pass.

    Bit-identical to encoding ``c`` with :func:`sign_encode` and subtracting its decode. Requires
    groups no longer than a sub-block. Returns the number of non-finite groups plus non-finite
    residuals (the caller then discards ``enew``).
    """
    n = x.shape[0]
    nchunks = (n + C - 1) // C
    nbad = 0
    for c in prange(nchunks):
        nbad += _feedback_chunk(x, e, has_e, enew, codes, scales, G, L, c * C, min(c * C + C, n))
    return nbad
