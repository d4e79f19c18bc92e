"""Low-precision element formats on the CPU: ``fp8``, ``mx`` and ``nvfp4`` (specs/codecs/fp8.md, mx.md, nvfp4.md).

One pass per sub-block of whole groups (about :data:`SB` elements, so it stays in L1): the groups'
largest magnitudes (an integer max over ``bits & 0x7FFFFFFF``; NaN and infinity show up as values
>= 0x7F800000), their scales (a loop over groups, vectorised), then every element rounded into the
element format and packed.

Groups of 16 and 32 elements go 16 groups at a time where they can, in straight-line
vector code from :mod:`.simd`: the largest magnitudes by :func:`~.simd.block_amax16` (16 lane-wise
reductions and one transposing tree instead of 16 horizontal ones); with nearest rounding the
scaling and rounding of the 16 groups by :func:`~.simd.round_groups16`, one code per byte (4- and
6-bit codes are packed after); with stochastic rounding, for the divided scales (binary32 scales,
NVFP4), the quotients ``v / s`` by :func:`~.simd.div_groups16` into a sub-block buffer that one flat
loop then rounds with its draws. A loop per group of 16 or 32 elements spent as long on its set-up
as on its elements; the replacements compute the same bits as the per-group loops that remain for
the last groups of a sub-block, for other group sizes and for E8M0 scales whose power of two is
not a normal binary32 number.

The element loops run on 32-bit lanes (eight elements per AVX2 instruction) without branches:

* the scaled value ``t`` is one binary32 number: ``v / s`` where the spec divides (binary32 scales,
  NVFP4's block scales), ``v * 2^(127 - e)`` for an E8M0 scale (exact wherever it matters, see
  :func:`_encode_range`'s comment);
* nearest-even rounding of ``t`` (:func:`_near32`) is one binary32 addition that rounds at the
  format's quantum, as the fp16 encoder of ``cast.py`` does; MXINT8 is ``rint`` of ``t * 64``;
* stochastic rounding (:func:`_sto32`) is integer arithmetic on the bits of ``t``, exact.

The int64 routine :func:`_mag_code` (exact for any power-of-two scale, including quotients below
the binary32 range) serves the rare E8M0 scales whose power of two is not a normal binary32 number.
It states the rounding of mx.md §6 most directly:

* a finite magnitude ``a = S * 2^(e - 23)`` (``S`` the 24-bit significand, normalised also for
  binary32 subnormals) divided by the power of two ``2^k`` has the exponent ``et = e - k``;
* in the element format its quantum is ``2^qe`` with ``qe = max(et, emin) - mbits`` (``-6`` for the
  integer format), so the quotient in quanta is ``S >> shift`` plus the fraction
  ``rem / 2^shift``, ``shift = 23 + qe - et``;
* nearest-even adds one when ``rem`` is above half, or exactly half with an odd quotient;
  stochastic adds one when ``(2r + 1) / 2^17 < rem / 2^shift`` (specs/rng.md §4), compared exactly
  as ``(2r + 1) << shift < rem << 17``;
* the magnitude code is ``((max(et, emin) - emin) << mbits) + quanta`` (a carry into the next
  binade is the next code: magnitude codes are ordered like their values), saturated with
  ``min(code, maxcode)`` (the clamp to the largest finite value of fp8.md §4, mx.md §5).

Threads take ranges of whole tiles (:func:`run_chunks`); a tile holds whole groups, so no group is
shared and nothing depends on the number of threads.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
from numba import njit

from ...layout.minifloat import ELEMENTS, SCALE_E4M3, SCALE_E8M0, SCALE_F32, values_table
from ...rng import split64
from .bitpack import _pack_bytes, _pack_octets
from .cast import pos_nan
from .philox import fill_blocks, key_schedule
from .quant import _closure
from .simd import block_amax16, div_groups16, pack6_x64, round_groups16
from .threads import run_chunks

__all__ = ["SCALE_E4M3", "SCALE_E8M0", "SCALE_F32", "count_bad_elements", "decode", "encode", "tensor_amax"]


SB = 2048  # elements per sub-block (their draws and codes stay in L1)
CHUNK = 1 << 16  # target elements per tile
#: group sizes compiled with constant trip counts: NVFP4's 16, MX's 32, 64 and fp8's default 128
_LITERAL_GROUPS = (16, 32, 64, 128)
#: Group sizes done 16 groups at a time (simd.block_amax16, div_groups16). Measured A/B in one
#: process, one thread: 0.72x the time for NVFP4's 16, 0.87-0.91x for groups of 32, but 1.1-1.3x
#: for 64 and 128, whose per-group loops already run long enough to amortise their set-up.
_BATCHED_GROUPS = (16, 32)


@njit(cache=True, inline="always")
def _mag_code(ub, k, MB, EMIN, MAXC, INT, STOCH, r):  # pragma: no cover - jitted
    """The magnitude code of the finite binary32 magnitude with bits ``ub`` (sign clear) divided by
    ``2^k``, rounded (nearest-even, or stochastically with the 16-bit draw ``r``) and saturated.

    Written without data-dependent branches so that LLVM vectorises the element loop: a binary32
    subnormal is first scaled by 2^64 (exact) with ``k`` raised by 64, so the significand always
    has its leading bit at 23; a quotient far below one quantum (``shift`` capped at 41, where the
    fraction is below 2^-17, the smallest draw) rounds to 0 both ways."""
    sub = ub < np.uint32(0x00800000)
    big = np.float32(np.uint32(ub).view(np.float32) * np.float32(18446744073709551616.0)).view(np.uint32)
    a = big if sub else ub
    kk = np.int64(k) + (np.int64(64) if sub else np.int64(0))
    s = np.int64(a & np.uint32(0x7FFFFF)) | np.int64(1 << 23)
    et = np.int64(a >> np.uint32(23)) - 127 - kk
    eb = max(et, np.int64(EMIN))
    if INT:
        shift = min(max(np.int64(23 + EMIN - MB) - et, np.int64(1)), np.int64(41))
    else:
        shift = min(np.int64(23 - MB) + (eb - et), np.int64(41))
    fl = s >> shift
    rem = s & ((np.int64(1) << shift) - 1)
    if STOCH:
        up = ((np.int64(2) * np.int64(r) + 1) << shift) < (rem << 17)
    else:
        up = rem + (fl & 1) > (np.int64(1) << (shift - 1))
    q = fl + np.int64(up)
    code = q if INT else ((eb - EMIN) << MB) + q
    code = min(code, np.int64(MAXC))
    return np.int64(0) if ub == np.uint32(0) else code


@njit(cache=True, inline="always")
def _code(ubits, k, BITS, MB, EMIN, MAXC, INT, STOCH, r):  # pragma: no cover - jitted
    """The element code of the binary32 value with bits ``ubits`` divided by ``2^k`` (sign kept)."""
    mag = _mag_code(ubits & np.uint32(0x7FFFFFFF), k, MB, EMIN, MAXC, INT, STOCH, r)
    neg = (ubits >> np.uint32(31)) != 0
    if INT:
        return (-mag if neg else mag) & 0xFF
    return mag | (np.int64(1 << (BITS - 1)) if neg else np.int64(0))


@njit(cache=True, inline="always")
def _group_amax(xb, lo, hi):  # pragma: no cover - jitted
    m = np.uint32(0)
    base = np.uint64(lo)
    for j in range(hi - lo):
        m = max(m, np.uint32(xb[base + np.uint64(j)] & np.uint32(0x7FFFFFFF)))
    return m


@njit(cache=True, inline="always")
def _near32(tb, MB, EMIN, MAXB, BITS):  # pragma: no cover - jitted
    """The element code of the binary32 value with bits ``tb`` in a floating format, rounded to
    nearest even (mx.md §6.2) and saturated (§6.1), on 32-bit lanes.

    ``|t|`` is first clamped to the largest finite value (bits ``MAXB``): a magnitude at or beyond it
    becomes exactly it, and one below it never rounds above it, so this is §6.1. Then the binary32
    addition ``|t| + m``, ``m = 2^(e + 23 - M)`` with ``e = max(floor(log2 |t|), emin)``, rounds
    ``|t|`` to nearest even at the format's quantum ``2^(e - M)``: ``m`` has a zero significand and
    ``|t| < 2^(e + 1) <= m / 2^(22 - M)``, so the sum lies in ``[m, 2m)`` where the binary32 spacing is
    that quantum, and ``bits(sum) - bits(m)`` is §6.2's ``R`` (a carry to ``2^(M+1)`` included). The
    magnitude code is ``((e - emin) << M) + R``, and ``e`` is read from ``m``'s exponent field. Every
    step is wrapped in ``np.uint32``: Numba widens integer arithmetic to 64 bits otherwise, and the
    vectoriser then works on half as many lanes."""
    ub = np.uint32(tb & np.uint32(0x7FFFFFFF))
    ac = min(ub, np.uint32(MAXB))
    eb = max(np.uint32(ac & np.uint32(0x7F800000)), np.uint32((EMIN + 127) << 23))  # e's exponent field
    mb = np.uint32(eb + np.uint32((23 - MB) << 23))
    s = np.float32(np.uint32(ac).view(np.float32) + np.uint32(mb).view(np.float32)).view(np.uint32)
    ecode = np.uint32(np.uint32(mb >> np.uint32(23 - MB)) - np.uint32((150 - MB + EMIN) << MB))  # (e - emin) << M
    code = np.uint32(np.uint32(s - mb) + ecode)
    return np.uint32(code | np.uint32(np.uint32(tb >> np.uint32(31)) << np.uint32(BITS - 1)))


@njit(cache=True, inline="always")
def _sto32(tb, r, MB, EMIN, MAXC, INT, BITS):  # pragma: no cover - jitted
    """The element code of the binary32 value with bits ``tb``, rounded stochastically with the
    16-bit draw ``r`` (mx.md §6.3) and saturated, on 32-bit lanes (the module docstring's integer
    rounding).

    With the significand ``S`` (24 bits) and ``shift`` as there, ``q = S >> shift`` and the fraction
    is ``rem / 2^shift``; the rule's ``(2r + 1) / 2^17 < rem / 2^shift`` is, for ``shift >= 17``,
    ``(2r + 1) << (shift - 17) < rem``, that is ``2r + 1 <= (rem - 1) >> (shift - 17)`` (the
    right-hand side is -1 for ``rem = 0``). Shifts are capped at 31 (a 32-bit shift by more is
    undefined): beyond it the quotient is 0 and ``(rem - 1) >> 31`` is 0 or -1, so no draw rounds
    up, as none can when the fraction is below 2^-17. A binary32 subnormal ``t`` (below 2^-126, far
    below any format's quantum) rounds to 0 both ways although its significand is read with the
    implicit bit."""
    ub = np.uint32(tb & np.uint32(0x7FFFFFFF))
    e = np.int32(np.int32(ub >> np.uint32(23)) - np.int32(127))
    s = np.int32(np.uint32(ub & np.uint32(0x7FFFFF)) | np.uint32(0x800000))
    if INT:
        eb = np.int32(0)
        sh = max(np.int32(np.int32(23 + EMIN - MB) - e), np.int32(1))
    else:
        eb = max(e, np.int32(EMIN))
        sh = np.int32(np.int32(23 - MB) + np.int32(eb - e))
    shc = min(sh, np.int32(31))
    fl = np.int32(s >> shc)
    rem = np.int32(s & np.int32(np.int32(np.int32(1) << shc) - np.int32(1)))
    d = min(max(np.int32(sh - np.int32(17)), np.int32(0)), np.int32(31))
    up = np.int32(np.int32(2) * np.int32(r) + np.int32(1)) <= np.int32(np.int32(rem - np.int32(1)) >> d)
    q = np.int32(fl + np.int32(up))
    code = q if INT else np.int32(np.int32(np.int32(eb - np.int32(EMIN)) << np.int32(MB)) + q)
    code = min(code, np.int32(MAXC))
    neg = ub != tb
    if INT:
        return np.uint32(np.int32(-code if neg else code) & np.int32(0xFF))
    return np.uint32(np.uint32(code) | np.uint32(np.uint32(tb >> np.uint32(31)) << np.uint32(BITS - 1)))


@njit(cache=True, inline="always")
def _e8m0_power(e, INTNEAR):  # pragma: no cover - jitted
    """(whether the fast path applies, the binary32 multiplier) of the E8M0 scale ``e``.

    t = v / 2^(e - 127) exactly (mx.md §5 step 4) is one binary32 multiplication by 2^(127 - e)
    wherever it matters: exact when |t| >= 2^-126, and a smaller |t| (the product rounded, still
    below 2^-126) lies far below every format's quantum, so it rounds to 0 in both rules. MXINT8's
    nearest rounding multiplies by 2^(133 - e) instead (its quantum 2^-6 folded in). Both powers
    must be normal binary32 numbers; the rare scales for which they are not take the exact
    integer path (:func:`_code`)."""
    if INTNEAR:
        return e >= np.int32(6), np.uint32(np.uint32(np.int32(260) - e) << np.uint32(23)).view(np.float32)
    return e <= np.int32(253), np.uint32(np.uint32(np.int32(254) - e) << np.uint32(23)).view(np.float32)


@njit(cache=True, inline="always")
def _e4m3_value(c):  # pragma: no cover - jitted
    """The binary32 value of the E4M3 magnitude code ``c`` (mx.md §3), branch-free on 32-bit lanes."""
    c = np.uint32(c)
    ef = np.uint32(c >> np.uint32(3))
    f = np.uint32(c & np.uint32(7))
    normal = np.uint32(np.uint32(np.uint32(ef + np.uint32(120)) << np.uint32(23)) | np.uint32(f << np.uint32(20)))
    normal = normal.view(np.float32)
    sub = np.float32(np.float32(np.int32(f)) * np.float32(2.0**-9))
    return sub if ef == np.uint32(0) else normal


def _make_encode(BITS, MB, EMIN, EMAX, MAXC, INT, SCALE, STOCH, MAXVAL, MAXB, GL):  # type: ignore[no-untyped-def]
    """The tile-range kernel for one element format, scale rule and rounding (closure constants).

    ``GL`` (0: none) is a group size whose whole groups get element loops of constant trip count:
    LLVM then picks a vector loop without a remainder, where a run-time count of 16 or 32 ran
    only its narrow epilogue."""

    def _scales(xb, sc32, sc8, mbuf, gmax, g0, g1, G, tscale):  # pragma: no cover - jitted
        """The scales of groups [g0, g1) (fp8.md §4, mx.md §5 step 3, nvfp4.md §3 step 3); returns
        how many hold NaN or infinity plus 2^32 times how many have a scale whose product with the
        largest element is infinite (rules E1, NV2; binary32 and NVFP4 scales). Two loops: the
        groups' largest magnitudes (an integer max over ``bits & 0x7FFFFFFF``; given in ``gmax``
        when the tensor pass kept them, else computed here), then their scales, a loop over groups
        that LLVM vectorises."""
        n = xb.shape[0]
        bad = 0
        over = 0
        g = g0
        if gmax.shape[0]:  # NVFP4: the tensor pass kept every block's largest magnitude
            for j in range(g1 - g0):
                mbuf[np.uint64(j)] = gmax[np.uint64(g0 + j)]
            g = g1
        if AMAX16 is not None:  # noqa: F821 - 16 whole groups at a time (simd.block_amax16)
            while g + 16 <= g1 and (g + 16) * GL <= n:
                AMAX16(xb, np.uint64(g * GL), mbuf, np.uint64(g - g0))  # noqa: F821
                g += 16
        for gi in range(g, g1):
            mbuf[np.uint64(gi - g0)] = _group_amax(xb, gi * G, min(gi * G + G, n))
        for j in range(g1 - g0):
            jj = np.uint64(j)
            gg = np.uint64(g0) + jj
            mb = mbuf[jj]
            isbad = mb >= np.uint32(0x7F800000)
            bad += isbad
            mb = np.uint32(0) if isbad else mb
            if SCALE == 0:
                sg = np.float32(np.uint32(mb).view(np.float32) / np.float32(MAXVAL))
                sc32[gg] = sg
                over += np.float32(sg * np.float32(MAXVAL)) == np.float32(np.inf)
            elif SCALE == 1:
                sc8[gg] = np.uint8(max(np.int32(np.int32(mb >> np.uint32(23)) - np.int32(EMAX)), np.int32(0)))
            else:  # tscale > 0 here: nvfp4 with S = 0 has only zero groups (see below)
                p = np.float32(np.uint32(mb).view(np.float32) / np.float32(6.0))
                r = np.float32(p / tscale)
                c = _near32(r.view(np.uint32), 3, -6, 0x43E00000, 8)  # E4M3, nearest, saturating at 448
                sc8[gg] = np.uint8(c)
                d = np.float32(_e4m3_value(c) * tscale)  # the block's scale d_b, as decoding computes it
                sc32[gg] = d
                over += np.float32(d * np.float32(6.0)) == np.float32(np.inf)
        return bad + over * 4294967296

    def _ecode(t, r):  # pragma: no cover - jitted
        """The element code of the scaled binary32 value ``t`` (draw ``r`` when stochastic)."""
        if INT and not STOCH:  # mx.md §6.2: R = rint(a * 64), saturated at 127 (t holds a * 64)
            tc = min(max(t, np.float32(-127.0)), np.float32(127.0))
            return np.uint32(np.int32(np.rint(tc)) & np.int32(0xFF))
        if STOCH:
            return _sto32(t.view(np.uint32), r, MB, EMIN, MAXC, INT, BITS)
        return _near32(t.view(np.uint32), MB, EMIN, MAXB, BITS)

    def _encode_range(x, xb, sc32, sc8, gmax, codes, G, L, fused, tscale, seeds, c0, c1):  # pragma: no cover - jitted
        setting = (BITS, MB, EMIN, EMAX, MAXC, INT, SCALE, STOCH, MAXVAL, MAXB, GL)  # noqa: F841 - the cache key
        bad = 0
        mbuf = np.empty((L if fused else c1 - c0) // G + 2, np.uint32)
        zs = SCALE == 2 and tscale == np.float32(0.0)  # nvfp4, S = 0: every block scale is code 0 (§3 step 3)
        if not fused:  # groups longer than a sub-block: all scales of the range first
            if zs:
                for gi in range(c0 // G, (c1 + G - 1) // G):
                    sc8[gi] = 0
                    sc32[gi] = np.float32(0.0)
            else:
                bad += SCALES(xb, sc32, sc8, mbuf, gmax, c0 // G, (c1 + G - 1) // G, G, tscale)  # noqa: F821
        rb = np.empty(L // 2 + 4, np.uint32)
        r16 = rb.view(np.uint16)
        cb = np.zeros(L + 8, np.uint8)
        tb = np.empty(L if DIV16 is not None and fused else 0, np.float32)  # noqa: F821
        pwb = np.empty(16, np.float32)
        if STOCH:
            ks = key_schedule(seeds[0], seeds[1])
        for b0 in range(c0, c1, L):
            b1 = min(b0 + L, c1)
            g0 = b0 // G
            g1 = (b1 - 1) // G + 1
            if fused:  # the sub-block holds whole groups: scales, then elements, while it is in cache
                if zs:
                    for gi in range(g0, g1):
                        sc8[gi] = 0
                        sc32[gi] = np.float32(0.0)
                else:
                    bad += SCALES(xb, sc32, sc8, mbuf, gmax, g0, g1, G, tscale)  # noqa: F821
            if STOCH:
                fill_blocks(rb, b0 // 8, (b1 - b0 + 7) // 8, seeds[2], seeds[3], ks)
            gs = g0
            if RND16 is not None and fused:  # noqa: F821 - nearest: 16 whole groups scaled and rounded at a time
                while gs + 16 <= g1 and (gs + 16) * GL <= b1:
                    if SCALE == 1:  # the 16 groups' powers of two; a slow one sends the rest per group
                        nslow = 0
                        for q in range(16):
                            fq, pq = _e8m0_power(np.int32(sc8[gs + q]), INT)
                            nslow += not fq
                            pwb[q] = pq
                        if nslow:
                            break
                        sv, sg = pwb, np.uint64(0)
                    else:
                        sv, sg = sc32, np.uint64(gs)
                    if BITS == 8:
                        RND16(x, np.uint64(gs * GL), sv, sg, codes, np.uint64(gs * GL))  # noqa: F821
                    else:
                        RND16(x, np.uint64(gs * GL), sv, sg, cb, np.uint64(gs * GL - b0))  # noqa: F821
                    gs += 16
            elif DIV16 is not None and fused:  # noqa: F821 - stochastic: the quotients, then one loop with the draws
                while gs + 16 <= g1 and (gs + 16) * GL <= b1:
                    DIV16(x, np.uint64(gs * GL), sc32, np.uint64(gs), tb, np.uint64(gs * GL - b0))  # noqa: F821
                    gs += 16
                ge = (gs * GL - b0) if gs > g0 else 0
                for j in range(ge):
                    jj = np.uint64(j)
                    c = ECODE(np.float32(tb[jj]), r16[jj])  # noqa: F821 - DIV16 is built for stochastic rounding only
                    if BITS == 8:
                        codes[np.uint64(b0) + jj] = np.uint8(c)
                    else:
                        cb[jj] = np.uint8(c)
            for gi in range(gs, g1):
                lo = max(gi * G, b0)
                hi = min(gi * G + G, b1)
                # unsigned indices: Numba then emits no negative-index wraparound, which keeps the
                # loop free of branches for LLVM's vectoriser (as gcodec.kernels.cpu.quant)
                base = np.uint64(lo)
                jb = np.uint64(lo - b0)
                cnt = hi - lo
                if SCALE == 1:
                    e = np.int32(sc8[gi])
                    fast, pw = _e8m0_power(e, INT and not STOCH)
                    if fast and GL > 0 and cnt == GL:  # the same loop with a constant trip count
                        for m in range(GL):
                            i = base + np.uint64(m)
                            j = jb + np.uint64(m)
                            c = ECODE(np.float32(x[i] * pw), r16[j] if STOCH else np.uint16(0))  # noqa: F821
                            if BITS == 8:
                                codes[i] = np.uint8(c)
                            else:
                                cb[j] = np.uint8(c)
                    elif fast:
                        for m in range(cnt):
                            i = base + np.uint64(m)
                            j = jb + np.uint64(m)
                            c = ECODE(np.float32(x[i] * pw), r16[j] if STOCH else np.uint16(0))  # noqa: F821
                            if BITS == 8:
                                codes[i] = np.uint8(c)
                            else:
                                cb[j] = np.uint8(c)
                    else:
                        k = np.int64(e) - 127
                        for m in range(cnt):
                            i = base + np.uint64(m)
                            j = jb + np.uint64(m)
                            r = r16[j] if STOCH else np.uint16(0)
                            c = _code(xb[i], k, BITS, MB, EMIN, MAXC, INT, STOCH, r)
                            if BITS == 8:
                                codes[i] = np.uint8(c)
                            else:
                                cb[j] = np.uint8(c)
                else:
                    s = sc32[gi]
                    if s == np.float32(0.0):  # a zero (or underflowed) scale: zero codes, signs kept
                        for m in range(cnt):
                            i = base + np.uint64(m)
                            c = np.uint32(np.uint32(xb[i] >> np.uint32(31)) << np.uint32(BITS - 1))
                            if BITS == 8:
                                codes[i] = np.uint8(c)
                            else:
                                cb[jb + np.uint64(m)] = np.uint8(c)
                    elif GL > 0 and cnt == GL:  # t = v / s: the spec's one binary32 division (fp8.md §4.1, nvfp4.md §3)
                        for m in range(GL):
                            i = base + np.uint64(m)
                            j = jb + np.uint64(m)
                            c = ECODE(np.float32(x[i] / s), r16[j] if STOCH else np.uint16(0))  # noqa: F821
                            if BITS == 8:
                                codes[i] = np.uint8(c)
                            else:
                                cb[j] = np.uint8(c)
                    else:
                        for m in range(cnt):
                            i = base + np.uint64(m)
                            j = jb + np.uint64(m)
                            c = ECODE(np.float32(x[i] / s), r16[j] if STOCH else np.uint16(0))  # noqa: F821
                            if BITS == 8:
                                codes[i] = np.uint8(c)
                            else:
                                cb[j] = np.uint8(c)
            if BITS != 8:
                m = b1 - b0
                for j in range(m, m + 8):
                    cb[j] = 0
                if BITS == 4:
                    _pack_bytes(cb, m, 4, codes, np.uint64(b0 // 2))
                else:  # 64 codes (48 bytes) at a time in vector registers, then the last octets
                    o = b0 // 8 * 6
                    k64 = m // 64
                    for k in range(k64):
                        pack6_x64(cb, np.uint64(64 * k), codes, np.uint64(o + 48 * k))
                    if m > 64 * k64:
                        _pack_octets(cb[64 * k64 :], m - 64 * k64, 6, codes, np.uint64(o + 48 * k64))
        return bad

    sc = njit(inline="always")(_closure(_scales, AMAX16=block_amax16(GL) if GL in _BATCHED_GROUPS else None))
    ec = njit(inline="always")(_ecode)
    batched = GL in _BATCHED_GROUPS
    d16 = div_groups16(GL) if batched and SCALE != 1 and STOCH else None
    r16 = round_groups16(GL, SCALE != 1, MB, EMIN, MAXB, BITS, INT) if batched and not STOCH else None
    return njit(cache=True, nogil=True)(_closure(_encode_range, SCALES=sc, ECODE=ec, DIV16=d16, RND16=r16))


_KERNELS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def _kernel(key: tuple, make: Any) -> Any:
    k = _KERNELS.get(key)
    if k is None:
        with _LOCK:
            k = _KERNELS.get(key)
            if k is None:
                k = _KERNELS[key] = make(*key[1:])
    return k


def sub_block(group_size: int) -> tuple[int, bool]:
    """(elements per sub-block, whether it holds whole groups): whole groups, a multiple of 8, about
    :data:`SB` elements when a group fits (the group's largest magnitude, scale and elements are then
    done while it is in L1); otherwise :data:`SB` elements, the scales of a range computed first."""
    g = int(group_size)
    step = g * 8 // math.gcd(g, 8)
    if step <= SB:
        return step * max(1, SB // step), True
    return SB, False


def tile(group_size: int) -> int:
    """Elements per tile: whole groups, a multiple of 8 (so packed elements start on a byte)."""
    g = int(group_size)
    step = g * 8 // math.gcd(g, 8)
    return step * max(1, CHUNK // step)


@njit(cache=True, nogil=True)
def _amax_range(xb, part, C, c0, c1):  # pragma: no cover - jitted
    # unsigned indices and 32-bit values: a vectorised max (with a signed index, whose wraparound
    # check kept this loop scalar, it took 3 times as long as a memcpy of the same data)
    m = np.uint32(0)
    base = np.uint64(c0)
    for j in range(c1 - c0):
        m = max(m, np.uint32(xb[base + np.uint64(j)] & np.uint32(0x7FFFFFFF)))
    part[c0 // C] = m
    return 0


_AMAX16_OF_16 = block_amax16(16)


@njit(cache=True, nogil=True)
def _amax_groups16_range(xb, gmax, part, C, c0, c1):  # pragma: no cover - jitted
    # gmax[g] = the largest magnitude (as bits) of each group of 16 in [c0, c1), 16 groups at a time
    # where whole (simd.block_amax16); part[c0 // C] = the largest of them
    n = xb.shape[0]
    g0 = c0 // 16
    g1 = (c1 + 15) // 16
    g = g0
    while g + 16 <= g1 and (g + 16) * 16 <= n:
        _AMAX16_OF_16(xb, np.uint64(g * 16), gmax, np.uint64(g))
        g += 16
    for gi in range(g, g1):
        gmax[np.uint64(gi)] = _group_amax(xb, gi * 16, min(gi * 16 + 16, n))
    m = np.uint32(0)
    for gi in range(g1 - g0):
        m = max(m, gmax[np.uint64(g0 + gi)])
    part[c0 // C] = m
    return 0


def tensor_group_amax(flat: np.ndarray) -> tuple[float, bool, np.ndarray]:
    """:func:`tensor_amax`, and every group of 16's largest magnitude as binary32 bits (what the
    block pass of NVFP4 would compute again: one read of the tensor fewer per block)."""
    n = flat.size
    xb = flat.view(np.uint32)
    gmax = np.empty(-(-n // 16), np.uint32)
    if n == 0:
        return 0.0, True, gmax
    part = np.zeros(-(-n // CHUNK), np.uint32)
    run_chunks(_amax_groups16_range, n, CHUNK, xb, gmax, part, CHUNK)
    return (*_largest(part), gmax)


def _largest(part: np.ndarray) -> tuple[float, bool]:
    """(the largest of the chunks' maxima ``part`` as a float, whether it is finite: 0.0 if not)."""
    m = int(part.max())
    if m >= 0x7F800000:
        return 0.0, False
    return float(np.uint32(m).view(np.float32)), True


def tensor_amax(flat: np.ndarray) -> tuple[float, bool]:
    """(largest magnitude, whether every value is finite) of a flat float32 array."""
    n = flat.size
    if n == 0:
        return 0.0, True
    xb = flat.view(np.uint32)
    part = np.zeros(-(-n // CHUNK), np.uint32)
    run_chunks(_amax_range, n, CHUNK, xb, part, CHUNK)
    return _largest(part)


#: NVIDIA's two-level scheme (nvfp4.md §3): the tensor scale maps the tensor's largest magnitude to
#: 448 (E4M3's largest) times 6 (E2M1's largest).
NV_TENSOR_DIVISOR = 448.0 * 6.0

_NO_GMAX = np.empty(0, np.uint32)  # the blocks' maxima are computed by the block pass


def encode(
    flat: np.ndarray,
    scales: np.ndarray,
    codes: np.ndarray,
    tensor_scale: np.ndarray | None,
    element: str,
    group_size: int,
    scale_rule: int,
    stochastic: bool,
    seed: int,
    stream: int,
) -> tuple[int, int]:
    """Quantize flat float32 ``flat`` into the ``scales`` and (packed) ``codes`` sections, and for
    ``SCALE_E4M3`` the one-element ``tensor_scale`` section. Returns (groups holding NaN or infinity,
    groups whose largest element would decode to infinity); when either is not 0 the sections are
    meaningless and the codec refuses the input."""
    n = flat.size
    if n == 0:
        if tensor_scale is not None:
            tensor_scale[0] = 0.0
        return 0, 0
    el = ELEMENTS[element]
    tscale = np.float32(0.0)
    gmax = _NO_GMAX
    if scale_rule == SCALE_E4M3:
        if group_size == 16:  # the tensor pass keeps the blocks' maxima for the block pass
            amax, finite, gmax = tensor_group_amax(flat)
        else:
            amax, finite = tensor_amax(flat)
        if not finite:
            return 1, 0
        tscale = np.float32(amax) / np.float32(NV_TENSOR_DIVISOR)  # one binary32 division
        tensor_scale[0] = tscale
    if scale_rule == SCALE_F32:
        sc32, sc8 = scales, np.empty(0, np.uint8)
    else:
        sc8 = scales
        sc32 = np.empty(-(-n // group_size) if scale_rule == SCALE_E4M3 else 0, np.float32)
    key = (
        "enc",
        el.bits,
        el.mbits,
        el.emin,
        el.emax,
        el.maxcode,
        el.integer,
        int(scale_rule),
        bool(stochastic),
        float(np.float32(el.max_value)),
        0 if el.integer else int(np.float32(el.max_value).view(np.uint32)),
        int(group_size) if group_size in _LITERAL_GROUPS else 0,
    )
    k = _kernel(key, _make_encode)
    sl, sh = split64(seed)
    tl, th = split64(stream)
    seeds = (np.uint32(sl), np.uint32(sh), np.uint32(tl), np.uint32(th))
    L, fused = sub_block(group_size)
    counts = run_chunks(
        k,
        n,
        tile(group_size),
        flat,
        flat.view(np.uint32),
        sc32,
        sc8,
        gmax,
        codes,
        int(group_size),
        L,
        fused,
        tscale,
        seeds,
    )
    # E1, NV2: the largest element times the scale stays finite (counted with the scales)
    nbad = counts & 0xFFFFFFFF
    nover = 0 if nbad else counts >> 32
    return int(nbad), int(nover)


# --------------------------------------------------------------------------------------------
# decoding


def _make_decode(BITS, SCALE, ACC, NAN):  # type: ignore[no-untyped-def]
    """``NAN``: whether the element format has codes that are not finite values (counted as read)."""

    def _decode_range(codes, sc32, sc8, out, G, tscale, table, c0, c1):  # pragma: no cover - jitted
        setting = (BITS, SCALE, ACC, NAN)  # noqa: F841 - the cache key
        bad = 0
        nbytes = np.uint64(codes.shape[0])
        for gi in range(c0 // G, (c1 - 1) // G + 1):
            lo = max(gi * G, c0)
            hi = min(gi * G + G, c1)
            if SCALE == 1:
                s = np.uint32(np.int64(sc8[gi]) << 23).view(np.float32) if sc8[gi] > 0 else np.float32(2.0**-127)
            elif SCALE == 0:
                s = sc32[gi]
            else:
                s = np.float32(_e4m3_value(sc8[gi]) * tscale)  # d_b of nvfp4.md §4, without libm's ldexp
            base = np.uint64(lo)
            if BITS == 4 and lo % 2 == 0 and (hi - lo) % 2 == 0:  # whole bytes: two elements each
                o = base >> np.uint64(1)
                for m in range((hi - lo) // 2):
                    u = codes[o + np.uint64(m)]
                    v0 = table[u & np.uint8(0xF)]
                    v1 = table[u >> np.uint8(4)]
                    if NAN:
                        bad += np.isnan(v0) + np.isnan(v1)
                    i = base + np.uint64(2 * m)
                    if ACC:
                        out[i] = pos_nan(out[i] + np.float32(v0 * s))  # format.md §10's NaN rule
                        out[i + np.uint64(1)] = pos_nan(out[i + np.uint64(1)] + np.float32(v1 * s))
                    else:
                        out[i] = np.float32(v0 * s)
                        out[i + np.uint64(1)] = np.float32(v1 * s)
                continue
            if BITS == 6 and lo % 4 == 0 and (hi - lo) % 4 == 0:  # whole triples of bytes: four elements each
                o = (base >> np.uint64(2)) * np.uint64(3)
                for m in range((hi - lo) // 4):
                    p = o + np.uint64(3 * m)
                    w = np.uint32(codes[p]) | (np.uint32(codes[p + np.uint64(1)]) << 8)
                    w |= np.uint32(codes[p + np.uint64(2)]) << 16
                    i = base + np.uint64(4 * m)
                    for t in range(4):
                        v = table[np.uint8((w >> np.uint32(6 * t)) & np.uint32(0x3F))]
                        if NAN:
                            bad += np.isnan(v)
                        if ACC:
                            out[i + np.uint64(t)] = pos_nan(out[i + np.uint64(t)] + np.float32(v * s))
                        else:
                            out[i + np.uint64(t)] = np.float32(v * s)
                continue
            for m in range(hi - lo):
                i = base + np.uint64(m)
                if BITS == 8:
                    c = codes[i]
                elif BITS == 4:
                    c = (codes[i >> np.uint64(1)] >> np.uint8(4 * (i & np.uint64(1)))) & np.uint8(0xF)
                else:
                    p = (i >> np.uint64(2)) * np.uint64(3)
                    w = np.uint32(codes[p])
                    if p + np.uint64(1) < nbytes:
                        w |= np.uint32(codes[p + np.uint64(1)]) << 8
                    if p + np.uint64(2) < nbytes:
                        w |= np.uint32(codes[p + np.uint64(2)]) << 16
                    c = np.uint8((w >> np.uint32(6 * (i & np.uint64(3)))) & np.uint32(0x3F))
                v = table[c]
                if NAN:
                    bad += np.isnan(v)
                y = np.float32(v * s)
                if ACC:
                    out[i] = pos_nan(out[i] + y)
                else:
                    out[i] = y
        return bad

    return njit(cache=True, nogil=True)(_decode_range)


def decode(
    codes: np.ndarray,
    sc32: np.ndarray,
    sc8: np.ndarray,
    out: np.ndarray,
    element: str,
    group_size: int,
    scale_rule: int,
    accumulate: bool,
    tscale: float = 0.0,
) -> int:
    """out[i] (+)= value(code_i) * scale of its group; returns how many codes are not finite values."""
    n = out.shape[0]
    if n == 0:
        return 0
    el = ELEMENTS[element]
    has_nan = el.integer or el.finite_below != el.sign_bit  # E2M1 and the FP6 formats: every code is finite
    k = _kernel(("dec", el.bits, int(scale_rule), bool(accumulate), has_nan), _make_decode)
    return run_chunks(
        k, n, tile(group_size), codes, sc32, sc8, out, int(group_size), np.float32(tscale), _table(element)
    )


_TABLES: dict[str, np.ndarray] = {}


def _table(element: str) -> np.ndarray:
    t = _TABLES.get(element)
    if t is None:
        t = _TABLES[element] = values_table(ELEMENTS[element])
    return t


@njit(cache=True, nogil=True)
def _count_nan_codes(codes, table, BITS, n, c0, c1):  # pragma: no cover - jitted
    bad = 0
    for i in range(c0, c1):
        if BITS == 8:
            c = codes[i]
        elif BITS == 4:
            c = (codes[i >> 1] >> np.uint8(4 * (i & 1))) & np.uint8(0xF)
        else:
            p = (i >> 2) * 3
            w = np.uint32(codes[p])
            if p + 1 < codes.shape[0]:
                w |= np.uint32(codes[p + 1]) << 8
            if p + 2 < codes.shape[0]:
                w |= np.uint32(codes[p + 2]) << 16
            c = np.uint8((w >> np.uint32(6 * (i & 3))) & np.uint32(0x3F))
        bad += np.isnan(table[c])
    return bad


def count_bad_elements(codes: np.ndarray, n: int, element: str) -> int:
    """How many of the first ``n`` element codes are not finite values (NaN, infinity, MXINT8's 0x80)."""
    if n == 0:
        return 0
    el = ELEMENTS[element]
    if el.finite_below == el.sign_bit and not el.integer:
        return 0
    return run_chunks(_count_nan_codes, n, CHUNK, codes, _table(element), el.bits, n)
