"""Group scales of the scaled quantizers: the statistic of each group and the scale rule applied to it.

The rules (``gcodec.layout.quant.RULE_*``) are those of specs/codecs/uniform.md, qsgd.md, terngrad.md
and sign.md; sums are the fixed-order lane sums of qsgd.md §3, over blocks of ``RBLOCK`` elements.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numba import njit

from ...layout.quant import RBLOCK, RULE_ABSMAX, RULE_L2, RULE_MAX, RULE_MEANABS
from .cast import f16_bits_to_f32, f32_to_f16_bits
from .simd import max_bits, max_sums, sum_abs, sum_sq, sum_v
from .threads import run_chunks

_INF_BITS = np.uint32(0x7F800000)
_F16_INF = np.uint16(0x7C00)

# --------------------------------------------------------------------------------------------
# statistics


@njit(cache=True)
def lane_sum(x, lo, hi, kind):  # pragma: no cover - jitted
    """The lane sum of specs/codecs/qsgd.md §3 over [lo, hi) (at most RBLOCK elements).

    ``kind`` 0: v^2, 1: |v|, 2: v, each term exact in float64. Lane ``j`` adds the terms of
    elements ``lo + j, lo + j + 8, ...`` in order starting from +0; the lanes are then added as
    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
    """
    if kind == 0:
        return sum_sq(x, lo, hi - lo)
    if kind == 1:
        return sum_abs(x, lo, hi - lo)
    return sum_v(x, lo, hi - lo)


@njit(cache=True, inline="always")
def _rule_scale(rule, mbits, s1, s2, count, qmax, clip):  # pragma: no cover - jitted
    """(float32 scale, bad) from a group's statistics, by the rule (``bad``: not finite)."""
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
    return s, bad


@njit(cache=True, inline="always")
def _f16_scale(s, bad):  # pragma: no cover - jitted
    """A float16 scale: (s rounded up to float16, as float32; its bits; bad, now also when that
    overflows). Bits 0 when already ``bad``."""
    h = np.uint16(0)
    if not bad:
        h = f32_to_f16_bits(s)
        if f16_bits_to_f32(h) < s:
            h = np.uint16(h + np.uint16(1))
        if h >= _F16_INF:
            bad = True
            h = _F16_INF
        s = f16_bits_to_f32(h)
    return s, h, bad


@njit(cache=True)
def _scale(rule, mbits, s1, s2, count, qmax, clip, f16):  # pragma: no cover - jitted
    """(float32 scale, its float16 bits when ``f16``, bad) from a group's statistics; the scale is
    0 when bad."""
    s, bad = _rule_scale(rule, mbits, s1, s2, count, qmax, clip)
    h = np.uint16(0)
    if f16:
        s, h, bad = _f16_scale(s, bad)
    if bad:
        s = np.float32(0.0)
    return s, h, bad


@njit(cache=True, inline="always")
def _group_stats(x, lo, hi, rule, clipped):  # pragma: no cover - jitted
    """(absmax bits, sum v, sum v^2) of one range of at most RBLOCK elements, as the rule needs.

    terngrad's clip (``clipped``: RULE_MAX with c > 0) needs all three: max |clip(v)| =
    min(max |v|, c * sigma), so one pass gives the scale.
    """
    mb = np.uint32(0)
    s1 = 0.0
    s2 = 0.0
    if rule == RULE_L2:
        s2 = sum_sq(x, lo, hi - lo)
    elif rule == RULE_MEANABS:
        s1 = sum_abs(x, lo, hi - lo)
    elif clipped:
        mb, s1, s2 = max_sums(x, lo, hi - lo)
    else:
        mb = max_bits(x, lo, hi - lo)
    return mb, s1, s2


def _make_group_scales(RULE, CLIPPED, F16):  # type: ignore[no-untyped-def]
    """The two kernels of :func:`large_group_scales` for one rule (``CLIPPED``: terngrad's clip is
    on; ``F16``: float16 scales), the setting as closure constants: Numba compiles only this rule's
    statistics and scale (see ``quant._make_encode_range``)."""

    def _block_stats(x, G, nbpg, bm, b1, b2, k0, k1):  # pragma: no cover - jitted
        """Statistics of blocks [k0, k1) (block k: block k % nbpg of group k // nbpg)."""
        setting = (RULE, CLIPPED, F16)  # noqa: F841 - the cache key (closure)
        n = x.shape[0]
        for b in range(k0, k1):
            gi = b // nbpg
            lo = gi * G + (b - gi * nbpg) * RBLOCK
            hi = min(lo + RBLOCK, min(gi * G + G, n))
            if lo < hi:
                m, s1, s2 = _group_stats(x, lo, hi, RULE, CLIPPED)
                bm[b] = m
                b1[b] = s1
                b2[b] = s2
        return 0

    def _combine_scales(sc32, sc16, n, G, nbpg, qmax, clip, bm, b1, b2):  # pragma: no cover - jitted
        """Per group, its blocks' statistics left to right (max; float64 sums as the spec orders
        them), then its scale. Returns the number of non-finite groups."""
        setting = (RULE, CLIPPED, F16)  # noqa: F841 - the cache key (closure)
        nbad = 0
        for gi in range(sc32.shape[0]):
            m = bm[gi * nbpg]
            s1 = b1[gi * nbpg]
            s2 = b2[gi * nbpg]
            for k in range(1, nbpg):
                b = gi * nbpg + k
                m = bm[b] if bm[b] > m else m
                s1 = s1 + b1[b]
                s2 = s2 + b2[b]
            count = min(gi * G + G, n) - gi * G
            s, bad = _rule_scale(RULE, m, s1, s2, count, qmax, clip)
            if F16:
                s, h, bad = _f16_scale(s, bad)
                sc16[gi] = h
            if bad:
                s = np.float32(0.0)
            sc32[gi] = s
            nbad += bad
        return nbad

    return njit(cache=True, nogil=True)(_block_stats), njit(cache=True)(_combine_scales)


_KERNELS: dict[tuple[int, bool, bool], Any] = {}
_LOCK = threading.Lock()


def large_group_scales(x, sc32, sc16, G, rule, qmax, clip):  # type: ignore[no-untyped-def]
    """Scales of groups longer than a sub-block. Returns the number of non-finite groups.

    Each group is cut into blocks of RBLOCK elements from its start; blocks are reduced in
    parallel and combined per group left to right (max, and float64 sums as the spec orders them).
    """
    key = (int(rule), bool(rule == RULE_MAX and clip > 0.0), bool(sc16.shape[0] > 0))
    ks = _KERNELS.get(key)
    if ks is None:
        with _LOCK:
            ks = _KERNELS.get(key)
            if ks is None:
                ks = _KERNELS[key] = _make_group_scales(*key)
    block_stats, combine = ks
    nbpg = (G + RBLOCK - 1) // RBLOCK
    nblocks = sc32.shape[0] * nbpg
    bm = np.zeros(nblocks, np.uint32)
    b1 = np.zeros(nblocks, np.float64)
    b2 = np.zeros(nblocks, np.float64)
    run_chunks(block_stats, nblocks, 1, x, G, nbpg, bm, b1, b2)
    return combine(sc32, sc16, x.shape[0], G, nbpg, int(qmax), float(clip), bm, b1, b2)
