"""LLVM vector-IR intrinsics for the CPU kernels: lane sums, absmax bits, sign masks, unaligned words.

Numba leaves LLVM's SLP vectoriser off, so loops whose parallelism is across scalars (the eight
float64 lanes of a sum, a 64-bit sign mask) are written here as LLVM vector IR. The sums keep the
fixed lane order of specs/codecs/qsgd.md §3, so they are bit-exact on every target.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "HAS_F16",
    "add_signs8",
    "block_amax16",
    "div_groups16",
    "f16_add16",
    "f16_decode16",
    "f16_encode16",
    "f16_feedback16",
    "f16_feedback16_noe",
    "f16_sum2_16",
    "f16_sum2_widen16",
    "load_u64",
    "max_bits",
    "max_sums",
    "pack6_x64",
    "put_signs8",
    "round_groups16",
    "sign_bits64",
    "store_u64",
    "sum_abs",
    "sum_sq",
    "sum_v",
]

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


def _pos_nan(builder, v):  # type: ignore[no-untyped-def]
    """The NaN rule of every addition (specs/format.md §10, "NaN sums"; ``scalar.pos_nan``) on a
    vector sum of float or double lanes: NaN lanes get their sign bit cleared, the rest are kept.
    One unordered compare and a blend, so what IEEE 754 left open (which operand's NaN, a negative
    default NaN for inf + -inf on x86) no longer shows in the bits."""
    ty = v.type
    width = 64 if isinstance(ty.element, ir.DoubleType) else 32
    ity = ir.VectorType(ir.IntType(width), ty.count)
    nosign = builder.and_(builder.bitcast(v, ity), ir.Constant(ity, [(1 << (width - 1)) - 1] * ty.count))
    return builder.select(builder.fcmp_unordered("uno", v, v), builder.bitcast(nosign, ty), v)


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


sum_sq = _octet_reducer("sq")
sum_abs = _octet_reducer("abs")
sum_v = _octet_reducer("v")
max_bits = _octet_reducer("max")
max_sums = _octet_reducer("msq")


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
            if accumulate:  # out + v, a NaN sum made positive (format.md §10)
                v = _pos_nan(builder, builder.fadd(builder.load(p, align=4), v))
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


_VI64X8 = ir.VectorType(_I64, 8)


def _splat64(c: int) -> ir.Constant:
    return ir.Constant(_VI64X8, [c] * 8)


@intrinsic
def pack6_x64(typingctx, cb, i, codes, o):  # type: ignore[no-untyped-def]
    """codes[o : o + 48] = the 64 six-bit codes cb[i : i + 64] (one byte each), packed in the
    little-endian bit stream of specs/codecs/mx.md §4.

    The joins of ``bitpack._join_octet`` (pairs into 12-bit fields, then 24, then 48) on eight
    uint64 lanes at once, then one byte shuffle that drops the two zero bytes of every lane (vpermb
    with AVX-512 VBMI) and one 48-byte store: the packing of eight octets in a dozen vector
    instructions instead of eight rounds of scalar ones."""
    u8 = (types.uint8, types.int8)
    if not (isinstance(cb, types.Array) and cb.dtype in u8 and isinstance(codes, types.Array) and codes.dtype in u8):
        return None
    if not (isinstance(i, types.Integer) and isinstance(o, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        src = _elem_ptr(builder, signature.args[0], args[0], args[1], context)
        dst = _elem_ptr(builder, signature.args[2], args[2], args[3], context)
        v = builder.load(builder.bitcast(src, _VI64X8.as_pointer()), align=1)
        f = 0x3F
        v = builder.and_(v, _splat64(0x0101010101010101 * f))
        m1 = 0x0001000100010001 * f
        v = builder.or_(builder.and_(v, _splat64(m1)), builder.and_(builder.lshr(v, _splat64(2)), _splat64(m1 << 6)))
        m2 = 0x0000000100000001 * 0xFFF
        v = builder.or_(builder.and_(v, _splat64(m2)), builder.and_(builder.lshr(v, _splat64(4)), _splat64(m2 << 12)))
        m3 = 0xFFFFFF
        v = builder.or_(builder.and_(v, _splat64(m3)), builder.and_(builder.lshr(v, _splat64(8)), _splat64(m3 << 24)))
        b = builder.bitcast(v, ir.VectorType(ir.IntType(8), 64))
        mask = ir.Constant(ir.VectorType(_I32, 48), [8 * k + t for k in range(8) for t in range(6)])
        packed = builder.shuffle_vector(b, ir.Constant(b.type, ir.Undefined), mask)
        builder.store(packed, builder.bitcast(dst, ir.VectorType(ir.IntType(8), 48).as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(cb, i, codes, o), codegen


_V16U32 = ir.VectorType(_I32, 16)
_BLOCK_AMAX: dict[int, object] = {}


def block_amax16(group: int):  # type: ignore[no-untyped-def]
    """An intrinsic ``f(xb, i, mbuf, j)``: mbuf[j + b] = max(xb[i + group*b + t] & 0x7FFFFFFF for t
    < group), for the 16 groups b < 16 of ``group`` (a multiple of 16) uint32 words from word ``i``.

    A group's largest magnitude as bits, 16 groups at a time: each group is reduced to one
    16-lane vector (``group / 16`` loads and lane-wise unsigned maxes), then the 16 vectors are
    reduced by a transposing tree: at each of four levels two vectors, read as 32 lanes in runs
    of ``w`` lanes per group, give the first and the second halves of every run, and their
    lane-wise max holds each group in ``w / 2`` lanes. After the last level lane ``b`` is group
    ``b``'s maximum, stored with one vector store. 15 vector maxes and 30 shuffles replace 16
    horizontal reductions (four shuffles and maxes each, on one group's lanes)."""
    if group % 16 or group <= 0:
        raise ValueError("the group must be a positive multiple of 16")
    fn = _BLOCK_AMAX.get(group)
    if fn is not None:
        return fn
    per = group // 16

    @intrinsic
    def amax16(typingctx, xb, i, mbuf, j):  # type: ignore[no-untyped-def]
        for a in (xb, mbuf):
            if not (isinstance(a, types.Array) and a.dtype == types.uint32 and a.ndim == 1):
                return None
        if not (isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            first = _elem_ptr(builder, signature.args[0], args[0], args[1], context)
            src = builder.bitcast(first, _V16U32.as_pointer())
            mask = ir.Constant(_V16U32, [0x7FFFFFFF] * 16)

            def umax(a, b):  # type: ignore[no-untyped-def]
                return builder.select(builder.icmp_unsigned(">", a, b), a, b)

            regs = []
            for b in range(16):
                acc = None
                for k in range(per):
                    v = builder.and_(builder.load(builder.gep(src, [ir.Constant(_I64, b * per + k)]), align=4), mask)
                    acc = v if acc is None else umax(acc, v)
                regs.append(acc)
            w = 16
            while w > 1:
                lo = [r * w + t for r in range(32 // w) for t in range(w // 2)]
                lo_m = ir.Constant(_V16U32, lo)
                hi_m = ir.Constant(_V16U32, [x + w // 2 for x in lo])
                regs = [
                    umax(builder.shuffle_vector(a, b, lo_m), builder.shuffle_vector(a, b, hi_m))
                    for a, b in zip(regs[0::2], regs[1::2])
                ]
                w //= 2
            dst = _elem_ptr(builder, signature.args[2], args[2], args[3], context)
            builder.store(regs[0], builder.bitcast(dst, _V16U32.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(xb, i, mbuf, j), codegen

    _BLOCK_AMAX[group] = amax16
    return amax16


_V16F32 = ir.VectorType(ir.FloatType(), 16)
_DIV_GROUPS: dict[int, object] = {}


def _scaled_groups(builder, src, sp, per: int, divide: bool):  # type: ignore[no-untyped-def]
    """(vector offset, t) for the ``16 * per`` vectors of 16 float32 elements from ``src``, 16 groups
    of ``per`` vectors whose scales are ``sp[0..16)``: t = v / s (IEEE ``fdiv``; for a zero scale
    the element's sign alone, +-0.0) where ``divide``, else t = v * s. No fast-math flags."""
    sign = ir.Constant(_V16U32, [0x80000000] * 16)
    zero16 = ir.Constant(_V16U32, [0] * 16)
    for b in range(16):
        sv = builder.load(builder.gep(sp, [ir.Constant(_I64, b)]))
        splat = builder.shuffle_vector(
            builder.insert_element(ir.Constant(_V16F32, ir.Undefined), sv, ir.Constant(_I32, 0)),
            ir.Constant(_V16F32, ir.Undefined),
            zero16,
        )
        is0 = builder.fcmp_ordered("==", sv, ir.Constant(ir.FloatType(), 0.0)) if divide else None
        for k in range(per):
            off = ir.Constant(_I64, b * per + k)
            v = builder.load(builder.gep(src, [off]), align=4)
            if divide:
                z = builder.bitcast(builder.and_(builder.bitcast(v, _V16U32), sign), _V16F32)
                yield off, builder.select(is0, z, builder.fdiv(v, splat))
            else:
                yield off, builder.fmul(v, splat)


def div_groups16(group: int):  # type: ignore[no-untyped-def]
    """An intrinsic ``f(x, i, s, g, t, j)``: t[j + group*b + k] = x[i + group*b + k] / s[g + b] for
    the 16 groups b < 16 of ``group`` (a multiple of 16) float32 elements from element ``i``, and
    for a group whose scale is zero the element's sign alone (``+-0.0``).

    The one binary32 division per element of a divided scale (fp8.md §4.1, nvfp4.md §3 step 4),
    as IEEE ``fdiv`` on 16 lanes with no fast-math flags, so exactly the scalar quotient; a zero
    scale's quotient (infinite or NaN) is replaced by a select, and the element encoders turn
    ``+-0.0`` into the sign bit alone, as the spec's zero-scale rule says. Straight-line code for
    16 groups: a loop per group of 16 spent as long on its set-up as on its elements."""
    if group % 16 or group <= 0:
        raise ValueError("the group must be a positive multiple of 16")
    fn = _DIV_GROUPS.get(group)
    if fn is not None:
        return fn
    per = group // 16

    @intrinsic
    def div16(typingctx, x, i, s, g, t, j):  # type: ignore[no-untyped-def]
        for a in (x, s, t):
            if not (isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1):
                return None
        if not all(isinstance(v, types.Integer) for v in (i, g, j)):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            xa, iv, sa, gv, ta, jv = args
            src = builder.bitcast(_elem_ptr(builder, signature.args[0], xa, iv, context), _V16F32.as_pointer())
            dst = builder.bitcast(_elem_ptr(builder, signature.args[4], ta, jv, context), _V16F32.as_pointer())
            sp = _elem_ptr(builder, signature.args[2], sa, gv, context)
            for off, t in _scaled_groups(builder, src, sp, per, True):
                builder.store(t, builder.gep(dst, [off]), align=4)
            return context.get_dummy_value()

        return types.void(x, i, s, g, t, j), codegen

    _DIV_GROUPS[group] = div16
    return div16


_V16I8 = ir.VectorType(ir.IntType(8), 16)
_ROUND_GROUPS: dict[tuple, object] = {}


def round_groups16(group: int, divide: bool, mbits: int, emin: int, maxbits: int, bits: int, integer: bool):  # type: ignore[no-untyped-def]
    """An intrinsic ``f(x, i, s, g, out, j)``: out[j + group*b + k] = the nearest-even element code
    of t = x[i + group*b + k] scaled by s[g + b], for the 16 groups b < 16 of ``group`` (a multiple
    of 16) float32 elements from element ``i``, one code per byte (the caller packs narrower ones).

    ``divide``: t = v / s (IEEE ``fdiv``; a zero scale gives t = +-0.0, the element's sign alone, as
    :func:`div_groups16`); otherwise t = v * s (an E8M0 scale's power of two, passed as a binary32
    number). The rounding is ``minifloat._near32`` written out on 16 lanes (the clamp to the largest
    finite bits ``maxbits``, one binary32 addition that rounds at the format's quantum, the code read
    from the bits of the sum; ``mbits``, ``emin``, ``bits`` the format's), or for ``integer`` MXINT8's
    ``rint`` of ``t`` clamped to +-127. No fast-math flags, so every lane is the scalar kernel's bits.

    The scaling and the rounding of 16 groups in straight-line code with no buffer between them:
    with a loop per group of 32 elements, its set-up cost a fifth of the group's time."""
    if group % 16 or group <= 0:
        raise ValueError("the group must be a positive multiple of 16")
    key = (group, bool(divide), mbits, emin, maxbits, bits, bool(integer))
    fn = _ROUND_GROUPS.get(key)
    if fn is not None:
        return fn
    per = group // 16

    def splat(c: int) -> ir.Constant:
        return ir.Constant(_V16U32, [c & 0xFFFFFFFF] * 16)

    @intrinsic
    def round16(typingctx, x, i, s, g, out, j):  # type: ignore[no-untyped-def]
        for a in (x, s):
            if not (isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1):
                return None
        if not (isinstance(out, types.Array) and out.dtype == types.uint8 and out.ndim == 1):
            return None
        if not all(isinstance(v, types.Integer) for v in (i, g, j)):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            xa, iv, sa, gv, oa, jv = args
            src = builder.bitcast(_elem_ptr(builder, signature.args[0], xa, iv, context), _V16F32.as_pointer())
            dst = builder.bitcast(_elem_ptr(builder, signature.args[4], oa, jv, context), _V16I8.as_pointer())
            sp = _elem_ptr(builder, signature.args[2], sa, gv, context)
            rint = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16F32, [_V16F32]), "llvm.rint.v16f32"
            )

            def umin(a, b):  # type: ignore[no-untyped-def]
                return builder.select(builder.icmp_unsigned("<", a, b), a, b)

            def umax(a, b):  # type: ignore[no-untyped-def]
                return builder.select(builder.icmp_unsigned(">", a, b), a, b)

            def code(t):  # type: ignore[no-untyped-def]
                if integer:  # mx.md §6.2: R = rint(t), saturated at 127 (t holds a * 64)
                    lo = ir.Constant(_V16F32, [-127.0] * 16)
                    hi = ir.Constant(_V16F32, [127.0] * 16)
                    tc = builder.select(builder.fcmp_ordered("<", t, lo), lo, t)
                    tc = builder.select(builder.fcmp_ordered(">", tc, hi), hi, tc)
                    return builder.and_(builder.fptosi(builder.call(rint, [tc]), _V16U32), splat(0xFF))
                tb = builder.bitcast(t, _V16U32)
                ac = umin(builder.and_(tb, splat(0x7FFFFFFF)), splat(maxbits))
                eb = umax(builder.and_(ac, splat(0x7F800000)), splat((emin + 127) << 23))
                mb = builder.add(eb, splat((23 - mbits) << 23))
                sm = builder.fadd(builder.bitcast(ac, _V16F32), builder.bitcast(mb, _V16F32))
                ecode = builder.sub(builder.lshr(mb, splat(23 - mbits)), splat((150 - mbits + emin) << mbits))
                c = builder.add(builder.sub(builder.bitcast(sm, _V16U32), mb), ecode)
                return builder.or_(c, builder.shl(builder.lshr(tb, splat(31)), splat(bits - 1)))

            for off, t in _scaled_groups(builder, src, sp, per, divide):
                builder.store(builder.trunc(code(t), _V16I8), builder.gep(dst, [off]), align=1)
            return context.get_dummy_value()

        return types.void(x, i, s, g, out, j), codegen

    _ROUND_GROUPS[key] = round16
    return round16


# --------------------------------------------------------------------------------------------
# binary16 <-> binary32 with the conversion instructions (x86 F16C, AArch64 FCVT)
#
# LLVM's ``fpext half`` and ``fptrunc float to half`` are the IEEE conversions (round to nearest
# even, subnormals kept, overflow to infinity), one instruction per 8 or 16 lanes where the CPU has
# them. They give fp16.md's bits for every number. NaN is where the hardware's choice and the spec's
# differ (the hardware sets the quiet bit and keeps what payload fits; fp16.md §3 writes 0x7E00 with
# the sign, and its decode keeps a NaN's payload as it is), so a select puts the spec's bits in the
# NaN lanes: these paths are bit-identical to gcodec.kernels.scalar's conversions for every input.
#
# Without the instructions LLVM calls a runtime library function for each conversion, which Numba's
# JIT may not link, so HAS_F16 gates them: the host's own CPU (Numba's default target), x86 with
# F16C, or AArch64. A named target (NUMBA_CPU_NAME) uses them only if NUMBA_CPU_FEATURES lists f16c.


def _has_f16() -> bool:
    import platform

    from numba.core import config

    if config.CPU_NAME or config.CPU_FEATURES:  # a target chosen by the user (e.g. for a portable cache)
        return "+f16c" in str(config.CPU_FEATURES or "")
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return True
    if machine not in ("x86_64", "amd64"):
        return False
    from llvmlite import binding

    try:
        return bool(binding.get_host_cpu_features().get("f16c", False))
    except RuntimeError:  # features unknown on this host
        return False


#: Whether the binary16 intrinsics below may be used on this machine (the kernels fall back to the
#: scalar conversions, same bits, where not).
HAS_F16 = _has_f16()

_V16H = ir.VectorType(ir.HalfType(), 16)
_V16I16 = ir.VectorType(ir.IntType(16), 16)


def _c16(ty, c: int | float) -> ir.Constant:  # type: ignore[no-untyped-def]
    return ir.Constant(ty, [c] * 16)


def _widen_f16(builder, h):  # type: ignore[no-untyped-def]
    """<16 x i16> binary16 bits -> <16 x float>, scalar.f16_bits_to_f32 exactly (NaN payload kept)."""
    hw = builder.fpext(builder.bitcast(h, _V16H), _V16F32)
    w = builder.zext(h, _V16U32)
    em = builder.and_(w, _c16(_V16U32, 0x7FFF))
    soft = builder.or_(
        builder.add(builder.shl(em, _c16(_V16U32, 13)), _c16(_V16U32, 0x70000000)),
        builder.shl(builder.and_(w, _c16(_V16U32, 0x8000)), _c16(_V16U32, 16)),
    )
    nan = builder.icmp_unsigned(">", em, _c16(_V16U32, 0x7C00))
    return builder.select(nan, builder.bitcast(soft, _V16F32), hw)


def _narrow_f16(builder, v):  # type: ignore[no-untyped-def]
    """<16 x float> -> <16 x i16> binary16 bits, scalar.f32_to_f16_bits exactly (NaN: 0x7E00, sign)."""
    hw = builder.bitcast(builder.fptrunc(v, _V16H), _V16I16)
    u = builder.bitcast(v, _V16U32)
    nan = builder.icmp_unsigned(">", builder.and_(u, _c16(_V16U32, 0x7FFFFFFF)), _c16(_V16U32, 0x7F800000))
    soft = builder.trunc(
        builder.or_(builder.and_(builder.lshr(u, _c16(_V16U32, 16)), _c16(_V16U32, 0x8000)), _c16(_V16U32, 0x7E00)),
        _V16I16,
    )
    return builder.select(nan, soft, hw)


def _nonfinite16(builder, h):  # type: ignore[no-untyped-def]
    """How many of 16 binary16 bit patterns are infinite or NaN (all exponent bits set), as uint32."""
    e = builder.and_(h, _c16(_V16I16, 0x7C00))
    mask = builder.bitcast(builder.icmp_unsigned("==", e, _c16(_V16I16, 0x7C00)), ir.IntType(16))
    return builder.zext(builder.ctpop(mask), _I32)


def _is_1d(a, dtype) -> bool:  # type: ignore[no-untyped-def]
    return isinstance(a, types.Array) and a.dtype == dtype and a.ndim == 1 and a.layout == "C"


def _vec_ptr(builder, arrty, arr, index, context, vty):  # type: ignore[no-untyped-def]
    return builder.bitcast(_elem_ptr(builder, arrty, arr, index, context), vty.as_pointer())


@intrinsic
def f16_encode16(typingctx, x, out, i):  # type: ignore[no-untyped-def]
    """out[i:i+16] = the binary16 bits of the float32 x[i:i+16] (fp16.md §3; C-contiguous 1-D)."""
    if not (_is_1d(x, types.float32) and _is_1d(out, types.uint16) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        xa, oa, iv = args
        v = builder.load(_vec_ptr(builder, signature.args[0], xa, iv, context, _V16F32), align=4)
        builder.store(_narrow_f16(builder, v), _vec_ptr(builder, signature.args[1], oa, iv, context, _V16I16), align=2)
        return context.get_dummy_value()

    return types.void(x, out, i), codegen


def _decoder(accumulate: bool):  # type: ignore[no-untyped-def]
    @intrinsic
    def decode16(typingctx, h, out, i):  # type: ignore[no-untyped-def]
        if not (_is_1d(h, types.uint16) and _is_1d(out, types.float32) and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            ha, oa, iv = args
            src = _vec_ptr(builder, signature.args[0], ha, iv, context, _V16I16)
            w = _widen_f16(builder, builder.load(src, align=2))
            dst = _vec_ptr(builder, signature.args[1], oa, iv, context, _V16F32)
            if accumulate:  # out + v under format.md §10's NaN rule, as the scalar kernel adds
                w = _pos_nan(builder, builder.fadd(builder.load(dst, align=4), w))
            builder.store(w, dst, align=4)
            return context.get_dummy_value()

        return types.void(h, out, i), codegen

    return decode16


#: out[i:i+16] = (or +=) the float32 of the binary16 bits h[i:i+16] (fp16.md §5).
f16_decode16 = _decoder(False)
f16_add16 = _decoder(True)


def _summer(widen: bool):  # type: ignore[no-untyped-def]
    @intrinsic
    def sum16(typingctx, a, b, out, i):  # type: ignore[no-untyped-def]
        ok = _is_1d(out, types.float32) if widen else _is_1d(out, types.uint16)
        if not (ok and _is_1d(a, types.uint16) and _is_1d(b, types.uint16) and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            aa, ba, oa, iv = args
            # Plain conversions: they differ from the scalar ones in NaN lanes only, and there the
            # sum is NaN, whose sign and payload the caller sets afterwards (the NaN rule of
            # format.md §10: cast._nan_bits16 / _nan_bits32 when the count is not 0).
            pa = _vec_ptr(builder, signature.args[0], aa, iv, context, _V16H)
            pb = _vec_ptr(builder, signature.args[1], ba, iv, context, _V16H)
            fa = builder.fpext(builder.load(pa, align=2), _V16F32)
            fb = builder.fpext(builder.load(pb, align=2), _V16F32)
            # from +0, as an accumulator sums (-0 + -0 is +0), then rounded once
            hh = builder.fptrunc(builder.fadd(builder.fadd(_c16(_V16F32, 0.0), fa), fb), _V16H)
            h = builder.bitcast(hh, _V16I16)
            vty = _V16F32 if widen else _V16I16
            dst = _vec_ptr(builder, signature.args[2], oa, iv, context, vty)
            builder.store(builder.fpext(hh, _V16F32) if widen else h, dst, align=4 if widen else 2)
            return _nonfinite16(builder, h)

        return types.uint32(a, b, out, i), codegen

    return sum16


#: out[i:i+16] = binary16 bits of (0 + a) + b rounded once (the cast module's sum2_f16, which sets
#: the NaN sums' bits afterwards), returning how many of the 16 sums are infinite or NaN;
#: ``..._widen16`` writes the float32 of those sums.
f16_sum2_16 = _summer(False)
f16_sum2_widen16 = _summer(True)


def _feedbacker(has_e: bool):  # type: ignore[no-untyped-def]
    @intrinsic
    def feedback16(typingctx, x, e, out, enew, i):  # type: ignore[no-untyped-def]
        f32 = all(_is_1d(a, types.float32) for a in (x, e, enew))
        if not (f32 and _is_1d(out, types.uint16) and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            xa, ea, oa, na, iv = args
            c = builder.load(_vec_ptr(builder, signature.args[0], xa, iv, context, _V16F32), align=4)
            if has_e:  # c = x + e, one IEEE addition per lane (a NaN c's bits are set by the caller)
                ev = builder.load(_vec_ptr(builder, signature.args[1], ea, iv, context, _V16F32), align=4)
                c = builder.fadd(c, ev)
            h = _narrow_f16(builder, c)
            builder.store(h, _vec_ptr(builder, signature.args[2], oa, iv, context, _V16I16), align=2)
            r = builder.fsub(c, _widen_f16(builder, h))
            builder.store(r, _vec_ptr(builder, signature.args[3], na, iv, context, _V16F32), align=4)
            # how many residuals are infinite or NaN (all exponent bits set)
            ex = builder.and_(builder.bitcast(r, _V16U32), _c16(_V16U32, 0x7F800000))
            mask = builder.bitcast(builder.icmp_unsigned("==", ex, _c16(_V16U32, 0x7F800000)), ir.IntType(16))
            return builder.zext(builder.ctpop(mask), _I32)

        return types.uint32(x, e, out, enew, i), codegen

    return feedback16


#: Error feedback fused into the binary16 encode, 16 lanes: c = x[i:i+16] (+ e[i:i+16]), out = its
#: binary16 bits, enew = c - float32(out) (fp16.md §3 and §5, each step IEEE and exact as the
#: separate kernels do it); returns how many of the 16 residuals are infinite or NaN (the cast
#: module then gives a NaN c the bits of format.md §10's NaN rule).
f16_feedback16 = _feedbacker(True)
f16_feedback16_noe = _feedbacker(False)
