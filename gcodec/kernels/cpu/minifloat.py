"""Low-precision element formats on the CPU: ``fp8``, ``mx`` and ``nvfp4`` (specs/codecs/fp8.md, mx.md, nvfp4.md).

One pass per tile of whole groups: the group's largest magnitude (an integer max over
``bits & 0x7FFFFFFF``; NaN and infinity show up as values >= 0x7F800000), its scale, then every
element rounded into the element format and packed, while the tile is in cache.

Rounding is integer arithmetic on the binary32 bits, exact for any scale:

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
from .philox import fill_blocks, key_schedule
from .threads import run_chunks

__all__ = ["SCALE_E4M3", "SCALE_E8M0", "SCALE_F32", "count_bad_elements", "decode", "encode", "tensor_amax"]


SB = 2048  # elements per sub-block (their draws and codes stay in L1)
CHUNK = 1 << 16  # target elements per tile

_E4M3 = ELEMENTS["e4m3"]
_E4M3_VALUES = values_table(_E4M3)


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
        m = max(m, xb[base + np.uint64(j)] & np.uint32(0x7FFFFFFF))
    return m


def _make_encode(BITS, MB, EMIN, EMAX, MAXC, INT, SCALE, STOCH, MAXVAL):  # type: ignore[no-untyped-def]
    """The tile-range kernel for one element format, scale rule and rounding (closure constants)."""

    def _encode_range(x, xb, sc32, sc8, codes, G, tscale, e4m3v, seeds, c0, c1):  # pragma: no cover - jitted
        setting = (BITS, MB, EMIN, EMAX, MAXC, INT, SCALE, STOCH, MAXVAL)  # noqa: F841 - the cache key
        n = x.shape[0]
        bad = 0
        # 1. the scales of the groups of this range (whole groups: c0 and c1 are multiples of G or n)
        g0 = c0 // G
        g1 = (c1 + G - 1) // G
        for gi in range(g0, g1):
            lo = gi * G
            hi = min(lo + G, n)
            mb = _group_amax(xb, lo, hi)
            if mb >= np.uint32(0x7F800000):
                bad += 1
                mb = np.uint32(0)
            if SCALE == 0:
                sc32[gi] = np.uint32(mb).view(np.float32) / np.float32(MAXVAL)
            elif SCALE == 1:
                sc8[gi] = np.uint8(max(np.int64(mb >> np.uint32(23)) - EMAX, 0))
            else:
                if tscale > np.float32(0.0):
                    q = np.float32(np.uint32(mb).view(np.float32) / np.float32(6.0))
                    rr = np.float32(q / tscale)
                    c = _mag_code(rr.view(np.uint32), 0, 3, -6, 0x7E, False, False, 0)
                else:
                    c = np.int64(0)
                sc8[gi] = np.uint8(c)
                sc32[gi] = e4m3v[c] * tscale  # the block's scale, as decoding computes it
        # 2. round and pack, a sub-block at a time (c0 is a multiple of 8: sub-blocks start on a byte)
        rb = np.empty(SB // 2 + 4, np.uint32)
        r16 = rb.view(np.uint16)
        cb = np.zeros(SB + 8, np.uint8)
        if STOCH:
            ks = key_schedule(seeds[0], seeds[1])
        for b0 in range(c0, c1, SB):
            b1 = min(b0 + SB, c1)
            if STOCH:
                fill_blocks(rb, b0 // 8, (b1 - b0 + 7) // 8, seeds[2], seeds[3], ks)
            for gi in range(b0 // G, (b1 - 1) // G + 1):
                lo = max(gi * G, b0)
                hi = min(gi * G + G, b1)
                # unsigned indices: Numba then emits no negative-index wraparound, which keeps the
                # loop free of branches for LLVM's vectoriser (as gcodec.kernels.cpu.quant)
                base = np.uint64(lo)
                jb = np.uint64(lo - b0)
                if SCALE == 1:
                    k = np.int64(sc8[gi]) - 127
                    for m in range(hi - lo):
                        i = base + np.uint64(m)
                        j = jb + np.uint64(m)
                        r = r16[j] if STOCH else np.uint16(0)
                        c = _code(xb[i], k, BITS, MB, EMIN, MAXC, INT, STOCH, r)
                        if BITS == 8:
                            codes[i] = np.uint8(c)
                        else:
                            cb[j] = np.uint8(c)
                else:
                    sg = sc32[gi]
                    zero = sg == np.float32(0.0)  # a zero (or underflowed) scale: zero codes, signs kept
                    s = np.float32(1.0) if zero else sg
                    for m in range(hi - lo):
                        i = base + np.uint64(m)
                        j = jb + np.uint64(m)
                        r = r16[j] if STOCH else np.uint16(0)
                        t = np.float32(x[i] / s)
                        c = _code(t.view(np.uint32), 0, BITS, MB, EMIN, MAXC, INT, STOCH, r)
                        if zero:
                            c = np.int64(0) if INT else np.int64(xb[i] >> np.uint32(31)) << (BITS - 1)
                        if BITS == 8:
                            codes[i] = np.uint8(c)
                        else:
                            cb[j] = np.uint8(c)
            if BITS == 4:
                o = np.uint64(b0 // 2)
                m = b1 - b0
                cb[m] = 0
                for j in range((m + 1) // 2):
                    jj = np.uint64(j)
                    codes[o + jj] = cb[2 * jj] | (cb[2 * jj + np.uint64(1)] << np.uint8(4))
            elif BITS == 6:
                o = np.uint64(b0 // 4 * 3)
                m = b1 - b0
                for j in range(m, m + 4):
                    cb[j] = 0
                nb = np.uint64((m * 6 + 7) // 8)
                for q in range((m + 3) // 4):
                    jj = np.uint64(4 * q)
                    w = np.uint32(cb[jj]) | (np.uint32(cb[jj + np.uint64(1)]) << 6)
                    w |= (np.uint32(cb[jj + np.uint64(2)]) << 12) | (np.uint32(cb[jj + np.uint64(3)]) << 18)
                    k0 = np.uint64(3 * q)
                    codes[o + k0] = np.uint8(w & 0xFF)
                    if k0 + np.uint64(1) < nb:
                        codes[o + k0 + np.uint64(1)] = np.uint8((w >> 8) & 0xFF)
                    if k0 + np.uint64(2) < nb:
                        codes[o + k0 + np.uint64(2)] = np.uint8((w >> 16) & 0xFF)
        return bad

    return njit(cache=True, nogil=True)(_encode_range)


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


def tile(group_size: int) -> int:
    """Elements per tile: whole groups, a multiple of 8 (so packed elements start on a byte)."""
    g = int(group_size)
    step = g * 8 // math.gcd(g, 8)
    return step * max(1, CHUNK // step)


@njit(cache=True, nogil=True)
def _amax_range(xb, part, C, c0, c1):  # pragma: no cover - jitted
    m = np.uint32(0)
    for i in range(c0, c1):
        m = max(m, xb[i] & np.uint32(0x7FFFFFFF))
    part[c0 // C] = m
    return 0


def tensor_amax(flat: np.ndarray) -> tuple[float, bool]:
    """(largest magnitude, whether every value is finite) of a flat float32 array."""
    n = flat.size
    if n == 0:
        return 0.0, True
    xb = flat.view(np.uint32)
    part = np.zeros(-(-n // CHUNK), np.uint32)
    run_chunks(_amax_range, n, CHUNK, xb, part, CHUNK)
    m = int(part.max())
    if m >= 0x7F800000:
        return 0.0, False
    return float(np.uint32(m).view(np.float32)), True


#: NVIDIA's two-level scheme (nvfp4.md §3): the tensor scale maps the tensor's largest magnitude to
#: 448 (E4M3's largest) times 6 (E2M1's largest).
NV_TENSOR_DIVISOR = 448.0 * 6.0


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
    if scale_rule == SCALE_E4M3:
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
    )
    k = _kernel(key, _make_encode)
    sl, sh = split64(seed)
    tl, th = split64(stream)
    seeds = (np.uint32(sl), np.uint32(sh), np.uint32(tl), np.uint32(th))
    nbad = run_chunks(
        k,
        n,
        tile(group_size),
        flat,
        flat.view(np.uint32),
        sc32,
        sc8,
        codes,
        int(group_size),
        tscale,
        _E4M3_VALUES,
        seeds,
    )
    nover = 0
    if not nbad and scale_rule != SCALE_E8M0:  # E1, NV2: the largest element times the scale stays finite
        top = np.float32(el.max_value if scale_rule == SCALE_F32 else 6.0)
        with np.errstate(over="ignore", invalid="ignore"):
            nover = int(np.count_nonzero(np.isinf(sc32 * top)))
    return int(nbad), nover


# --------------------------------------------------------------------------------------------
# decoding


def _make_decode(BITS, SCALE, ACC):  # type: ignore[no-untyped-def]
    def _decode_range(codes, sc32, sc8, out, G, tscale, table, c0, c1):  # pragma: no cover - jitted
        setting = (BITS, SCALE, ACC)  # noqa: F841 - the cache key
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
                s = np.float32(table_e4m3(sc8[gi]) * tscale)
            base = np.uint64(lo)
            if BITS == 4 and lo % 2 == 0 and (hi - lo) % 2 == 0:  # whole bytes: two elements each
                o = base >> np.uint64(1)
                for m in range((hi - lo) // 2):
                    u = codes[o + np.uint64(m)]
                    v0 = table[u & np.uint8(0xF)]
                    v1 = table[u >> np.uint8(4)]
                    bad += np.isnan(v0) + np.isnan(v1)
                    i = base + np.uint64(2 * m)
                    if ACC:
                        out[i] += np.float32(v0 * s)
                        out[i + np.uint64(1)] += np.float32(v1 * s)
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
                        bad += np.isnan(v)
                        if ACC:
                            out[i + np.uint64(t)] += np.float32(v * s)
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
                bad += np.isnan(v)
                y = np.float32(v * s)
                if ACC:
                    out[i] += y
                else:
                    out[i] = y
        return bad

    return njit(cache=True, nogil=True)(_decode_range)


@njit(cache=True, inline="always")
def table_e4m3(c):  # pragma: no cover - jitted
    """The value of E4M3 code ``c`` (finite codes with the sign clear: block scales)."""
    e = np.int64(c >> np.uint8(3))
    f = np.int64(c & np.uint8(7))
    if e == 0:
        return np.float32(f * 2.0**-9)
    return np.float32(math.ldexp(np.float64(8 + f), e - 10))


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
    k = _kernel(("dec", el.bits, int(scale_rule), bool(accumulate)), _make_decode)
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
