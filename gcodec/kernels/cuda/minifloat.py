"""Low-precision element formats on the device: ``fp8``, ``mx``, ``nvfp4``, as ``gcodec.kernels.cpu.minifloat``.

1. **tensor scale** (``nvfp4``): an atomic max over the magnitude bits, then one thread divides
   (specs/codecs/nvfp4.md §3 step 2) and writes the ``tensor_scale`` section in device memory;
2. **scales**: one thread per group: the largest magnitude (integer max over ``bits & 0x7FFFFFFF``)
   and the scale rule, line by line the CPU's;
3. **elements**: one thread per *octet*: eight elements are one Philox block of 16-bit draws
   (specs/rng.md §3.1) and exactly ``w`` whole bytes of the packed stream (mx.md §4), whatever ``w``;
   each element is rounded by the same integer arithmetic on its binary32 bits as the CPU's
   (:func:`mag_code`);
4. **decode**: one thread per element, ``out[i] (+)= value(code) * scale`` with the product rounded on
   its own (``mul32``).

Counts of non-finite groups, overflowing scales and non-finite codes are the only values that come
back to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from ...layout.minifloat import ELEMENTS, SCALE_E4M3, SCALE_E8M0, SCALE_F32, values_table
from ...rng import split64
from .launch import device, grid, host, mul32, one, pos_nan, upload
from .philox import block

__all__ = ["count_bad_elements", "decode", "encode"]

NV_TENSOR_DIVISOR = 448.0 * 6.0
_INF_BITS = np.uint32(0x7F800000)


@cuda.jit(device=True)
def mag_code(ub, k, MB, EMIN, MAXC, INT, STOCH, r):  # pragma: no cover - device
    """``gcodec.kernels.cpu.minifloat._mag_code``, step for step."""
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
    q = fl + (np.int64(1) if up else np.int64(0))
    code = q if INT else ((eb - EMIN) << MB) + q
    code = min(code, np.int64(MAXC))
    return np.int64(0) if ub == np.uint32(0) else code


@cuda.jit(device=True)
def elem_code(ubits, k, BITS, MB, EMIN, MAXC, INT, STOCH, r):  # pragma: no cover - device
    mag = mag_code(ubits & np.uint32(0x7FFFFFFF), k, MB, EMIN, MAXC, INT, STOCH, r)
    neg = (ubits >> np.uint32(31)) != 0
    if INT:
        return (-mag if neg else mag) & 0xFF
    return mag | (np.int64(1 << (BITS - 1)) if neg else np.int64(0))


@cuda.jit(device=True)
def e4m3_value(c):  # pragma: no cover - device
    """The value of E4M3 code ``c`` with the sign clear (a block scale), exact."""
    e = np.int64(c) >> 3
    f = np.int64(c) & 7
    if e == 0:
        return np.float32(np.float32(f) * np.float32(2.0**-9))
    return np.float32(np.float32(8 + f) * np.uint32(np.int64(e - 10 + 127) << 23).view(np.float32))


@cuda.jit
def _amax(x, m):  # pragma: no cover - device
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        cuda.atomic.max(m, 0, np.uint32(np.float32(x[i]).view(np.uint32) & np.uint32(0x7FFFFFFF)))


@cuda.jit
def _tensor_scale(m, ts, nbad):  # pragma: no cover - device
    if m[0] >= _INF_BITS:
        nbad[0] = 1
        ts[0] = np.float32(0.0)
    else:
        ts[0] = np.uint32(m[0]).view(np.float32) / np.float32(NV_TENSOR_DIVISOR)


@cuda.jit
def _scales(x, G, RULE, EMAX, MAXVAL, ts, sc32, sc8, nbad):  # pragma: no cover - device
    n = x.shape[0]
    ng = (n + G - 1) // G
    for gi in range(cuda.grid(1), ng, cuda.gridsize(1)):
        lo = gi * G
        hi = min(lo + G, n)
        mb = np.uint32(0)
        for i in range(lo, hi):
            b = np.uint32(np.float32(x[i]).view(np.uint32) & np.uint32(0x7FFFFFFF))
            mb = b if b > mb else mb
        if mb >= _INF_BITS:
            cuda.atomic.add(nbad, 0, 1)
            mb = np.uint32(0)
        if RULE == 0:
            sc32[gi] = np.uint32(mb).view(np.float32) / np.float32(MAXVAL)
        elif RULE == 1:
            sc8[gi] = np.uint8(max(np.int64(mb >> np.uint32(23)) - EMAX, 0))
        else:
            t = ts[0]
            c = np.int64(0)
            if t > np.float32(0.0):
                q = np.float32(np.uint32(mb).view(np.float32) / np.float32(6.0))
                rr = np.float32(q / t)
                c = mag_code(rr.view(np.uint32), 0, 3, -6, 0x7E, False, False, 0)
            sc8[gi] = np.uint8(c)
            sc32[gi] = mul32(e4m3_value(c), t)


@cuda.jit
def _elements(x, G, BITS, MB, EMIN, MAXC, INT, RULE, STOCH, sc32, sc8, codes, k0, k1, s0, s1):  # pragma: no cover
    """Thread per octet b: elements 8b .. 8b+7, Philox block b, packed bytes BITS*b .. BITS*b + BITS - 1."""
    n = x.shape[0]
    nbytes = codes.shape[0]
    noct = (n + 7) // 8
    for b in range(cuda.grid(1), noct, cuda.gridsize(1)):
        r = (np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))
        if STOCH:
            r = block(np.uint64(b), s0, s1, k0, k1)
        word = np.uint64(0)
        for k in range(8):
            i = 8 * b + k
            c = np.int64(0)
            if i < n:
                gi = i // G
                d = np.uint32(0)
                if STOCH:
                    d = np.uint32(r[k // 2] >> np.uint32(16 * (k % 2))) & np.uint32(0xFFFF)
                xb = np.float32(x[i]).view(np.uint32)
                if RULE == 1:
                    c = elem_code(xb, np.int64(sc8[gi]) - 127, BITS, MB, EMIN, MAXC, INT, STOCH, d)
                else:
                    s = sc32[gi]
                    if s == np.float32(0.0):  # zero codes, signs kept (as the CPU)
                        c = np.int64(0) if INT else np.int64(xb >> np.uint32(31)) << (BITS - 1)
                    else:
                        t = np.float32(np.float32(x[i]) / s)
                        c = elem_code(t.view(np.uint32), 0, BITS, MB, EMIN, MAXC, INT, STOCH, d)
            word |= np.uint64(c & 0xFF) << np.uint64(BITS * k)
        for j in range(BITS):
            o = BITS * b + j
            if o < nbytes:
                codes[o] = np.uint8((word >> np.uint64(8 * j)) & np.uint64(0xFF))


@cuda.jit
def _overflows(sc32, top, nbad):  # pragma: no cover - device
    for g in range(cuda.grid(1), sc32.shape[0], cuda.gridsize(1)):
        p = mul32(top, sc32[g])
        if np.uint32(p.view(np.uint32) & np.uint32(0x7FFFFFFF)) == _INF_BITS:
            cuda.atomic.add(nbad, 0, 1)


def _empty(dtype: Any) -> Any:
    return cuda.device_array(1, dtype)[:0]


def encode(
    flat: Any,
    scales: Any,
    codes: Any,
    tensor_scale: Any,
    element: str,
    group_size: int,
    scale_rule: int,
    stochastic: bool,
    seed: int,
    stream: int,
) -> tuple[int, int]:
    """``gcodec.kernels.cpu.minifloat.encode`` on device arrays (the sections of a device payload)."""
    n = int(flat.shape[0])
    G = int(group_size)
    ng = -(-n // G)
    nbad = upload(np.zeros(2, np.int64))
    if scale_rule == SCALE_E4M3:
        if n == 0:
            _tensor_scale[one()](upload(np.zeros(1, np.uint32)), tensor_scale, nbad)
            return 0, 0
        m = upload(np.zeros(1, np.uint32))
        _amax[grid(n)](flat, m)
        _tensor_scale[one()](m, tensor_scale, nbad)
        ts = tensor_scale
    else:
        ts = cuda.device_array(1, np.float32)
    if n == 0:
        return 0, 0
    el = ELEMENTS[element]
    if scale_rule == SCALE_F32:
        sc32, sc8 = scales, _empty(np.uint8)
    else:
        sc8 = scales
        sc32 = cuda.device_array(ng, np.float32) if scale_rule == SCALE_E4M3 else _empty(np.float32)
    maxval = float(np.float32(el.max_value))
    _scales[grid(ng)](flat, G, int(scale_rule), el.emax, maxval, ts, sc32, sc8, nbad)
    k0, k1 = split64(seed)
    t0, t1 = split64(stream)
    _elements[grid((n + 7) // 8)](
        flat,
        G,
        el.bits,
        el.mbits,
        el.emin,
        el.maxcode,
        el.integer,
        int(scale_rule),
        bool(stochastic),
        sc32,
        sc8,
        codes,
        k0,
        k1,
        t0,
        t1,
    )
    bad = int(host(nbad)[0])
    nover = 0
    if not bad and scale_rule != SCALE_E8M0:
        top = np.float32(el.max_value if scale_rule == SCALE_F32 else 6.0)
        cnt = upload(np.zeros(1, np.int64))
        _overflows[grid(ng)](sc32, top, cnt)
        nover = int(host(cnt)[0])
    return bad, nover


@cuda.jit(device=True)
def code_at(codes, i, BITS):  # pragma: no cover - device
    """Element ``i`` of the BITS-wide little-endian stream (mx.md §4)."""
    bit = i * BITS
    o = bit // 8
    u = np.uint32(codes[o])
    if o + 1 < codes.shape[0]:
        u |= np.uint32(codes[o + 1]) << np.uint32(8)
    return np.uint32(u >> np.uint32(bit % 8)) & np.uint32((1 << BITS) - 1)


@cuda.jit
def _decode(codes, sc32, sc8, out, G, BITS, RULE, tscale, table, accumulate, nbad):  # pragma: no cover - device
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        gi = i // G
        v = table[code_at(codes, i, BITS)]
        if v != v:
            cuda.atomic.add(nbad, 0, 1)
        if RULE == 1:
            e = np.int64(sc8[gi])
            s = np.uint32(e << 23).view(np.float32) if e > 0 else np.float32(2.0**-127)
        elif RULE == 0:
            s = sc32[gi]
        else:
            s = mul32(e4m3_value(sc8[gi]), tscale)
        y = mul32(v, s)
        if accumulate:  # a NaN sum made positive (format.md §10)
            out[i] = pos_nan(out[i] + y)
        else:
            out[i] = y


_TABLES: dict[str, Any] = {}


def _values(element: str) -> Any:
    """The element format's value table on the device, uploaded once per process (at most 1 KiB;
    before, every decode and every check uploaded it again)."""
    t = _TABLES.get(element)
    if t is None:
        t = _TABLES[element] = upload(values_table(ELEMENTS[element]))
    return t


def _dev(a: Any, dtype: Any) -> Any:
    return device(a) if int(a.shape[0]) else cuda.device_array(1, dtype)


def decode(
    codes: Any,
    sc32: Any,
    sc8: Any,
    out: Any,
    element: str,
    group_size: int,
    scale_rule: int,
    accumulate: bool,
    tscale: float = 0.0,
) -> int:
    """``gcodec.kernels.cpu.minifloat.decode`` into device ``out`` (host sections are copied once)."""
    n = int(out.shape[0])
    if n == 0:
        return 0
    el = ELEMENTS[element]
    nbad = upload(np.zeros(1, np.int64))
    _decode[grid(n)](
        _dev(codes, np.uint8),
        _dev(sc32, np.float32),
        _dev(sc8, np.uint8),
        out,
        int(group_size),
        el.bits,
        int(scale_rule),
        np.float32(tscale),
        _values(element),
        bool(accumulate),
        nbad,
    )
    return int(host(nbad)[0])


@cuda.jit
def _count(codes, n, BITS, table, nbad):  # pragma: no cover - device
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        v = table[code_at(codes, i, BITS)]
        if v != v:
            cuda.atomic.add(nbad, 0, 1)


def count_bad_elements(codes: Any, n: int, element: str) -> int:
    """How many of the first ``n`` element codes are not finite values."""
    if n == 0:
        return 0
    el = ELEMENTS[element]
    nbad = upload(np.zeros(1, np.int64))
    _count[grid(n)](device(codes), n, el.bits, _values(element), nbad)
    return int(host(nbad)[0])
