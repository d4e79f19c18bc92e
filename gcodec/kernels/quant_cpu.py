"""Scaled integer quantizers on the CPU: ``uniform``, ``qsgd`` and ``terngrad`` share these kernels.

All three codecs have the same shape (specs/codecs/uniform.md, qsgd.md, terngrad.md):

1. every group of ``G`` consecutive elements gets one float32 scale ``s`` from a statistic of the
   group (absmax / qmax for ``uniform``, L2 norm / levels for ``qsgd``, absmax or the clipped
   absmax for ``terngrad``);
2. every element becomes an integer code ``q`` in ``[-qmax, qmax]``: ``t = clamp(v / s)``, then
   ``q = rint(t)`` (nearest) or ``q = floor(t) + [u < t - floor(t)]`` (stochastic, ``u`` from
   one 16-bit Philox draw per element, specs/rng.md);
3. codes are stored as ``w``-bit two's complement in a little-endian bit stream (element ``i`` at
   bits ``[i*w, (i+1)*w)``);
4. decoding is ``float32(q) * s``.

Speed comes from the memory pattern and from letting LLVM vectorise every inner loop:

* work is split into sub-blocks of about :data:`SB` elements (plus their random draws and codes,
  they sit in L1); for small groups one sub-block holds whole groups, and the statistic pass and
  the quantize pass run over it back to back, so the input is read from memory once;
* inner loops index with unsigned integers (Numba then emits no negative-index wraparound, which
  otherwise hides the access pattern from the vectoriser) and have no calls or branches;
* the absmax is an integer max over ``bits & 0x7FFFFFFF`` (the same order as ``|v|`` for floats,
  and NaN/inf show up as values >= 0x7F800000, so one vectorised reduction also finds them);
* sums (for the L2 norm, mean |x|, and the standard deviation) use eight lanes of float64 in a
  fixed order (:func:`lane_sum`), so they vectorise and are still bit-exact on every backend.

Parallel tasks are chunks of whole sub-blocks; nothing depends on the number of threads.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..rng import fill_blocks, key_schedule, u16_to_open01
from .cast_cpu import f16_bits_to_f32, f32_to_f16_bits

__all__ = [
    "CHUNK",
    "RBLOCK",
    "RULE_ABSMAX",
    "RULE_L2",
    "RULE_MAX",
    "RULE_MEANABS",
    "SB",
    "count_bad",
    "geometry",
    "lane_sum",
    "large_group_scales",
    "scaled_decode",
    "scaled_encode",
]

SB = 2048  # elements per sub-block
CHUNK = 1 << 16  # target elements per parallel task
RBLOCK = 1 << 16  # sums over longer ranges are taken per block of this many elements (spec)

RULE_ABSMAX = 0  # s = absmax / qmax                       (uniform)
RULE_L2 = 1  # s = float32(sqrt(sum v^2)) / levels          (qsgd)
RULE_MAX = 2  # s = absmax, or min(absmax, c * sigma)       (terngrad)
RULE_MEANABS = 3  # s = float32(sum |v| / count)             (sign)

_ABS = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)
_F16_INF = np.uint16(0x7C00)
_U1 = np.uint64(1)
_U2 = np.uint64(2)
_U3 = np.uint64(3)
_U4 = np.uint64(4)
_U5 = np.uint64(5)
_U6 = np.uint64(6)
_U7 = np.uint64(7)
_U8 = np.uint64(8)


def geometry(n: int, group_size: int, align: int = 8) -> tuple[int, int, int, bool]:
    """(G, L, C, fused): effective group size, sub-block length, chunk length, and whether the
    statistics are computed inside the sub-block loop.

    ``group_size == 0`` means one group for the whole tensor. ``L`` and ``C`` are multiples of
    ``align`` (8: every sub-block starts on a byte boundary of the packed codes whatever the code
    width). Statistics are fused when a sub-block can hold whole groups and still stay small
    (at most 8 * SB elements); ``L`` is then also a multiple of ``G``.
    """
    g = group_size if group_size > 0 else max(n, 1)
    sub, fused = SB, False
    if g <= SB:
        step = align // math.gcd(g, align)
        m = max(step, (SB // g) // step * step)
        if m * g <= 8 * SB:
            sub, fused = m * g, True
    return g, sub, sub * max(1, CHUNK // sub), fused


# --------------------------------------------------------------------------------------------
# statistics


@njit(cache=True, inline="always")
def absmax_bits(x, lo, hi):  # pragma: no cover - jitted
    """max over [lo, hi) of the float32 bits of |v|: >= 0x7F800000 iff a NaN or infinity is there."""
    m = np.uint32(0)
    base = np.uint64(lo)
    for j in range(hi - lo):
        a = np.float32(x[base + np.uint64(j)]).view(np.uint32) & _ABS
        m = a if a > m else m
    return m


@njit(cache=True)
def _term(v, kind):  # pragma: no cover - jitted
    d = np.float64(np.float32(v))
    if kind == 0:
        return d * d
    if kind == 1:
        return abs(d)
    return d


@njit(cache=True)
def lane_sum(x, lo, hi, kind):  # pragma: no cover - jitted
    """The lane sum of specs/codecs/qsgd.md §3 over [lo, hi) (at most RBLOCK elements).

    ``kind`` 0: v^2, 1: |v|, 2: v, each term exact in float64. Lane ``j`` adds the terms of
    elements ``lo + j, lo + j + 8, ...`` in order starting from +0; the lanes are then added as
    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
    """
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    a4 = 0.0
    a5 = 0.0
    a6 = 0.0
    a7 = 0.0
    m = hi - lo
    base = np.uint64(lo)
    for k in range(m // 8):
        i = base + np.uint64(8 * k)
        a0 += _term(x[i], kind)
        a1 += _term(x[i + _U1], kind)
        a2 += _term(x[i + _U2], kind)
        a3 += _term(x[i + _U3], kind)
        a4 += _term(x[i + _U4], kind)
        a5 += _term(x[i + _U5], kind)
        a6 += _term(x[i + _U6], kind)
        a7 += _term(x[i + _U7], kind)
    r = m % 8
    i = base + np.uint64(m - r)
    if r > 0:
        a0 += _term(x[i], kind)
    if r > 1:
        a1 += _term(x[i + _U1], kind)
    if r > 2:
        a2 += _term(x[i + _U2], kind)
    if r > 3:
        a3 += _term(x[i + _U3], kind)
    if r > 4:
        a4 += _term(x[i + _U4], kind)
    if r > 5:
        a5 += _term(x[i + _U5], kind)
    if r > 6:
        a6 += _term(x[i + _U6], kind)
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@njit(cache=True, inline="always")
def _scale(rule, mbits, s1, s2, count, qmax, clip, f16):  # pragma: no cover - jitted
    """(float32 scale, its float16 bits when ``f16``, bad) from a group's statistics."""
    bad = False
    if rule == RULE_L2:
        bad = not (abs(s2) <= 1.7976931348623157e308)
        s = np.float32(np.sqrt(s2)) / np.float32(qmax)
    elif rule == RULE_MEANABS:
        bad = not (abs(s1) <= 1.7976931348623157e308)
        s = np.float32(s1 / np.float64(count))
    else:
        bad = mbits >= _INF_BITS
        amax = np.uint32(mbits).view(np.float32)
        if rule == RULE_ABSMAX:
            s = amax / np.float32(qmax)
        else:
            s = amax
            if clip > 0.0:
                mean = s1 / np.float64(count)
                var = s2 / np.float64(count) - mean * mean
                var = var if var > 0.0 else 0.0
                t = np.float32(clip * np.sqrt(var))
                s = t if t < s else s
    h = np.uint16(0)
    if f16 and not bad:
        h = f32_to_f16_bits(s)
        if f16_bits_to_f32(h) < s:
            h = np.uint16(h + np.uint16(1))
        if h >= _F16_INF:
            bad = True
            h = _F16_INF
        s = f16_bits_to_f32(h)
    if bad:
        s = np.float32(0.0)
    return s, h, bad


@njit(cache=True)
def _group_stats(x, lo, hi, rule, clip):  # pragma: no cover - jitted
    """(absmax bits, sum v, sum v^2) of one range of at most RBLOCK elements, as the rule needs."""
    mb = np.uint32(0)
    s1 = 0.0
    s2 = 0.0
    if rule == RULE_L2:
        s2 = lane_sum(x, lo, hi, 0)
    elif rule == RULE_MEANABS:
        s1 = lane_sum(x, lo, hi, 1)
    elif rule == RULE_MAX and clip > 0.0:
        mb, s1, s2 = _max_and_sums(x, lo, hi)
    else:
        mb = absmax_bits(x, lo, hi)
    return mb, s1, s2


@njit(cache=True, inline="always")
def _acc3(v, m, p, q):  # pragma: no cover - jitted
    f = np.float32(v)
    a = f.view(np.uint32) & _ABS
    d = np.float64(f)
    return (a if a > m else m), p + d, q + d * d


@njit(cache=True)
def _max_and_sums(x, lo, hi):  # pragma: no cover - jitted
    """absmax bits, lane sum of v and lane sum of v^2 of [lo, hi) in one pass (terngrad's clip).

    The lanes and their order are exactly those of :func:`lane_sum`; written out in scalars so
    that LLVM keeps them in registers and vectorises.
    """
    m = np.uint32(0)
    p0 = 0.0
    q0 = 0.0
    p1 = 0.0
    q1 = 0.0
    p2 = 0.0
    q2 = 0.0
    p3 = 0.0
    q3 = 0.0
    p4 = 0.0
    q4 = 0.0
    p5 = 0.0
    q5 = 0.0
    p6 = 0.0
    q6 = 0.0
    p7 = 0.0
    q7 = 0.0
    m0 = m
    m1 = m
    m2 = m
    m3 = m
    m4 = m
    m5 = m
    m6 = m
    m7 = m
    nfull = (hi - lo) // 8
    base = np.uint64(lo)
    for k in range(nfull):
        i = base + np.uint64(8 * k)
        m0, p0, q0 = _acc3(x[i], m0, p0, q0)
        m1, p1, q1 = _acc3(x[i + _U1], m1, p1, q1)
        m2, p2, q2 = _acc3(x[i + _U2], m2, p2, q2)
        m3, p3, q3 = _acc3(x[i + _U3], m3, p3, q3)
        m4, p4, q4 = _acc3(x[i + _U4], m4, p4, q4)
        m5, p5, q5 = _acc3(x[i + _U5], m5, p5, q5)
        m6, p6, q6 = _acc3(x[i + _U6], m6, p6, q6)
        m7, p7, q7 = _acc3(x[i + _U7], m7, p7, q7)
    i = base + np.uint64(8 * nfull)
    r = hi - lo - 8 * nfull
    if r > 0:
        m0, p0, q0 = _acc3(x[i], m0, p0, q0)
    if r > 1:
        m1, p1, q1 = _acc3(x[i + _U1], m1, p1, q1)
    if r > 2:
        m2, p2, q2 = _acc3(x[i + _U2], m2, p2, q2)
    if r > 3:
        m3, p3, q3 = _acc3(x[i + _U3], m3, p3, q3)
    if r > 4:
        m4, p4, q4 = _acc3(x[i + _U4], m4, p4, q4)
    if r > 5:
        m5, p5, q5 = _acc3(x[i + _U5], m5, p5, q5)
    if r > 6:
        m6, p6, q6 = _acc3(x[i + _U6], m6, p6, q6)
    for mm in (m1, m2, m3, m4, m5, m6, m7):
        m0 = mm if mm > m0 else m0
    s1 = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))
    s2 = ((q0 + q1) + (q2 + q3)) + ((q4 + q5) + (q6 + q7))
    return m0, s1, s2


@njit(cache=True)
def _block_stats(x, lo, hi, rule, clip, bm, b1, b2, b):  # pragma: no cover - jitted
    m, s1, s2 = _group_stats(x, lo, hi, rule, clip)
    bm[b] = m
    b1[b] = s1
    b2[b] = s2


@njit(cache=True, parallel=True)
def large_group_scales(x, sc32, sc16, G, rule, qmax, clip):  # pragma: no cover - jitted
    """Scales of groups longer than a sub-block. Returns the number of non-finite groups.

    Each group is cut into blocks of RBLOCK elements from its start; blocks are reduced in
    parallel and combined per group left to right (max, and float64 sums as the spec orders them).
    """
    n = x.shape[0]
    ngroups = sc32.shape[0]
    f16 = sc16.shape[0] > 0
    nbpg = (G + RBLOCK - 1) // RBLOCK
    nblocks = ngroups * nbpg
    bm = np.zeros(nblocks, np.uint32)
    b1 = np.zeros(nblocks, np.float64)
    b2 = np.zeros(nblocks, np.float64)
    for b in prange(nblocks):
        gi = b // nbpg
        lo = gi * G + (b - gi * nbpg) * RBLOCK
        hi = min(lo + RBLOCK, min(gi * G + G, n))
        if lo < hi:
            _block_stats(x, lo, hi, rule, clip, bm, b1, b2, b)
    nbad = 0
    for gi in range(ngroups):
        m = bm[gi * nbpg]
        s1 = b1[gi * nbpg]
        s2 = b2[gi * nbpg]
        for k in range(1, nbpg):
            b = gi * nbpg + k
            m = bm[b] if bm[b] > m else m
            s1 = s1 + b1[b]
            s2 = s2 + b2[b]
        count = min(gi * G + G, n) - gi * G
        s, h, bad = _scale(rule, m, s1, s2, count, qmax, clip, f16)
        sc32[gi] = s
        if f16:
            sc16[gi] = h
        nbad += bad
    return nbad


# --------------------------------------------------------------------------------------------
# quantize and pack


@njit(cache=True, inline="always")
def _quant_nearest(x, lo, hi, s, qmax, dst, d0):  # pragma: no cover - jitted
    """dst[d0 + (i - lo)] = low byte of clamp(rint(v_i / s), -qmax, qmax) for i in [lo, hi)."""
    base = np.uint64(lo)
    o = np.uint64(d0)
    if s == np.float32(0.0):
        for j in range(hi - lo):
            dst[o + np.uint64(j)] = np.uint8(0)
        return
    q = np.float32(qmax)
    for j in range(hi - lo):
        t = np.float32(x[base + np.uint64(j)]) / s
        t = min(max(t, -q), q)
        dst[o + np.uint64(j)] = np.uint8(np.int32(np.rint(t)) & 0xFF)


@njit(cache=True, inline="always")
def _quant_stochastic(x, lo, hi, s, qmax, r16, r0, dst, d0):  # pragma: no cover - jitted
    """dst[d0 + (i - lo)] = low byte of floor(t) + [u_i < t - floor(t)], t = clamp(v_i / s)."""
    base = np.uint64(lo)
    o = np.uint64(d0)
    ro = np.uint64(r0)
    if s == np.float32(0.0):
        for j in range(hi - lo):
            dst[o + np.uint64(j)] = np.uint8(0)
        return
    q = np.float32(qmax)
    for j in range(hi - lo):
        jj = np.uint64(j)
        t = np.float32(x[base + jj]) / s
        t = min(max(t, -q), q)
        fl = np.floor(t)
        up = u16_to_open01(r16[ro + jj]) < t - fl
        dst[o + jj] = np.uint8((np.int32(fl) + np.int32(up)) & 0xFF)


@njit(cache=True)
def _pack(cb, m, w, codes, b0, t16, t32, t64):  # pragma: no cover - jitted
    """Pack codes cb[0:m] (low ``w`` bits of each, zeros after m) into ``codes`` from element ``b0``.

    ``t16``, ``t32``, ``t64``: scratch of at least m/2, m/4, m/8 (rounded up) elements.
    """
    o0 = np.uint64(b0 // 8 * w)
    nb = (m * w + 7) // 8
    if w == 4:
        for j in range(nb):
            k = np.uint64(2 * j)
            codes[o0 + np.uint64(j)] = (cb[k] & np.uint8(15)) | (cb[k + _U1] << np.uint8(4))
    elif w == 2:
        for j in range(nb):
            k = np.uint64(4 * j)
            codes[o0 + np.uint64(j)] = (
                (cb[k] & np.uint8(3))
                | ((cb[k + _U1] & np.uint8(3)) << np.uint8(2))
                | ((cb[k + _U2] & np.uint8(3)) << np.uint8(4))
                | (cb[k + _U3] << np.uint8(6))
            )
    elif w == 3:
        _pack_octets(cb, m, 3, codes, o0, t16, t32, t64)
    elif w == 5:
        _pack_octets(cb, m, 5, codes, o0, t16, t32, t64)
    elif w == 6:
        _pack_octets(cb, m, 6, codes, o0, t16, t32, t64)
    else:
        _pack_octets(cb, m, 7, codes, o0, t16, t32, t64)


@njit(cache=True, inline="always")
def _pack_octets(cb, m, w, codes, o0, t16, t32, t64):  # pragma: no cover - jitted
    """Eight ``w``-bit codes make ``w`` bytes; ``w`` is a literal at each call so LLVM unrolls.

    Staged so that the first three steps vectorise (each joins neighbours, as in a tree): pairs
    into 2w-bit, then 4w-bit, then 8w-bit fields; the last step copies the w low bytes of each
    8-byte word. ``cb`` must hold zeros from ``m`` up to a multiple of 8.
    """
    n8 = (m + 7) // 8
    mask = np.uint16((1 << w) - 1)
    for j in range(4 * n8):
        k = np.uint64(2 * j)
        t16[np.uint64(j)] = (np.uint16(cb[k]) & mask) | ((np.uint16(cb[k + _U1]) & mask) << np.uint16(w))
    for j in range(2 * n8):
        k = np.uint64(2 * j)
        t32[np.uint64(j)] = np.uint32(t16[k]) | (np.uint32(t16[k + _U1]) << np.uint32(2 * w))
    for j in range(n8):
        k = np.uint64(2 * j)
        t64[np.uint64(j)] = np.uint64(t32[k]) | (np.uint64(t32[k + _U1]) << np.uint64(4 * w))
    b8 = t64.view(np.uint8)
    for k in range(m // 8):
        o = o0 + np.uint64(k * w)
        kk = np.uint64(8 * k)
        for t in range(w):
            codes[o + np.uint64(t)] = b8[kk + np.uint64(t)]
    r = m % 8
    if r:
        o = o0 + np.uint64(m // 8 * w)
        kk = np.uint64(8 * (m // 8))
        for t in range((r * w + 7) // 8):
            codes[o + np.uint64(t)] = b8[kk + np.uint64(t)]


@njit(cache=True, inline="always")
def _sub_block(
    x,
    codes,
    cb,
    rb,
    r16,
    t16,
    t32,
    t64,
    sc32,
    sc16,
    G,
    full,
    b0,
    b1,
    fused,
    w,
    qmax,
    rule,
    stochastic,
    clip,
    f16,
    st_lo,
    st_hi,
    ks,
):  # pragma: no cover - jitted
    """One sub-block [b0, b1): statistics and scales (when fused), draws, quantize, pack.

    ``full`` (a literal at the call site) says the sub-block holds only whole groups, and ``G`` may
    be a literal too: then every group loop has a constant trip count and LLVM unrolls it.
    """
    n = x.shape[0]
    bad = 0
    g0 = b0 // G
    g1 = (b1 - 1) // G + 1
    if fused and (rule == RULE_ABSMAX or (rule == RULE_MAX and clip == 0.0)):
        # the max-only rules get a loop of their own: no calls in it, so LLVM keeps it tight
        for gi in range(g0, g1):
            lo = gi * G
            hi = lo + G if full else min(lo + G, n)
            mb = absmax_bits(x, lo, hi)
            s, h, isbad = _scale(rule, mb, 0.0, 0.0, hi - lo, qmax, clip, f16)
            sc32[gi] = s
            if f16:
                sc16[gi] = h
            bad += isbad
    elif fused:
        for gi in range(g0, g1):
            lo = gi * G
            hi = lo + G if full else min(lo + G, n)
            mb, s1, s2 = _group_stats(x, lo, hi, rule, clip)
            s, h, isbad = _scale(rule, mb, s1, s2, hi - lo, qmax, clip, f16)
            sc32[gi] = s
            if f16:
                sc16[gi] = h
            bad += isbad
    if stochastic:
        fill_blocks(rb, b0 // 8, (b1 - b0 + 7) // 8, st_lo, st_hi, ks)
    for gi in range(g0, g1):
        lo = gi * G if full else max(gi * G, b0)
        hi = lo + G if full else min(gi * G + G, b1)
        s = sc32[gi]
        if w == 8:
            if stochastic:
                _quant_stochastic(x, lo, hi, s, qmax, r16, lo - b0, codes, lo)
            else:
                _quant_nearest(x, lo, hi, s, qmax, codes, lo)
        elif stochastic:
            _quant_stochastic(x, lo, hi, s, qmax, r16, lo - b0, cb, lo - b0)
        else:
            _quant_nearest(x, lo, hi, s, qmax, cb, lo - b0)
    if w != 8:
        m = b1 - b0
        for j in range(m, m + 8):
            cb[j] = 0
        _pack(cb, m, w, codes, b0, t16, t32, t64)
    return bad


@njit(cache=True)
def _encode_chunk(
    x, codes, sc32, sc16, G, L, fused, w, qmax, rule, stochastic, clip, st_lo, st_hi, ks, c0, c1
):  # pragma: no cover - jitted
    """Elements [c0, c1) (c0 a multiple of L) of :func:`scaled_encode`; returns its bad-group count."""
    n = x.shape[0]
    f16 = sc16.shape[0] > 0
    cb = np.zeros(L + 8, np.uint8)
    rb = np.empty(L // 2 + 4, np.uint32)
    r16 = rb.view(np.uint16)
    t16 = np.empty(L // 2 + 8, np.uint16)
    t32 = np.empty(L // 4 + 8, np.uint32)
    t64 = np.empty(L // 8 + 8, np.uint64)
    bad = 0
    for b0 in range(c0, c1, L):
        b1 = min(b0 + L, n)
        if fused and b1 - b0 == L and G == 64:  # the default group size: constant trip counts
            bad += _sub_block(
                x,
                codes,
                cb,
                rb,
                r16,
                t16,
                t32,
                t64,
                sc32,
                sc16,
                64,
                True,
                b0,
                b1,
                True,
                w,
                qmax,
                rule,
                stochastic,
                clip,
                f16,
                st_lo,
                st_hi,
                ks,
            )
        else:
            bad += _sub_block(
                x,
                codes,
                cb,
                rb,
                r16,
                t16,
                t32,
                t64,
                sc32,
                sc16,
                G,
                False,
                b0,
                b1,
                fused,
                w,
                qmax,
                rule,
                stochastic,
                clip,
                f16,
                st_lo,
                st_hi,
                ks,
            )
    return bad


@njit(cache=True, parallel=True)
def scaled_encode(
    x, codes, sc32, sc16, G, L, C, fused, w, qmax, rule, stochastic, clip, seed_lo, seed_hi, st_lo, st_hi
):  # pragma: no cover - jitted
    """Quantize flat ``x`` into ``w``-bit packed ``codes``; see the module docstring.

    ``G, L, C, fused`` come from :func:`geometry`. When ``fused`` (groups no longer than a
    sub-block) the scales are computed here into ``sc32`` (and their float16 bits into ``sc16``
    when that is not empty); otherwise they must already be there (:func:`large_group_scales`).
    Returns the number of non-finite groups found here.
    """
    n = x.shape[0]
    ks = key_schedule(seed_lo, seed_hi)
    nchunks = (n + C - 1) // C
    nbad = 0
    for c in prange(nchunks):
        nbad += _encode_chunk(
            x,
            codes,
            sc32,
            sc16,
            G,
            L,
            fused,
            w,
            qmax,
            rule,
            stochastic,
            clip,
            st_lo,
            st_hi,
            ks,
            c * C,
            min(c * C + C, n),
        )
    return nbad


# --------------------------------------------------------------------------------------------
# unpack and decode


@njit(cache=True)
def _unpack(codes, b0, m, w, qb):  # pragma: no cover - jitted
    """qb[0:m] = the sign-extended ``w``-bit codes of elements b0 .. b0+m-1 (b0 a multiple of 8)."""
    o0 = np.uint64(b0 // 8 * w)
    if w == 8:
        for j in range(m):
            qb[np.uint64(j)] = np.int8(codes[o0 + np.uint64(j)])
    elif w == 4:
        for j in range((m + 1) // 2):
            u = np.int32(codes[o0 + np.uint64(j)])
            k = np.uint64(2 * j)
            qb[k] = np.int8(((u & 15) ^ 8) - 8)
            qb[k + _U1] = np.int8(((u >> 4) ^ 8) - 8)
    elif w == 2:
        for j in range((m + 3) // 4):
            u = np.int32(codes[o0 + np.uint64(j)])
            k = np.uint64(4 * j)
            qb[k] = np.int8(((u & 3) ^ 2) - 2)
            qb[k + _U1] = np.int8((((u >> 2) & 3) ^ 2) - 2)
            qb[k + _U2] = np.int8((((u >> 4) & 3) ^ 2) - 2)
            qb[k + _U3] = np.int8(((u >> 6) ^ 2) - 2)
    elif w == 3:
        _unpack_octets(codes, o0, m, 3, qb)
    elif w == 5:
        _unpack_octets(codes, o0, m, 5, qb)
    elif w == 6:
        _unpack_octets(codes, o0, m, 6, qb)
    else:
        _unpack_octets(codes, o0, m, 7, qb)


@njit(cache=True, inline="always")
def _unpack_octets(codes, o0, m, w, qb):  # pragma: no cover - jitted
    """``w`` bytes hold eight codes; ``w`` is a literal at each call. Writes qb[0 : roundup(m, 8)]."""
    mask = np.int64((1 << w) - 1)
    half = np.int64(1 << (w - 1))
    for k in range(m // 8):
        o = o0 + np.uint64(k * w)
        acc = np.int64(0)
        for t in range(w):
            acc |= np.int64(codes[o + np.uint64(t)]) << np.int64(8 * t)
        kk = np.uint64(8 * k)
        for t in range(8):
            qb[kk + np.uint64(t)] = np.int8((((acc >> np.int64(w * t)) & mask) ^ half) - half)
    r = m % 8
    if r:
        o = o0 + np.uint64(m // 8 * w)
        acc = np.int64(0)
        for t in range((r * w + 7) // 8):
            acc |= np.int64(codes[o + np.uint64(t)]) << np.int64(8 * t)
        kk = np.uint64(m - r)
        for t in range(8):
            qb[kk + np.uint64(t)] = np.int8((((acc >> np.int64(w * t)) & mask) ^ half) - half)


@njit(cache=True, inline="always")
def _count_out_of_range(qb, m, qmax):  # pragma: no cover - jitted
    bad = 0
    for j in range(m):
        q = np.int32(qb[np.uint64(j)])
        bad += (q > qmax) | (q < -qmax)
    return bad


@njit(cache=True, inline="always")
def _decode_groups(codes, sc32, sc16, out, G, full, b0, b1, w, qmax, accumulate, f16, qb):  # pragma: no cover - jitted
    """out[i] (+)= float32(q_i) * s for the groups of [b0, b1); returns the out-of-range count.

    8-bit codes are read in place; narrower ones come from ``qb`` (unpacked by the caller).
    ``G`` and ``full`` may be literals (constant trip counts).
    """
    bad = 0
    g0 = b0 // G
    g1 = (b1 - 1) // G + 1
    for gi in range(g0, g1):
        lo = gi * G if full else max(gi * G, b0)
        hi = lo + G if full else min(gi * G + G, b1)
        s = f16_bits_to_f32(sc16[gi]) if f16 else sc32[gi]
        base = np.uint64(lo)
        qo = np.uint64(lo - b0)
        for j in range(hi - lo):
            jj = np.uint64(j)
            q = np.int32(np.int8(codes[base + jj])) if w == 8 else np.int32(qb[qo + jj])
            bad += (q > qmax) | (q < -qmax)
            if accumulate:
                out[base + jj] += np.float32(q) * s
            else:
                out[base + jj] = np.float32(q) * s
    return bad


@njit(cache=True, inline="always")
def _decode_groups_packed(codes, sc32, sc16, out, G, b0, b1, w, qmax, accumulate, f16):  # pragma: no cover - jitted
    """4- or 2-bit codes of whole groups (G a multiple of 8/w, a literal): one code byte gives
    8/w outputs, written as neighbours (LLVM interleaves them), with no intermediate buffer."""
    bad = 0
    per = 8 // w
    mask = np.int32((1 << w) - 1)
    half = np.int32(1 << (w - 1))
    for gi in range(b0 // G, b1 // G):
        s = f16_bits_to_f32(sc16[gi]) if f16 else sc32[gi]
        base = np.uint64(gi * G)
        o0 = np.uint64(gi * G // per)
        for j in range(G // per):
            u = np.int32(codes[o0 + np.uint64(j)])
            k = base + np.uint64(per * j)
            for t in range(per):
                q = ((u >> np.int32(w * t)) & mask ^ half) - half
                bad += (q > qmax) | (q < -qmax)
                if accumulate:
                    out[k + np.uint64(t)] += np.float32(q) * s
                else:
                    out[k + np.uint64(t)] = np.float32(q) * s
    return bad


@njit(cache=True)
def _decode_chunk(codes, sc32, sc16, out, G, w, qmax, accumulate, c0, c1):  # pragma: no cover - jitted
    f16 = sc16.shape[0] > 0
    qb = np.zeros(SB + 8, np.int8)
    bad = 0
    for b0 in range(c0, c1, SB):
        b1 = min(b0 + SB, c1)
        if G == 64 and b1 - b0 == SB and w == 4:  # sub-blocks of whole default groups: literal sizes
            bad += _decode_groups_packed(codes, sc32, sc16, out, 64, b0, b1, 4, qmax, accumulate, f16)
        elif G == 64 and b1 - b0 == SB and w == 2:
            bad += _decode_groups_packed(codes, sc32, sc16, out, 64, b0, b1, 2, qmax, accumulate, f16)
        elif G == 64 and b1 - b0 == SB and w == 8:
            bad += _decode_groups(codes, sc32, sc16, out, 64, True, b0, b1, 8, qmax, accumulate, f16, qb)
        else:
            if w != 8:
                _unpack(codes, b0, b1 - b0, w, qb)
            bad += _decode_groups(codes, sc32, sc16, out, G, False, b0, b1, w, qmax, accumulate, f16, qb)
    return bad


@njit(cache=True, parallel=True)
def scaled_decode(codes, sc32, sc16, out, G, w, qmax, accumulate):  # pragma: no cover - jitted
    """out[i] (+)= float32(q_i) * s_{i // G}; returns how many codes lie outside [-qmax, qmax].

    ``sc16``, when not empty, holds the scales as float16 bits (and ``sc32`` is ignored).
    """
    n = out.shape[0]
    nchunks = (n + CHUNK - 1) // CHUNK
    nbad = 0
    for c in prange(nchunks):
        nbad += _decode_chunk(codes, sc32, sc16, out, G, w, qmax, accumulate, c * CHUNK, min(c * CHUNK + CHUNK, n))
    return nbad


@njit(cache=True, inline="always")
def _count_bytes(codes, c0, c1, w, qmax):  # pragma: no cover - jitted
    """Out-of-range codes among elements [c0, c1) of 8/4/2-bit codes; ``w`` is a literal."""
    per = 8 // w
    mask = np.int32((1 << w) - 1)
    half = np.int32(1 << (w - 1))
    o0 = np.uint64(c0 // per)
    bad = 0
    for j in range((c1 - c0 + per - 1) // per):
        u = np.int32(codes[o0 + np.uint64(j)])
        for t in range(per):
            q = ((u >> np.int32(w * t)) & mask ^ half) - half
            bad += (q > qmax) | (q < -qmax)
    return bad


@njit(cache=True)
def _count_chunk(codes, w, qmax, c0, c1):  # pragma: no cover - jitted
    bad = 0
    # whole bytes, field by field (the padding codes of the last byte are 0: checked before this)
    if w == 8:
        return _count_bytes(codes, c0, c1, 8, qmax)
    if w == 4:
        return _count_bytes(codes, c0, c1, 4, qmax)
    if w == 2:
        return _count_bytes(codes, c0, c1, 2, qmax)
    qb = np.zeros(SB + 8, np.int8)
    for b0 in range(c0, c1, SB):
        m = min(b0 + SB, c1) - b0
        _unpack(codes, b0, m, w, qb)
        bad += _count_out_of_range(qb, m, qmax)
    return bad


@njit(cache=True, parallel=True)
def count_bad(codes, n, w, qmax):  # pragma: no cover - jitted
    """How many of the first ``n`` ``w``-bit codes lie outside [-qmax, qmax]."""
    nchunks = (n + CHUNK - 1) // CHUNK
    nbad = 0
    for c in prange(nchunks):
        nbad += _count_chunk(codes, w, qmax, c * CHUNK, min(c * CHUNK + CHUNK, n))
    return nbad
