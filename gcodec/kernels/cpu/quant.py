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
import threading
import types
from typing import Any

import numpy as np
from numba import njit

from ...layout.quant import RULE_MAX, QuantLayout
from ...rng import split64
from .bitpack import _field, _pack_bytes, _pack_octets, _unpack_bytes, _unpack_octets
from .cast import f16_bits_to_f32, pos_nan
from .philox import fill_blocks, key_schedule, u16_to_open01
from .scales import _f16_scale, _group_stats, _rule_scale, large_group_scales
from .threads import run_chunks

__all__ = ["CHUNK", "SB", "count_bad", "count_scale_overflows", "encode", "geometry", "scaled_decode", "scaled_encode"]

SB = 2048  # elements per sub-block
CHUNK = 1 << 16  # target elements per parallel task
#: Group sizes whose kernels are compiled with the group size as a constant trip count (each
#: divides SB), measured on this machine (docs/performance.md): the encoder gains at 16 and 32
#: (1.7x and 2.5x) and at the default 64; at 128 it gained nothing. The decoder gains only at 64:
#: at 16 a literal group made it 2x slower.
ENCODE_LITERAL_GROUPS = (16, 32, 64)
DECODE_LITERAL_GROUPS = (64,)


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


def _closure(fn: Any, **names: Any) -> Any:
    """``fn`` (a closure) with its own globals: the module's plus ``names``.

    A kernel calls the setting's inlined sub-kernel through such a global name, not through a
    closure variable: Numba keys its disk cache on the closure variables' pickled contents, and a
    pickled dispatcher holds a fresh UUID in every process (the cache would never hit). The
    setting itself is in the closure variables, so every setting has its own cache entry.
    """
    g = dict(fn.__globals__)
    g.update(names)
    f = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    f.__qualname__, f.__module__, f.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    return f


def _make_encode_range(W, RULE, STOCH, CLIPPED, F16, GL):  # type: ignore[no-untyped-def]
    """The range kernel of :func:`scaled_encode` for one setting, with that setting as constants.

    One kernel for every setting (width, rule, rounding, scale type and fusion as run-time values)
    cost 10-14 s to compile on first use, nearly all of it Numba inlining the code of settings the
    job never uses. Here the setting is in closure variables, which Numba treats as constants: it
    prunes the other settings' branches of :func:`_sub_block` *before* inlining their callees, so
    each setting compiles only its own code (the default uniform encoder in ~1-2 s). ``GL`` (fused
    groups of one of :data:`ENCODE_LITERAL_GROUPS`, 0 otherwise) adds a copy of the sub-block with that
    group size as a constant trip count: with a run-time count LLVM's vector loop (16 lanes times
    an unroll of 4) never runs for groups of 16 or 32, and those encoded 7 times slower per element
    than groups of 64.
    Whether the statistics are fused stays a run-time value: a codec with one group per tensor
    fuses them for small tensors only, and one kernel serves both.
    """

    def _sub_block(x, codes, sc32, sc16, cb, r16, qmax, clip, G, full, b0, b1, fused):  # pragma: no cover - jitted
        """One sub-block [b0, b1): statistics and scales (when fused), quantize, pack.

        ``cb``: scratch for narrow codes; ``r16``: the sub-block's 16-bit draws (stochastic).
        ``full`` (a literal at the call site) says the sub-block holds only whole groups, and ``G``
        may be a literal too: then every group loop has a constant trip count and LLVM unrolls it.
        """
        n = x.shape[0]
        bad = 0
        g0 = b0 // G
        g1 = (b1 - 1) // G + 1
        if fused:
            for gi in range(g0, g1):
                lo = gi * G
                hi = lo + G if full else min(lo + G, n)
                mb, s1, s2 = _group_stats(x, lo, hi, RULE, CLIPPED)
                s, isbad = _rule_scale(RULE, mb, s1, s2, hi - lo, qmax, clip)
                if F16:
                    s, h, isbad = _f16_scale(s, isbad)
                    sc16[gi] = h
                if isbad:
                    s = np.float32(0.0)
                sc32[gi] = s
                bad += isbad
        # 8-bit codes go straight to the payload; narrower ones to cb, then packed
        dst = codes if W == 8 else cb
        for gi in range(g0, g1):
            lo = gi * G if full else max(gi * G, b0)
            hi = lo + G if full else min(gi * G + G, b1)
            d0 = lo if W == 8 else lo - b0
            if STOCH:
                _quant_stochastic(x, lo, hi, sc32[gi], qmax, r16, lo - b0, dst, d0)
            else:
                _quant_nearest(x, lo, hi, sc32[gi], qmax, dst, d0)
        if W != 8:
            m = b1 - b0
            for j in range(m, m + 8):
                cb[j] = 0
            if W == 4 or W == 2:  # only this width's packing is compiled
                _pack_bytes(cb, m, W, codes, np.uint64(b0 // 8 * W))
            else:
                _pack_octets(cb, m, W, codes, np.uint64(b0 // 8 * W))
        return bad

    def _encode_range(x, codes, sc32, sc16, G, L, fused, qmax, clip, seeds, c0, c1):  # pragma: no cover - jitted
        """Elements [c0, c1) (c0 a multiple of L); returns the bad-group count.

        ``seeds``: (seed_lo, seed_hi, stream_lo, stream_hi).
        """
        setting = (W, RULE, STOCH, CLIPPED, F16, GL)  # noqa: F841 - the cache key (closure)
        n = x.shape[0]
        cb = np.zeros(L + 8, np.uint8)
        rb = np.empty(L // 2 + 4, np.uint32)
        r16 = rb.view(np.uint16)
        if STOCH:
            ks = key_schedule(seeds[0], seeds[1])
        bad = 0
        for b0 in range(c0, c1, L):
            b1 = min(b0 + L, n)
            if STOCH:
                fill_blocks(rb, b0 // 8, (b1 - b0 + 7) // 8, seeds[2], seeds[3], ks)
            if GL > 0 and b1 - b0 == L:  # a literal group size: constant trip counts
                bad += SUB_BLOCK(x, codes, sc32, sc16, cb, r16, qmax, clip, GL, True, b0, b1, True)  # noqa: F821
            else:
                bad += SUB_BLOCK(x, codes, sc32, sc16, cb, r16, qmax, clip, G, False, b0, b1, fused)  # noqa: F821
        return bad

    sub = njit(inline="always")(_sub_block)
    return njit(cache=True, nogil=True)(_closure(_encode_range, SUB_BLOCK=sub))


_ENCODERS: dict[tuple[int, int, bool, bool, bool, int], Any] = {}
_LOCK = threading.Lock()


def encode_kernel(w: int, rule: int, stochastic: bool, clipped: bool, f16: bool, gl: int) -> Any:
    """The range kernel for one setting (made on first use, then kept; compiled on its first call)."""
    key = (int(w), int(rule), bool(stochastic), bool(clipped), bool(f16), int(gl))
    k = _ENCODERS.get(key)
    if k is None:
        with _LOCK:
            k = _ENCODERS.get(key)
            if k is None:
                k = _ENCODERS[key] = _make_encode_range(*key)
    return k


def scaled_encode(  # type: ignore[no-untyped-def]
    x, codes, sc32, sc16, G, L, C, fused, w, qmax, rule, stochastic, clip, seed_lo, seed_hi, st_lo, st_hi
):
    """Quantize flat ``x`` into ``w``-bit packed ``codes``; see the module docstring.

    ``G, L, C, fused`` come from :func:`geometry`. When ``fused`` (groups no longer than a
    sub-block) the scales are computed here into ``sc32`` (and their float16 bits into ``sc16``
    when that is not empty); otherwise they must already be there (:func:`large_group_scales`).
    Returns the number of non-finite groups found here.
    """
    gl = G if fused and G in ENCODE_LITERAL_GROUPS else 0
    kernel = encode_kernel(w, rule, stochastic, rule == RULE_MAX and clip > 0.0, sc16.shape[0] > 0, gl)
    seeds = (np.uint32(seed_lo), np.uint32(seed_hi), np.uint32(st_lo), np.uint32(st_hi))
    return run_chunks(kernel, x.shape[0], C, x, codes, sc32, sc16, G, L, bool(fused), int(qmax), float(clip), seeds)


# --------------------------------------------------------------------------------------------
# unpack and decode


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
                out[base + jj] = pos_nan(out[base + jj] + np.float32(q) * s)  # format.md §10
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
                    out[k + np.uint64(t)] = pos_nan(out[k + np.uint64(t)] + np.float32(q) * s)
                else:
                    out[k + np.uint64(t)] = np.float32(q) * s
    return bad


def _make_decode_chunk(W, F16, ACC, GL):  # type: ignore[no-untyped-def]
    """The range kernel of :func:`scaled_decode` for one setting (code width, float16 scales,
    accumulate; ``GL``: a group size of :data:`DECODE_LITERAL_GROUPS` with a width of 8, 4 or 2, decoded
    with literal sizes, else 0), the
    setting as closure constants as in :func:`_make_encode_range`."""

    def _decode_chunk(codes, sc32, sc16, out, G, qmax, c0, c1):  # pragma: no cover - jitted
        setting = (W, F16, ACC, GL)  # noqa: F841 - the cache key (closure)
        qb = np.zeros(SB + 8, np.int8)
        bad = 0
        for b0 in range(c0, c1, SB):
            b1 = min(b0 + SB, c1)
            if GL > 0 and b1 - b0 == SB:  # sub-blocks of whole literal groups (GL divides SB)
                if W == 8:
                    bad += _decode_groups(codes, sc32, sc16, out, GL, True, b0, b1, W, qmax, ACC, F16, qb)
                else:
                    bad += _decode_groups_packed(codes, sc32, sc16, out, GL, b0, b1, W, qmax, ACC, F16)
            else:
                if W == 4 or W == 2:  # only this width's unpacking is compiled
                    _unpack_bytes(codes, np.uint64(b0 // 8 * W), b1 - b0, W, qb)
                elif W != 8:
                    _unpack_octets(codes, np.uint64(b0 // 8 * W), b1 - b0, W, qb)
                bad += _decode_groups(codes, sc32, sc16, out, G, False, b0, b1, W, qmax, ACC, F16, qb)
        return bad

    return njit(cache=True, nogil=True)(_decode_chunk)


_DECODERS: dict[tuple[int, bool, bool, int], Any] = {}


def decode_kernel(w: int, f16: bool, accumulate: bool, gl: int) -> Any:
    """The decoding range kernel for one setting (made on first use, then kept)."""
    key = (int(w), bool(f16), bool(accumulate), int(gl))
    k = _DECODERS.get(key)
    if k is None:
        with _LOCK:
            k = _DECODERS.get(key)
            if k is None:
                k = _DECODERS[key] = _make_decode_chunk(*key)
    return k


def scaled_decode(codes, sc32, sc16, out, G, w, qmax, accumulate):  # type: ignore[no-untyped-def]
    """out[i] (+)= float32(q_i) * s_{i // G}; returns how many codes lie outside [-qmax, qmax].

    ``sc16``, when not empty, holds the scales as float16 bits (and ``sc32`` is ignored).
    """
    kernel = decode_kernel(w, sc16.shape[0] > 0, accumulate, G if G in DECODE_LITERAL_GROUPS and w in (8, 4, 2) else 0)
    return run_chunks(kernel, out.shape[0], CHUNK, codes, sc32, sc16, out, G, int(qmax))


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


def _make_count_chunk(W):  # type: ignore[no-untyped-def]
    """The range kernel of :func:`count_bad` for ``W``-bit codes (a closure constant)."""

    def _count_chunk(codes, qmax, c0, c1):  # pragma: no cover - jitted
        width = W  # noqa: F841 - the cache key (closure)
        if W == 8 or W == 4 or W == 2:
            # whole bytes, field by field (the padding codes of the last byte are 0: checked before this)
            return _count_bytes(codes, c0, c1, W, qmax)
        bad = 0
        qb = np.zeros(SB + 8, np.int8)
        for b0 in range(c0, c1, SB):
            m = min(b0 + SB, c1) - b0
            _unpack_octets(codes, np.uint64(b0 // 8 * W), m, W, qb)  # W is 3, 5, 6 or 7 here
            bad += _count_out_of_range(qb, m, qmax)
        return bad

    return njit(cache=True, nogil=True)(_count_chunk)


_COUNTERS: dict[int, Any] = {}


def count_bad(codes, n, w, qmax):  # type: ignore[no-untyped-def]
    """How many of the first ``n`` ``w``-bit codes lie outside [-qmax, qmax]."""
    k = _COUNTERS.get(w)
    if k is None:
        with _LOCK:
            k = _COUNTERS.get(w)
            if k is None:
                k = _COUNTERS[w] = _make_count_chunk(int(w))
    return run_chunks(k, n, CHUNK, codes, int(qmax))


def encode(
    flat: np.ndarray,
    codes: np.ndarray,
    sc32: np.ndarray,
    sc16: np.ndarray,
    lay: QuantLayout,
    seed: int,
    stream: int,
) -> int:
    """Run the kernels for one tensor; returns the number of groups that could not be encoded."""
    n = flat.size
    if n == 0:
        return 0
    g, sub, chunk, fused = geometry(n, lay.group_size)
    nbad = 0
    if not fused:
        nbad += large_group_scales(flat, sc32, sc16, g, lay.rule, lay.qmax, lay.clip)
    sl, sh = split64(seed)
    tl, th = split64(stream)
    nbad += scaled_encode(
        flat,
        codes,
        sc32,
        sc16,
        g,
        sub,
        chunk,
        fused,
        lay.width,
        lay.qmax,
        lay.rule,
        lay.stochastic,
        float(lay.clip),
        sl,
        sh,
        tl,
        th,
    )
    return nbad


def count_scale_overflows(sc32: np.ndarray, qmax: int) -> int:
    """How many scales ``s`` have ``float32(qmax * s)`` infinite (the largest code decodes to ±inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return int(np.count_nonzero(np.isinf(np.asarray(sc32, np.float32) * np.float32(qmax))))
