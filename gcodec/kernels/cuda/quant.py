"""Scaled integer quantizers on the device: ``uniform``, ``qsgd``, ``terngrad`` (and ``sign``'s scales).

The same three steps as ``gcodec.kernels.cpu.quant``, with the same bits:

1. **scales**: one thread per block of at most ``RBLOCK`` elements of a group computes its statistic
   (absmax bits; float64 lane sums in the fixed order of specs/codecs/qsgd.md §3: eight lanes
   ``j, j+8, ...``, then ``((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))``); one thread per group adds its blocks
   left to right and applies the scale rule (``_scale``, the CPU's rule line by line);
2. **quantize and pack**: one thread per *octet* of elements: eight elements are exactly one Philox
   block of 16-bit draws (specs/rng.md §3.1) and exactly ``w`` bytes of packed codes, whatever ``w``,
   so a thread computes one block, rounds eight values and stores ``w`` whole bytes;
3. **decode**: one thread per element, ``out[i] (+)= float32(q) * s`` with the product rounded on its
   own (``mul32``: never fused with the accumulation).

Non-finite groups and out-of-range codes are counted with atomics; the count is the one value that
comes back to the host (the codecs raise on it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from ...layout.quant import RBLOCK, RULE_ABSMAX, RULE_L2, RULE_MAX, RULE_MEANABS, QuantLayout
from ...rng import split64
from .cast import f16_bits_to_f32, f32_to_f16_bits
from .launch import device, grid, host, mul32, mul64, pos_nan, sub64, upload
from .philox import block, u16_to_open01

__all__ = ["count_bad", "count_scale_overflows", "encode", "group_scales", "scaled_decode"]

_INF_BITS = np.uint32(0x7F800000)
_F16_INF = np.uint16(0x7C00)
_DMAX = 1.7976931348623157e308


@cuda.jit(device=True)
def lane_sum(x, lo, hi, kind):  # pragma: no cover - device
    """The lane sum of qsgd.md §3 over [lo, hi) (at most RBLOCK elements); ``kind`` 0: v^2, 1: |v|,
    2: v. Each term is exact in float64 (so a fused multiply-add of v*v into the lane is exact too)."""
    lanes = cuda.local.array(8, np.float64)
    for j in range(8):
        acc = 0.0
        for i in range(lo + j, hi, 8):
            v = np.float64(np.float32(x[i]))
            if kind == 0:
                acc = acc + v * v
            elif kind == 1:
                acc = acc + abs(v)
            else:
                acc = acc + v
        lanes[j] = acc
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))


@cuda.jit(device=True)
def max_bits(x, lo, hi):  # pragma: no cover - device
    m = np.uint32(0)
    for i in range(lo, hi):
        b = np.uint32(np.float32(x[i]).view(np.uint32) & np.uint32(0x7FFFFFFF))
        m = b if b > m else m
    return m


@cuda.jit(device=True)
def scale_of(rule, mbits, s1, s2, count, qmax, clip, f16):  # pragma: no cover - device
    """(float32 scale, float16 bits, bad): ``gcodec.kernels.cpu.scales._scale``, step for step."""
    bad = False
    s = np.float32(0.0)
    if rule == RULE_L2:
        bad = not (abs(s2) <= _DMAX)
        s = np.float32(np.sqrt(s2)) / np.float32(qmax)
    elif rule == RULE_MEANABS:
        bad = not (abs(s1) <= _DMAX)
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
                var = sub64(s2 / np.float64(count), mul64(mean, mean))
                var = var if var > 0.0 else 0.0
                t = np.float32(mul64(clip, np.sqrt(var)))
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


@cuda.jit
def _block_stats(x, G, nbpg, rule, clip, bm, b1, b2):  # pragma: no cover - device
    n = x.shape[0]
    for b in range(cuda.grid(1), bm.shape[0], cuda.gridsize(1)):
        gi = b // nbpg
        lo = gi * G + (b - gi * nbpg) * RBLOCK
        hi = min(lo + RBLOCK, min(gi * G + G, n))
        m = np.uint32(0)
        s1 = 0.0
        s2 = 0.0
        if lo < hi:
            if rule == RULE_L2:
                s2 = lane_sum(x, lo, hi, 0)
            elif rule == RULE_MEANABS:
                s1 = lane_sum(x, lo, hi, 1)
            elif rule == RULE_MAX and clip > 0.0:
                m = max_bits(x, lo, hi)
                s1 = lane_sum(x, lo, hi, 2)
                s2 = lane_sum(x, lo, hi, 0)
            else:
                m = max_bits(x, lo, hi)
        bm[b] = m
        b1[b] = s1
        b2[b] = s2


@cuda.jit
def _group_scales(n, G, nbpg, rule, qmax, clip, f16, bm, b1, b2, sc32, sc16, nbad):  # pragma: no cover - device
    for gi in range(cuda.grid(1), sc32.shape[0], cuda.gridsize(1)):
        m = bm[gi * nbpg]
        s1 = b1[gi * nbpg]
        s2 = b2[gi * nbpg]
        for k in range(1, nbpg):
            b = gi * nbpg + k
            m = bm[b] if bm[b] > m else m
            s1 = s1 + b1[b]
            s2 = s2 + b2[b]
        count = min(gi * G + G, n) - gi * G
        s, h, bad = scale_of(rule, m, s1, s2, count, qmax, clip, f16)
        sc32[gi] = s
        if f16:
            sc16[gi] = h
        if bad:
            cuda.atomic.add(nbad, 0, 1)


def group_scales(x: Any, sc32: Any, sc16: Any, G: int, rule: int, qmax: int, clip: float) -> Any:
    """Scales of every group into device ``sc32`` (and float16 bits into ``sc16`` when it is not
    empty); returns a device counter of the non-finite groups (read it on the host when needed)."""
    n = int(x.shape[0])
    nbpg = (G + RBLOCK - 1) // RBLOCK
    ng = int(sc32.shape[0])
    nb = ng * nbpg
    bm = cuda.device_array(max(nb, 1), np.uint32)
    b1 = cuda.device_array(max(nb, 1), np.float64)
    b2 = cuda.device_array(max(nb, 1), np.float64)
    nbad = upload(np.zeros(1, np.int64))
    if nb:
        _block_stats[grid(nb)](x, G, nbpg, rule, float(clip), bm[:nb], b1[:nb], b2[:nb])
        f16 = int(sc16.shape[0]) > 0
        _group_scales[grid(ng)](n, G, nbpg, rule, qmax, float(clip), f16, bm, b1, b2, sc32, sc16, nbad)
    return nbad


@cuda.jit
def _quantize(x, G, w, qmax, stochastic, sc32, codes, k0, k1, s0, s1):  # pragma: no cover - device
    """Thread per octet b: elements 8b .. 8b+7, Philox block b, packed bytes w*b .. w*b + w - 1."""
    n = x.shape[0]
    nbytes = codes.shape[0]
    noct = (n + 7) // 8
    q = np.float32(qmax)
    mask = np.uint64((1 << w) - 1)
    for b in range(cuda.grid(1), noct, cuda.gridsize(1)):
        r = (np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))
        if stochastic:
            r = block(np.uint64(b), s0, s1, k0, k1)
        word = np.uint64(0)
        for k in range(8):
            i = 8 * b + k
            code = np.int32(0)
            if i < n:
                s = sc32[i // G]
                if s != np.float32(0.0):
                    t = np.float32(x[i]) / s
                    t = min(max(t, -q), q)
                    if stochastic:
                        wd = r[k // 2]
                        d = np.uint32(wd >> np.uint32(16 * (k % 2))) & np.uint32(0xFFFF)
                        fl = np.floor(t)
                        up = u16_to_open01(d) < t - fl
                        code = np.int32(fl) + np.int32(up)
                    else:
                        code = np.int32(np.rint(t))
            word |= (np.uint64(np.int64(code)) & mask) << np.uint64(w * k)
        for j in range(w):
            o = w * b + j
            if o < nbytes:
                codes[o] = np.uint8((word >> np.uint64(8 * j)) & np.uint64(0xFF))


def _dev_or_empty(a: Any, dtype: Any, n: int) -> Any:
    """``a`` when it is device memory of ``n`` elements, else fresh device scratch of ``n``."""
    if type(a).__module__.startswith("numba.cuda") and int(a.shape[0]) == n:
        return a
    return cuda.device_array(max(n, 1), dtype)[:n] if n else cuda.device_array(1, dtype)[:0]


def encode(flat: Any, codes: Any, sc32: Any, sc16: Any, lay: QuantLayout, seed: int, stream: int) -> int:
    """Quantize device ``flat`` (float32) into device ``codes`` and scales; returns the number of
    groups that could not be encoded (the one value copied to the host)."""
    n = int(flat.shape[0])
    if n == 0:
        return 0
    G = lay.group_size if lay.group_size > 0 else n
    ng = lay.ngroups(n)
    s32 = _dev_or_empty(sc32, np.float32, ng)
    s16 = sc16 if type(sc16).__module__.startswith("numba.cuda") else cuda.device_array(1, np.uint16)[:0]
    nbad = group_scales(flat, s32, s16, G, lay.rule, lay.qmax, lay.clip)
    k0, k1 = split64(seed)
    t0, t1 = split64(stream)
    _quantize[grid((n + 7) // 8)](flat, G, lay.width, lay.qmax, bool(lay.stochastic), s32, codes, k0, k1, t0, t1)
    return int(host(nbad)[0])


@cuda.jit(device=True)
def code_at(codes, i, w):  # pragma: no cover - device
    """Code ``i`` of a w-bit little-endian stream, sign-extended."""
    bit = i * w
    o = bit // 8
    u = np.uint32(codes[o])
    if o + 1 < codes.shape[0]:
        u |= np.uint32(codes[o + 1]) << np.uint32(8)
    f = np.int32(np.uint32(u >> np.uint32(bit % 8)) & np.uint32((1 << w) - 1))
    half = np.int32(1 << (w - 1))
    return (f ^ half) - half


@cuda.jit
def _decode(codes, sc32, sc16, f16, out, G, w, qmax, accumulate, nbad):  # pragma: no cover - device
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        q = code_at(codes, i, w)
        if q > qmax or q < -qmax:
            cuda.atomic.add(nbad, 0, 1)
        s = f16_bits_to_f32(sc16[i // G]) if f16 else sc32[i // G]
        v = mul32(np.float32(q), s)
        if accumulate:  # a NaN sum made positive (format.md §10)
            out[i] = pos_nan(out[i] + v)
        else:
            out[i] = v


def scaled_decode(codes: Any, sc32: Any, sc16: Any, out: Any, G: int, w: int, qmax: int, accumulate: bool) -> int:
    """out[i] (+)= float32(q_i) * s_{i // G}; returns how many codes lie outside [-qmax, qmax].
    Sections may be host arrays (a host payload decoded into device ``out``): copied once."""
    n = int(out.shape[0])
    if n == 0:
        return 0
    f16 = int(sc16.shape[0]) > 0
    c = device(codes)
    s32 = device(sc32) if not f16 else cuda.device_array(1, np.float32)
    s16 = device(sc16) if f16 else cuda.device_array(1, np.uint16)
    nbad = upload(np.zeros(1, np.int64))
    _decode[grid(n)](c, s32, s16, f16, out, G, w, qmax, bool(accumulate), nbad)
    return int(host(nbad)[0])


@cuda.jit
def _count(codes, n, w, qmax, nbad):  # pragma: no cover - device
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        q = code_at(codes, i, w)
        if q > qmax or q < -qmax:
            cuda.atomic.add(nbad, 0, 1)


def count_bad(codes: Any, n: int, w: int, qmax: int) -> int:
    """How many of the first ``n`` ``w``-bit codes lie outside [-qmax, qmax]."""
    nbad = upload(np.zeros(1, np.int64))
    if n:
        _count[grid(n)](device(codes), n, w, qmax, nbad)
    return int(host(nbad)[0])


@cuda.jit
def _overflows(sc32, qmax, nbad):  # pragma: no cover - device
    for g in range(cuda.grid(1), sc32.shape[0], cuda.gridsize(1)):
        p = mul32(np.float32(qmax), sc32[g])
        if np.uint32(p.view(np.uint32) & np.uint32(0x7FFFFFFF)) == _INF_BITS:
            cuda.atomic.add(nbad, 0, 1)


def count_scale_overflows(sc32: Any, qmax: int) -> int:
    """How many scales ``s`` have ``float32(qmax * s)`` infinite."""
    nbad = upload(np.zeros(1, np.int64))
    if int(sc32.shape[0]):
        _overflows[grid(int(sc32.shape[0]))](device(sc32), qmax, nbad)
    return int(host(nbad)[0])
