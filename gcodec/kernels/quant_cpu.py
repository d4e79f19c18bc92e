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

Speed comes from the memory pattern and from keeping every inner loop vectorised:

* work is split into sub-blocks of about :data:`SB` elements (plus their random draws and codes,
  they sit in L1); for small groups one sub-block holds whole groups, and the statistic pass and
  the quantize pass run over it back to back, so the input is read from memory once;
* inner loops index with unsigned integers (Numba then emits no negative-index wraparound, which
  otherwise hides the access pattern from the vectoriser) and have no calls or branches;
* Numba leaves LLVM's SLP vectoriser off, so loops whose parallelism is across scalars (the eight
  float64 lanes of a sum, a 64-bit sign mask) are written as LLVM vector IR in small intrinsics:
  the sums (for the L2 norm, mean |x|, and the standard deviation) keep the fixed lane order of
  :func:`lane_sum`, so they are still bit-exact on every backend; the absmax is an integer max
  over ``bits & 0x7FFFFFFF`` (NaN/inf show up as values >= 0x7F800000);
* 3/5/6/7-bit codes are joined eight at a time in one uint64 (SWAR) and stored as one unaligned
  8-byte word that the next octet's store overlaps.

Threads take contiguous ranges of whole chunks (:func:`run_chunks`); nothing depends on their
number. Small helpers are plain ``njit`` functions (LLVM inlines them, constant arguments
included); ``inline="always"`` (Numba-level inlining, slow to compile) is kept for the few whose
inlining measurably matters.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..rng import fill_blocks, key_schedule, u16_to_open01
from . import run_chunks
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

_INF_BITS = np.uint32(0x7F800000)
_F16_INF = np.uint16(0x7C00)


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
# SIMD helpers
#
# Numba leaves LLVM's SLP vectoriser off, so eight scalar accumulators (the lane sums of
# specs/codecs/qsgd.md §3) stay scalar, one add chain each. These intrinsics write the loops in
# LLVM vector IR instead: a <8 x float> load per octet, widened to <8 x double>, added lane-wise,
# with no fast-math flags (IEEE adds and multiplies, never reassociated or fused), so the results
# are bit-identical to the scalar definition on every target LLVM supports.


def _elem_ptr(builder, arrty, arr, index, context):
    """Pointer to element ``index`` of a 1-D C array."""
    a = cgutils.create_struct_proxy(arrty)(context, builder, value=arr)
    return builder.gep(a.data, [index])


_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_VF32 = ir.VectorType(ir.FloatType(), 8)
_VF64 = ir.VectorType(ir.DoubleType(), 8)
_VU32 = ir.VectorType(_I32, 8)
_VU64 = ir.VectorType(_I64, 8)


def _octet_reducer(kind: str):  # type: ignore[no-untyped-def]
    """An intrinsic ``f(x, lo, m)`` over the float32 elements x[lo : lo + m] (``m`` >= 0).

    ``kind``: "sq" (lane sum of v^2), "abs" (of |v|), "v" (of v), "max" (max of the bits of |v|,
    uint32), or "msq" (the tuple (max bits, lane sum of v, lane sum of v^2)). Sums are the lane
    sums of qsgd.md §3 (at most RBLOCK elements): lane j adds the terms of elements j, j+8, ...
    in order from +0, the lanes are added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
    The tail (m % 8 elements) is loaded into a zeroed octet: adding +0.0 to a lane that started at
    +0 changes nothing, nor does a max with 0.
    """
    sums = {"sq": 1, "abs": 1, "v": 1, "max": 0, "msq": 2}[kind]
    has_max = kind in ("max", "msq")

    @intrinsic
    def reduce_octets(typingctx, x, lo, m):  # type: ignore[no-untyped-def]
        if not (isinstance(x, types.Array) and x.dtype == types.float32 and x.ndim == 1):
            return None
        if kind == "max":
            ret = types.uint32
        elif kind == "msq":
            ret = types.Tuple((types.uint32, types.float64, types.float64))
        else:
            ret = types.float64
        sig = ret(x, lo, m)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            arr, lo_v, m_v = args
            base = _elem_ptr(builder, signature.args[0], arr, lo_v, context)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_VF64, [0.0] * 8)) for _ in range(sums)]
            mx = cgutils.alloca_once_value(builder, ir.Constant(_VU32, [0] * 8)) if has_max else None

            def add(v):  # type: ignore[no-untyped-def]
                if sums:
                    d = builder.fpext(v, _VF64)
                    if kind == "sq":
                        terms = [builder.fmul(d, d)]
                    elif kind == "abs":
                        nosign = builder.and_(builder.bitcast(d, _VU64), ir.Constant(_VU64, [(1 << 63) - 1] * 8))
                        terms = [builder.bitcast(nosign, _VF64)]  # |d|: the sign bit cleared
                    elif kind == "v":
                        terms = [d]
                    else:
                        terms = [d, builder.fmul(d, d)]
                    for acc, t in zip(accs, terms):
                        builder.store(builder.fadd(builder.load(acc), t), acc)
                if mx is not None:
                    bits = builder.and_(builder.bitcast(v, _VU32), ir.Constant(_VU32, [0x7FFFFFFF] * 8))
                    old = builder.load(mx)
                    builder.store(builder.select(builder.icmp_unsigned(">", bits, old), bits, old), mx)

            nk = builder.ashr(m_v, ir.Constant(m_v.type, 3))
            with cgutils.for_range(builder, nk) as loop:
                p = builder.gep(base, [builder.shl(loop.index, ir.Constant(loop.index.type, 3))])
                add(builder.load(builder.bitcast(p, _VF32.as_pointer()), align=4))
            r = builder.and_(m_v, ir.Constant(m_v.type, 7))
            with builder.if_then(builder.icmp_signed(">", r, ir.Constant(r.type, 0)), likely=False):
                tail = builder.gep(base, [builder.shl(nk, ir.Constant(nk.type, 3))])
                octet = cgutils.alloca_once_value(builder, ir.Constant(_VF32, [0.0] * 8))
                with cgutils.for_range(builder, r) as loop:
                    e = builder.load(builder.gep(tail, [loop.index]))
                    j = builder.trunc(loop.index, _I32)
                    builder.store(builder.insert_element(builder.load(octet), e, j), octet)
                add(builder.load(octet))

            def lanes(acc):  # type: ignore[no-untyped-def]
                v = builder.load(acc)
                ln = [builder.extract_element(v, ir.Constant(_I32, j)) for j in range(8)]
                pairs = [builder.fadd(ln[2 * j], ln[2 * j + 1]) for j in range(4)]
                return builder.fadd(builder.fadd(pairs[0], pairs[1]), builder.fadd(pairs[2], pairs[3]))

            out = []
            if mx is not None:
                v = builder.load(mx)
                best = builder.extract_element(v, ir.Constant(_I32, 0))
                for j in range(1, 8):
                    e = builder.extract_element(v, ir.Constant(_I32, j))
                    best = builder.select(builder.icmp_unsigned(">", e, best), e, best)
                out.append(best)
            out += [lanes(acc) for acc in accs]
            if len(out) == 1:
                return out[0]
            return context.make_tuple(builder, signature.return_type, out)

        return sig, codegen

    return reduce_octets


_sum_sq = _octet_reducer("sq")
_sum_abs = _octet_reducer("abs")
_sum_v = _octet_reducer("v")
_max_bits = _octet_reducer("max")
_max_sums = _octet_reducer("msq")


@intrinsic
def sign_bits64(typingctx, x, i):  # type: ignore[no-untyped-def]
    """uint64 whose bit t is (x[i + t] < 0) for t < 64 (float32 compare: false for -0.0 and NaN).

    One <64 x float> compare turned into a bit mask (vcmpps + vmovmskps on x86).
    """
    if not (isinstance(x, types.Array) and x.dtype == types.float32 and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f64 = ir.VectorType(ir.FloatType(), 64)
        p = _elem_ptr(builder, signature.args[0], args[0], args[1], context)
        v = builder.load(builder.bitcast(p, f64.as_pointer()), align=4)
        neg = builder.fcmp_ordered("<", v, ir.Constant(f64, [0.0] * 64))
        return builder.bitcast(neg, _I64)

    return types.uint64(x, i), codegen


def _sign_putter(accumulate: bool):  # type: ignore[no-untyped-def]
    """An intrinsic ``f(out, i, b, s)``: out[i + t] (+)= (-1.0 if bit t of the byte b is set else
    1.0) * s for t < 8 (float32 products; float64 ``out`` gets them widened, exactly)."""

    @intrinsic
    def put_signs8(typingctx, out, i, b, s):  # type: ignore[no-untyped-def]
        if not (isinstance(out, types.Array) and out.dtype in (types.float32, types.float64)):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            arr, idx, byte, sv = args
            neg = builder.bitcast(builder.trunc(byte, ir.IntType(8)), ir.VectorType(ir.IntType(1), 8))
            one = builder.select(neg, ir.Constant(_VF32, [-1.0] * 8), ir.Constant(_VF32, [1.0] * 8))
            vs = builder.insert_element(ir.Constant(_VF32, ir.Undefined), sv, ir.Constant(_I32, 0))
            v = builder.fmul(one, builder.shuffle_vector(vs, vs, ir.Constant(_VU32, [0] * 8)))
            vt = _VF32
            if signature.args[0].dtype == types.float64:
                vt = _VF64
                v = builder.fpext(v, vt)
            p = builder.bitcast(_elem_ptr(builder, signature.args[0], arr, idx, context), vt.as_pointer())
            if accumulate:
                v = builder.fadd(builder.load(p, align=4), v)
            builder.store(v, p, align=4)
            return context.get_dummy_value()

        return types.void(out, i, b, types.float32), codegen

    return put_signs8


put_signs8 = _sign_putter(False)
add_signs8 = _sign_putter(True)


@intrinsic
def store_u64(typingctx, arr, i, v):  # type: ignore[no-untyped-def]
    """Store the uint64 ``v`` little-endian at bytes arr[i : i + 8] of a (u)int8 array, unaligned."""
    if not (isinstance(arr, types.Array) and arr.dtype in (types.uint8, types.int8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        p = _elem_ptr(builder, signature.args[0], args[0], args[1], context)
        builder.store(args[2], builder.bitcast(p, _I64.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(arr, i, types.uint64), codegen


@intrinsic
def load_u64(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """The uint64 little-endian at bytes arr[i : i + 8] of a uint8 array, unaligned."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint8 and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        p = _elem_ptr(builder, signature.args[0], args[0], args[1], context)
        return builder.load(builder.bitcast(p, _I64.as_pointer()), align=1)

    return types.uint64(arr, i), codegen


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
        return _sum_sq(x, lo, hi - lo)
    if kind == 1:
        return _sum_abs(x, lo, hi - lo)
    return _sum_v(x, lo, hi - lo)


@njit(cache=True)
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


# Inlined by Numba into the sub-block loop only: per group of 64 the call costs ~10 % of the uniform
# encode (float16 scales most), elsewhere a plain call is cheaper to compile.
_scale_inline = njit(cache=True, inline="always")(_scale.py_func)


@njit(cache=True, inline="always")
def _group_stats(x, lo, hi, rule, clip):  # pragma: no cover - jitted
    """(absmax bits, sum v, sum v^2) of one range of at most RBLOCK elements, as the rule needs.

    terngrad's clip needs all three: max |clip(v)| = min(max |v|, c * sigma), so one pass gives the
    scale.
    """
    mb = np.uint32(0)
    s1 = 0.0
    s2 = 0.0
    if rule == RULE_L2:
        s2 = _sum_sq(x, lo, hi - lo)
    elif rule == RULE_MEANABS:
        s1 = _sum_abs(x, lo, hi - lo)
    elif rule == RULE_MAX and clip > 0.0:
        mb, s1, s2 = _max_sums(x, lo, hi - lo)
    else:
        mb = _max_bits(x, lo, hi - lo)
    return mb, s1, s2


@njit(cache=True, nogil=True)
def _block_stats(x, G, nbpg, rule, clip, bm, b1, b2, k0, k1):  # pragma: no cover - jitted
    """Statistics of blocks [k0, k1) (block k: block k % nbpg of group k // nbpg)."""
    n = x.shape[0]
    for b in range(k0, k1):
        gi = b // nbpg
        lo = gi * G + (b - gi * nbpg) * RBLOCK
        hi = min(lo + RBLOCK, min(gi * G + G, n))
        if lo < hi:
            m, s1, s2 = _group_stats(x, lo, hi, rule, clip)
            bm[b] = m
            b1[b] = s1
            b2[b] = s2
    return 0


@njit(cache=True)
def _combine_scales(sc32, sc16, n, G, nbpg, rule, qmax, clip, bm, b1, b2):  # pragma: no cover - jitted
    """Per group, its blocks' statistics left to right (max; float64 sums as the spec orders them),
    then its scale. Returns the number of non-finite groups."""
    f16 = sc16.shape[0] > 0
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
        s, h, bad = _scale(rule, m, s1, s2, count, qmax, clip, f16)
        sc32[gi] = s
        if f16:
            sc16[gi] = h
        nbad += bad
    return nbad


def large_group_scales(x, sc32, sc16, G, rule, qmax, clip):  # type: ignore[no-untyped-def]
    """Scales of groups longer than a sub-block. Returns the number of non-finite groups.

    Each group is cut into blocks of RBLOCK elements from its start; blocks are reduced in
    parallel and combined per group left to right (max, and float64 sums as the spec orders them).
    """
    nbpg = (G + RBLOCK - 1) // RBLOCK
    nblocks = sc32.shape[0] * nbpg
    bm = np.zeros(nblocks, np.uint32)
    b1 = np.zeros(nblocks, np.float64)
    b2 = np.zeros(nblocks, np.float64)
    run_chunks(_block_stats, nblocks, 1, x, G, nbpg, rule, clip, bm, b1, b2)
    return _combine_scales(sc32, sc16, x.shape[0], G, nbpg, rule, qmax, clip, bm, b1, b2)


# --------------------------------------------------------------------------------------------
# quantize and pack


# Two functions, not one with a ``stochastic`` flag: an inlined call that is handed an array it does
# not use (the draws, for nearest rounding) made Numba take and drop a reference to it for every
# group, 10 % of the uniform 8-bit encode.
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
    """dst[d0 + (i - lo)] = low byte of floor(t) + [u_i < t - floor(t)], t = clamp(v_i / s), u_i from
    the 16-bit draw r16[r0 + (i - lo)]."""
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
def _pack(cb, m, w, codes, b0):  # pragma: no cover - jitted
    """Pack codes cb[0:m] (low ``w`` bits of each, zeros up to m + 8) into ``codes`` from element
    ``b0`` (a multiple of 8). Writes only the bytes of elements [b0, b0 + m)."""
    o0 = np.uint64(b0 // 8 * w)
    if w == 4:
        _pack_bytes(cb, m, 4, codes, o0)
    elif w == 2:
        _pack_bytes(cb, m, 2, codes, o0)
    else:  # 3, 5, 6, 7 bits: codes straddle bytes
        _pack_octets(cb, m, w, codes, o0)


@njit(cache=True)
def _pack_bytes(cb, m, w, codes, o0):  # pragma: no cover - jitted
    """4- or 2-bit codes, ``w`` a literal: 8/w codes per byte, the first in the low bits."""
    per = 8 // w
    mask = np.uint8((1 << w) - 1)
    for j in range((m * w + 7) // 8):
        k = np.uint64(per * j)
        b = np.uint8(0)
        for t in range(per):
            b |= (cb[k + np.uint64(t)] & mask) << np.uint8(w * t)
        codes[o0 + np.uint64(j)] = b


@njit(cache=True)
def _swar_masks(w):  # pragma: no cover - jitted
    """Masks of the ``w``-bit fields of a uint64 cut into 8-, 16- and 32-bit lanes (``w`` a literal)."""
    f = (1 << w) - 1
    m1 = np.uint64(0x0001000100010001 * f)
    m2 = np.uint64(0x0000000100000001 * ((1 << (2 * w)) - 1))
    m3 = np.uint64((1 << (4 * w)) - 1)
    return np.uint64(0x0101010101010101 * f), m1, m2, m3


@njit(cache=True)
def _join_octet(v, w):  # pragma: no cover - jitted
    """Eight byte-sized codes (byte t of ``v`` is code t) -> their low ``w`` bits as one 8w-bit field.

    Joins neighbours as in a tree, SWAR in one uint64: pairs into 2w-bit fields, then 4w, then 8w.
    """
    m0, m1, m2, m3 = _swar_masks(w)
    v &= m0
    v = (v & m1) | ((v >> np.uint64(8 - w)) & (m1 << np.uint64(w)))
    v = (v & m2) | ((v >> np.uint64(16 - 2 * w)) & (m2 << np.uint64(2 * w)))
    return (v & m3) | ((v >> np.uint64(32 - 4 * w)) & (m3 << np.uint64(4 * w)))


@njit(cache=True)
def _split_octet(v, w):  # pragma: no cover - jitted
    """The inverse of :func:`_join_octet` (``v`` holds 8w bits): eight sign-extended byte codes."""
    _, m1, m2, m3 = _swar_masks(w)
    v = (v & m3) | ((v << np.uint64(32 - 4 * w)) & (m3 << np.uint64(32)))
    v = (v & m2) | ((v << np.uint64(16 - 2 * w)) & (m2 << np.uint64(16)))
    v = (v & m1) | ((v << np.uint64(8 - w)) & (m1 << np.uint64(8)))
    neg = (v >> np.uint64(w - 1)) & np.uint64(0x0101010101010101)  # 1 in each byte whose code is < 0
    return v | (neg * np.uint64(0xFF ^ ((1 << w) - 1)))


@njit(cache=True)
def _pack_octets(cb, m, w, codes, o0):  # pragma: no cover - jitted
    """Eight ``w``-bit codes make ``w`` bytes (``w`` in 3, 5, 6, 7; the masks are set up once per call).

    Each octet is read from ``cb`` as one uint64, joined (:func:`_join_octet`) and stored as one
    unaligned 8-byte word whose 8 - w high (zero) bytes the next octet's store overwrites. Octets
    whose word would reach past the last byte of [b0, b0 + m) go byte by byte, so nothing outside
    the range is written (another thread may own it). ``cb`` must hold zeros from ``m`` up to a
    multiple of 8.
    """
    n8 = (m + 7) // 8
    nbytes = (m * w + 7) // 8
    fast = min(n8, max(0, (nbytes - 8) // w + 1))  # octets k with k * w + 8 <= nbytes
    for k in range(fast):
        store_u64(codes, o0 + np.uint64(k * w), _join_octet(load_u64(cb, 8 * k), w))
    for k in range(fast, n8):
        o = o0 + np.uint64(k * w)
        v = _join_octet(load_u64(cb, 8 * k), w)
        for t in range(min(w, nbytes - k * w)):
            codes[o + np.uint64(t)] = np.uint8((v >> np.uint64(8 * t)) & np.uint64(0xFF))


@njit(cache=True, inline="always")
def _sub_block(x, codes, sc32, sc16, cb, rb, r16, ks, cfg, G, full, b0, b1, fused):  # pragma: no cover - jitted
    """One sub-block [b0, b1): statistics and scales (when fused), draws, quantize, pack.

    ``cb``, ``rb`` (``r16``: its uint16 view): scratch for codes and draws; ``ks``: the round keys;
    ``cfg``: the codec's scalar settings (see :func:`_encode_range`).
    ``full`` (a literal at the call site) says the sub-block holds only whole groups, and ``G`` may
    be a literal too: then every group loop has a constant trip count and LLVM unrolls it.
    """
    w, qmax, rule, stochastic, clip, f16, st_lo, st_hi = cfg
    n = x.shape[0]
    bad = 0
    g0 = b0 // G
    g1 = (b1 - 1) // G + 1
    if fused:
        for gi in range(g0, g1):
            lo = gi * G
            hi = lo + G if full else min(lo + G, n)
            mb, s1, s2 = _group_stats(x, lo, hi, rule, clip)
            s, h, isbad = _scale_inline(rule, mb, s1, s2, hi - lo, qmax, clip, f16)
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
        if w == 8:  # 8-bit codes go straight to the payload; narrower ones to cb, then packed
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
        _pack(cb, m, w, codes, b0)
    return bad


@njit(cache=True, nogil=True)
def _encode_range(x, codes, sc32, sc16, G, L, fused, lay, seeds, c0, c1):  # pragma: no cover - jitted
    """Elements [c0, c1) (c0 a multiple of L) of :func:`scaled_encode`; returns its bad-group count.

    ``lay``: (w, qmax, rule, stochastic, clip); ``seeds``: (seed_lo, seed_hi, stream_lo, stream_hi).
    """
    n = x.shape[0]
    cb = np.zeros(L + 8, np.uint8)
    rb = np.empty(L // 2 + 4, np.uint32)
    r16 = rb.view(np.uint16)
    ks = key_schedule(seeds[0], seeds[1])
    w, qmax, rule, stochastic, clip = lay
    cfg = (w, qmax, rule, stochastic, clip, sc16.shape[0] > 0, seeds[2], seeds[3])
    bad = 0
    for b0 in range(c0, c1, L):
        b1 = min(b0 + L, n)
        if fused and b1 - b0 == L and G == 64:  # the default group size: constant trip counts
            bad += _sub_block(x, codes, sc32, sc16, cb, rb, r16, ks, cfg, 64, True, b0, b1, True)
        else:
            bad += _sub_block(x, codes, sc32, sc16, cb, rb, r16, ks, cfg, G, False, b0, b1, fused)
    return bad


def scaled_encode(  # type: ignore[no-untyped-def]
    x, codes, sc32, sc16, G, L, C, fused, w, qmax, rule, stochastic, clip, seed_lo, seed_hi, st_lo, st_hi
):
    """Quantize flat ``x`` into ``w``-bit packed ``codes``; see the module docstring.

    ``G, L, C, fused`` come from :func:`geometry`. When ``fused`` (groups no longer than a
    sub-block) the scales are computed here into ``sc32`` (and their float16 bits into ``sc16``
    when that is not empty); otherwise they must already be there (:func:`large_group_scales`).
    Returns the number of non-finite groups found here.
    """
    lay = (w, qmax, rule, bool(stochastic), float(clip))
    seeds = (np.uint32(seed_lo), np.uint32(seed_hi), np.uint32(st_lo), np.uint32(st_hi))
    return run_chunks(_encode_range, x.shape[0], C, x, codes, sc32, sc16, G, L, fused, lay, seeds)


# --------------------------------------------------------------------------------------------
# unpack and decode


@njit(cache=True)
def _field(u, t, w):  # pragma: no cover - jitted
    """Code ``t`` (sign-extended) of the byte ``u`` (int32) holding 8 / w codes of ``w`` bits."""
    mask = np.int32((1 << w) - 1)
    half = np.int32(1 << (w - 1))
    return ((u >> np.int32(w * t)) & mask ^ half) - half


@njit(cache=True)
def _unpack_bytes(codes, o0, m, w, qb):  # pragma: no cover - jitted
    """qb[0 : roundup(m, 8 / w)] = the sign-extended 4- or 2-bit codes from byte ``o0``."""
    per = 8 // w
    for j in range((m + per - 1) // per):
        u = np.int32(codes[o0 + np.uint64(j)])
        k = np.uint64(per * j)
        for t in range(per):
            qb[k + np.uint64(t)] = np.int8(_field(u, t, w))


@njit(cache=True)
def _unpack(codes, b0, m, w, qb):  # pragma: no cover - jitted
    """qb[0:m] = the sign-extended ``w``-bit codes of elements b0 .. b0+m-1 (b0 a multiple of 8)."""
    o0 = np.uint64(b0 // 8 * w)
    if w == 8:
        for j in range(m):
            qb[np.uint64(j)] = np.int8(codes[o0 + np.uint64(j)])
    elif w == 4:
        _unpack_bytes(codes, o0, m, 4, qb)
    elif w == 2:
        _unpack_bytes(codes, o0, m, 2, qb)
    else:  # 3, 5, 6, 7 bits
        _unpack_octets(codes, o0, m, w, qb)


@njit(cache=True)
def _unpack_octets(codes, o0, m, w, qb):  # pragma: no cover - jitted
    """``w`` bytes hold eight codes (``w`` in 3, 5, 6, 7). Writes qb[0 : roundup(m, 8)].

    Octets whose 8-byte word lies within the range's bytes are read as one unaligned uint64 and
    split (:func:`_split_octet`); the last ones byte by byte, so nothing past the range is read.
    """
    n8 = (m + 7) // 8
    nbytes = (m * w + 7) // 8
    fast = min(n8, max(0, (nbytes - 8) // w + 1))
    field = np.uint64((1 << (8 * w)) - 1)
    for k in range(fast):
        v = load_u64(codes, o0 + np.uint64(k * w)) & field
        store_u64(qb, 8 * k, _split_octet(v, w))
    for k in range(fast, n8):
        o = o0 + np.uint64(k * w)
        v = np.uint64(0)
        for t in range(min(w, nbytes - k * w)):
            v |= np.uint64(codes[o + np.uint64(t)]) << np.uint64(8 * t)
        store_u64(qb, 8 * k, _split_octet(v, w))


@njit(cache=True)
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
    for gi in range(b0 // G, b1 // G):
        s = f16_bits_to_f32(sc16[gi]) if f16 else sc32[gi]
        base = np.uint64(gi * G)
        o0 = np.uint64(gi * G // per)
        for j in range(G // per):
            u = np.int32(codes[o0 + np.uint64(j)])
            k = base + np.uint64(per * j)
            for t in range(per):
                q = _field(u, t, w)
                bad += (q > qmax) | (q < -qmax)
                if accumulate:
                    out[k + np.uint64(t)] += np.float32(q) * s
                else:
                    out[k + np.uint64(t)] = np.float32(q) * s
    return bad


@njit(cache=True, nogil=True)
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


def scaled_decode(codes, sc32, sc16, out, G, w, qmax, accumulate):  # type: ignore[no-untyped-def]
    """out[i] (+)= float32(q_i) * s_{i // G}; returns how many codes lie outside [-qmax, qmax].

    ``sc16``, when not empty, holds the scales as float16 bits (and ``sc32`` is ignored).
    """
    return run_chunks(_decode_chunk, out.shape[0], CHUNK, codes, sc32, sc16, out, G, w, qmax, accumulate)


@njit(cache=True)
def _count_bytes(codes, c0, c1, w, qmax):  # pragma: no cover - jitted
    """Out-of-range codes among elements [c0, c1) of 8/4/2-bit codes; ``w`` is a literal."""
    per = 8 // w
    o0 = np.uint64(c0 // per)
    bad = 0
    for j in range((c1 - c0 + per - 1) // per):
        u = np.int32(codes[o0 + np.uint64(j)])
        for t in range(per):
            q = _field(u, t, w)
            bad += (q > qmax) | (q < -qmax)
    return bad


@njit(cache=True, nogil=True)
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


def count_bad(codes, n, w, qmax):  # type: ignore[no-untyped-def]
    """How many of the first ``n`` ``w``-bit codes lie outside [-qmax, qmax]."""
    return run_chunks(_count_chunk, n, CHUNK, codes, w, qmax)
