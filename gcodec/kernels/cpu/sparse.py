"""Sparse selection, index coding and scatter kernels (specs/codecs/topk.md, threshold.md, randomk.md).

Magnitude keys
    For an IEEE float, clearing the sign bit and reading the rest as an unsigned integer orders
    values by magnitude: ``|a| < |b|`` iff ``key(a) < key(b)`` for non-NaN ``a, b``, ``-0`` and
    ``+0`` share key 0, infinities have the largest non-NaN key, and every NaN has a larger key
    still, so ``key >= inf key`` picks out the non-finite values (which the codecs reject). The
    kernels select on integer keys read straight from the input's bits (uint16 for
    float16/bfloat16, uint32 for float32, uint64 for float64): no float compares, no conversion
    pass, and the same code for every dtype.

Top-K selection (exact k, ties to the lowest index)
    1. Estimate a threshold key ``t`` from a sample of 16 Ki keys, chosen so that about
       ``1.3 k`` elements have ``key >= t`` (4 standard deviations above ``k``).
    2. One selecting pass: each block of 8 keys is compared at once into a bit mask (one vector
       compare); blocks holding a candidate are compacted through a table of bit positions, so
       candidate indices and keys are recorded in increasing order without a branch per element.
    3. Fix-up: the exact k-th largest key ``K`` among the candidates (a radix select on their
       keys); the result is every candidate with ``key > K`` and the first ``k - #{key > K}``
       candidates with ``key == K``, in index order.
    If the sample misled step 2 (fewer than k or too many candidates, e.g. a tensor of ties), an
    exact radix select takes over: 16-bit digit histograms from the top, one pass per digit
    (1 pass for 16-bit keys, 2 for 32-bit, 4 for 64-bit), then one emitting pass.

Index coding ("delta", specs/codecs/topk.md section 3)
    Gaps ``d_0 = i_0``, ``d_j = i_j - i_(j-1) - 1``, in blocks of 64; each block is packed
    LSB-first at the bit width of its largest gap, blocks byte-aligned, one width byte per block.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from ... import alloc
from ...layout.sparse import ERR_BYTES, ERR_NOT_MINIMAL, ERR_ORDER, ERR_PAD, ERR_RANGE, GAP_BLOCK, OK
from .cast import pos_nan

_SAMPLE = 1 << 14  # keys in the threshold sample
_SMALL = 1 << 16  # below this many elements, select on all keys directly
_CB = 8  # keys per compared block in the selecting pass (one AVX2 compare of 32-bit keys)


# --------------------------------------------------------------------------------------------
# helpers


@njit(cache=True, inline="always")
def _bit_length(v):  # pragma: no cover - jitted
    """Bit length of a non-negative int64 (0 for 0)."""
    w = 0
    while v > 0:
        w += 1
        v >>= 1
    return w


@njit(cache=True, inline="always")
def _mix(j):  # pragma: no cover - jitted
    """A cheap 64-bit integer hash (SplitMix64 finaliser) used only to place sample points."""
    z = np.uint64(j) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@intrinsic
def _ge_mask8(typingctx, arr, start, mask, t):
    """Bit j (j < 8) set iff ``(arr[start + j] & mask) >= t``: one vector load, and, compare, movemask.

    ``arr`` is a C-contiguous array of unsigned integers (``mask`` and ``t`` are converted to its
    type, so they must fit); ``start + 8 <= arr.size`` is the caller's duty. LLVM lowers the
    ``<8 x i1>`` to ``i8`` bitcast to a single ``vmovmskps`` on AVX2.
    """
    if not (isinstance(arr, types.Array) and arr.layout == "C" and isinstance(arr.dtype, types.Integer)):
        return None
    if arr.dtype.signed or not isinstance(mask, types.Integer) or not isinstance(t, types.Integer):
        return None
    sig = types.int64(arr, start, mask, t)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, value=args[0])
        ptr = builder.gep(ary.data, [args[1]])
        elty = context.get_value_type(aty.dtype)
        mask_v = context.cast(builder, args[2], signature.args[2], aty.dtype)
        t_v = context.cast(builder, args[3], signature.args[3], aty.dtype)
        vecty = ir.VectorType(elty, 8)
        v = builder.load(builder.bitcast(ptr, vecty.as_pointer()), align=elty.width // 8)
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8)
        undef = ir.Constant(vecty, ir.Undefined)
        i0 = ir.Constant(ir.IntType(32), 0)
        mv = builder.shuffle_vector(builder.insert_element(undef, mask_v, i0), undef, zeros)
        tv = builder.shuffle_vector(builder.insert_element(undef, t_v, i0), undef, zeros)
        cmp = builder.icmp_unsigned(">=", builder.and_(v, mv), tv)
        return builder.zext(builder.bitcast(cmp, ir.IntType(8)), ir.IntType(64))

    return sig, codegen


def _compaction_tables() -> tuple[np.ndarray, np.ndarray]:
    """For each 8-bit mask: the positions of its set bits (padded with 0) and how many there are."""
    pos = np.zeros((256, 8), np.int64)
    cnt = np.zeros(256, np.int64)
    for m in range(256):
        ps = [j for j in range(8) if m >> j & 1]
        cnt[m] = len(ps)
        pos[m, : len(ps)] = ps
    return pos, cnt


_POS, _CNT = _compaction_tables()
_POSU, _CNTU = _POS.astype(np.uint64), _CNT.astype(np.uint64)


@njit(cache=True)
def count_nonfinite(bits, mask, infkey):  # pragma: no cover - jitted
    """How many keys are at least the infinity key (infinities and NaNs)."""
    n = bits.shape[0]
    nb = n // _CB
    c = 0
    for b in range(nb):
        c += _CNT[_ge_mask8(bits, b * _CB, mask, infkey)]
    for i in range(nb * _CB, n):
        c += (bits[i] & mask) >= infkey
    return c


# --------------------------------------------------------------------------------------------
# the selecting pass


@njit(cache=True)
def collect_ge(bits, mask, t, out, outbits):  # pragma: no cover - jitted
    """Record, in increasing order, the indices i with key(i) >= t and their bits, up to capacity.

    ``outbits`` receives the elements' full bit patterns (sign included): they are the values, so
    no second, cache-missing gather is needed. Returns the number of such keys; when not every
    candidate fits, the count returned exceeds ``out.shape[0]``. Each block of 8 keys is compared at
    once into a bit mask; a block with candidates is compacted without branches through a table of
    bit positions (8 slots written, the cursor advances by the popcount), so ``out`` needs 8 slots
    of slack, which the capacity check keeps.
    """
    n = bits.shape[0]
    cap = np.uint64(out.shape[0])
    cb = np.uint64(_CB)
    c = np.uint64(0)
    over = False
    nb = np.uint64(n // _CB)
    # Unsigned indices: Numba emits no negative-index wraparound code, so LLVM vectorises the
    # fixed 8-slot compaction (about 30 % faster than signed indices).
    for b in range(nb):
        lo = b * cb
        m = _ge_mask8(bits, np.int64(lo), mask, t)
        if m:
            if c + cb <= cap:
                for q in range(cb):
                    i = lo + _POSU[m, q]
                    out[c + q] = i
                    outbits[c + q] = bits[i]
            else:
                over = True
            c += _CNTU[m]
    for i in range(nb * cb, np.uint64(n)):
        if (bits[i] & mask) >= t:
            if c < cap:
                out[c] = i
                outbits[c] = bits[i]
            else:
                over = True
            c += np.uint64(1)
    cnt = np.int64(c)
    if over and cnt <= out.shape[0]:
        cnt = out.shape[0] + 1  # some candidates were not stored
    return cnt


@njit(cache=True)
def count_ge(bits, mask, infkey, t):  # pragma: no cover - jitted
    """(#keys >= t, #non-finite keys): the counting pass of ``threshold``."""
    n = bits.shape[0]
    nb = n // _CB
    c = 0
    nan = 0
    for b in range(nb):
        c += _CNT[_ge_mask8(bits, b * _CB, mask, t)]
        nan += _CNT[_ge_mask8(bits, b * _CB, mask, infkey)]
    for i in range(nb * _CB, n):
        key = bits[i] & mask
        c += key >= t
        nan += key >= infkey
    return c, nan


@njit(cache=True)
def _emit_from64(cand, cbits, mask, K, ties, out, out_bits):  # pragma: no cover - jitted
    """Write the chosen candidates (key > K, or key == K while ties remain) and their bits.

    Branch-free: every candidate is written at the cursor, which advances when it is chosen.
    """
    c = 0
    k = out.shape[0]
    for q in range(cand.shape[0]):
        key = np.uint64(cbits[q] & mask)
        eq = key == K
        take = (key > K) | (eq & (ties > 0))
        ties -= take & eq
        if c < k:
            out[c] = cand[q]
            out_bits[c] = cbits[q]
        c += take
    return c


@njit(cache=True)
def _emit_all64(bits, mask, K, ties, out, out_bits):  # pragma: no cover - jitted
    """One pass over all elements: keep key > K, and key == K while ties remain."""
    c = 0
    k = out.shape[0]
    for i in range(bits.shape[0]):
        key = np.uint64(bits[i] & mask)
        if key > K or (key == K and ties > 0):
            if key == K:
                ties -= 1
            out[c] = i
            out_bits[c] = bits[i]
            c += 1
            if c == k:
                break
    return c


@njit(cache=True)
def _radix_select(bits, mask, k, hist):  # pragma: no cover - jitted
    """Exact k-th largest key K and how many keys equal to K belong to the top k (``ties``).

    ``hist`` is scratch of 2**16 int64.
    """
    nbits = bits.itemsize * 8
    prefix = np.uint64(0)
    pmask = np.uint64(0)
    remaining = k
    n = bits.shape[0]
    shift = nbits - 16
    while shift >= 0:
        hist[:] = 0
        sh = np.uint64(shift)
        for i in range(n):
            key = np.uint64(bits[i] & mask)
            if (key & pmask) == prefix:
                hist[np.int64((key >> sh) & np.uint64(0xFFFF))] += 1
        acc = 0
        d = (1 << 16) - 1
        while d > 0 and acc + hist[d] < remaining:
            acc += hist[d]
            d -= 1
        remaining -= acc
        prefix |= np.uint64(d) << sh
        pmask |= np.uint64(0xFFFF) << sh
        shift -= 16
    return prefix, remaining


@njit(cache=True)
def _kth_largest(keys, k, mask, hist):  # pragma: no cover - jitted
    """The k-th largest (1 <= k <= n) of the masked ``keys``, as a uint64; permutes ``keys``.

    Wirth's selection (Hoare partitions around a median of three) in place: a few passes over a
    small array. np.partition would do the same, but its Numba implementation (argument checks
    through np.unique, sorting, string formatting) cost ~8 s to compile on first use. After
    ~4 log2(n) rounds (adversarial input) it gives up and takes the radix select
    (:func:`_radix_select`, ``hist`` its scratch): the result is the same value either way.
    """
    n = keys.shape[0]
    t = n - k  # its position in increasing order
    lo = 0
    hi = n - 1
    budget = 16
    m = n
    while m > 0:
        budget += 4
        m >>= 1
    while lo < hi:
        if budget == 0:
            K, _ = _radix_select(keys, mask, k, hist)
            return K
        budget -= 1
        a = keys[lo]
        b = keys[(lo + hi) >> 1]
        c = keys[hi]
        x = max(min(a, b), min(max(a, b), c))  # the median of the three
        i = lo
        j = hi
        while i <= j:
            while keys[i] < x:
                i += 1
            while x < keys[j]:
                j -= 1
            if i <= j:
                keys[i], keys[j] = keys[j], keys[i]
                i += 1
                j -= 1
        if j < t:
            lo = i
        if t < i:
            hi = j
    return np.uint64(keys[t])


@njit(cache=True)
def candidate_capacity(n, k):  # pragma: no cover - jitted
    """Scratch slots :func:`topk_select` uses for candidates (0 when it takes another path)."""
    if k == 0 or k == n or n <= _SMALL:
        return 0
    s = _SAMPLE
    p = k / n
    mu = p * s
    r = int(mu + 4.0 * np.sqrt(mu * (1.0 - p)) + 8.0)  # sample rank from the top
    if r >= s:
        return 0
    return min(n, int(1.5 * r * (n / s)) + 4096)


@njit(cache=True)
def topk_select(bits, mask, infkey, k, out, out_bits, cand, cbits, hist):  # pragma: no cover - jitted
    """Fill ``out`` (int64, length k) with the indices of the top-k keys, increasing, and
    ``out_bits`` (the dtype of ``bits``) with those elements' bit patterns (the values).

    ``cand`` (int64) and ``cbits`` (the dtype of ``bits``) are scratch of at least
    :func:`candidate_capacity` slots, ``hist`` scratch of 2**16 int64: callers keep them between
    calls, so the selection allocates nothing large. Returns the number of non-finite keys found
    (the caller rejects such input); when it is non-zero, the outputs are unspecified.
    """
    n = bits.shape[0]
    if k == 0:
        return count_nonfinite(bits, mask, infkey)
    if k == n:
        for i in range(n):
            out[i] = i
            out_bits[i] = bits[i]
        return count_nonfinite(bits, mask, infkey)
    if n <= _SMALL:
        nan = count_nonfinite(bits, mask, infkey)
        if nan:
            return nan
        keys = np.empty(n, bits.dtype)  # a plain loop: the array expression bits & mask compiles slower
        for i in range(n):
            keys[i] = bits[i] & mask
        K = _kth_largest(keys, k, mask, hist)
        gt = 0
        for i in range(n):
            gt += keys[i] > K
        _emit_all64(bits, mask, K, k - gt, out, out_bits)
        return 0
    # Step 1: threshold estimate from a sample (positions hashed: the result does not depend on them).
    s = _SAMPLE
    stride = n // s
    sample = np.empty(s, bits.dtype)
    bad = 0
    for j in range(s):
        key = bits[j * stride + np.int64(_mix(j) % np.uint64(stride))] & mask
        sample[j] = key
        bad += key >= infkey
    p = k / n
    mu = p * s
    r = int(mu + 4.0 * np.sqrt(mu * (1.0 - p)) + 8.0)  # sample rank from the top
    cap = min(candidate_capacity(n, k), cand.shape[0], cbits.shape[0])
    if r < s and cap > 0 and bad == 0:
        # t <= the infinity key, so every non-finite element (key >= inf key) is a candidate.
        t = _kth_largest(sample, r, mask, hist)
        # Step 2: one selecting pass.
        c = collect_ge(bits, mask, t, cand[:cap], cbits[:cap])
        if k <= c <= cap:
            nan = count_nonfinite(cbits[:c], mask, infkey)
            if nan:
                return nan
            # Step 3: exact k-th key among the candidates, then keep k of them in index order.
            K, ties = _radix_select(cbits[:c], mask, k, hist)
            _emit_from64(cand[:c], cbits[:c], mask, K, ties, out, out_bits)
            return 0
    # Fallback: exact radix select over all keys, then one emitting pass.
    nan = count_nonfinite(bits, mask, infkey)
    if nan:
        return nan
    K, ties = _radix_select(bits, mask, k, hist)
    _emit_all64(bits, mask, K, ties, out, out_bits)
    return 0


# --------------------------------------------------------------------------------------------
# gather


@njit(cache=True)
def gather(x, idx, out):  # pragma: no cover - jitted
    for j in range(idx.shape[0]):
        out[j] = x[idx[j]]


# --------------------------------------------------------------------------------------------
# delta index coding


@njit(cache=True)
def delta_widths(idx, widths):  # pragma: no cover - jitted
    """Per-block widths of the gap stream of increasing ``idx``; returns the packed byte count."""
    k = idx.shape[0]
    prev = np.int64(-1)
    total = 0
    for b in range(widths.shape[0]):
        lo = b * GAP_BLOCK
        hi = min(lo + GAP_BLOCK, k)
        acc = np.int64(0)
        for j in range(lo, hi):
            acc |= idx[j] - prev - 1
            prev = idx[j]
        w = _bit_length(acc)
        widths[b] = w
        total += ((hi - lo) * w + 7) // 8
    return total


@njit(cache=True)
def delta_pack(idx, widths, out):  # pragma: no cover - jitted
    """Pack the gaps of ``idx`` block by block, LSB-first, at the given widths, into ``out``."""
    k = idx.shape[0]
    prev = np.int64(-1)
    pos = 0
    for b in range(widths.shape[0]):
        lo = b * GAP_BLOCK
        hi = min(lo + GAP_BLOCK, k)
        w = np.uint64(widths[b])
        acc = np.uint64(0)
        nacc = np.uint64(0)
        for j in range(lo, hi):
            d = np.uint64(idx[j] - prev - 1)
            prev = idx[j]
            acc |= d << nacc
            nacc += w
            while nacc >= np.uint64(8):
                out[pos] = np.uint8(acc & np.uint64(0xFF))
                pos += 1
                acc >>= np.uint64(8)
                nacc -= np.uint64(8)
        if nacc > np.uint64(0):
            out[pos] = np.uint8(acc & np.uint64(0xFF))
            pos += 1
    return pos


@njit(cache=True)
def delta_bytes(widths, k, max_width):  # pragma: no cover - jitted
    """Bytes the widths imply, or -1 - b when block b's width exceeds ``max_width``."""
    total = 0
    for b in range(widths.shape[0]):
        w = np.int64(widths[b])
        if w > max_width:
            return -1 - b
        L = min(GAP_BLOCK, k - b * GAP_BLOCK)
        total += (L * w + 7) // 8
    return total


@njit(cache=True)
def delta_unpack(packed, widths, k, numel, idx):  # pragma: no cover - jitted
    """Decode k indices into ``idx`` and check them. Returns ``(code, where)``.

    Checks: every block width is the bit length of its largest gap (ERR_NOT_MINIMAL, where = the
    block), every index is < numel (ERR_RANGE, where = the position), and the unused high bits of
    the last byte are zero (ERR_PAD). Widths must already have been checked (``delta_bytes``).
    """
    prev = np.int64(-1)
    pos = 0
    nbytes = packed.shape[0]
    for b in range(widths.shape[0]):
        lo = b * GAP_BLOCK
        hi = min(lo + GAP_BLOCK, k)
        wi = np.int64(widths[b])
        w = np.uint64(wi)
        fmask = (np.uint64(1) << w) - np.uint64(1)
        acc = np.uint64(0)
        nacc = np.uint64(0)
        orall = np.int64(0)
        for j in range(lo, hi):
            while nacc < w:
                acc |= np.uint64(packed[pos]) << nacc
                pos += 1
                nacc += np.uint64(8)
            d = np.int64(acc & fmask)
            acc = (acc >> w) if w < np.uint64(64) else np.uint64(0)
            nacc -= w
            orall |= d
            i = prev + 1 + d
            if i >= numel:
                return ERR_RANGE, j
            idx[j] = i
            prev = i
        if _bit_length(orall) != wi:
            return ERR_NOT_MINIMAL, b
        if acc != np.uint64(0):
            return ERR_PAD, b
    if pos != nbytes:
        return ERR_BYTES, pos
    return OK, 0


@njit(cache=True)
def check_raw_indices(raw, numel):  # pragma: no cover - jitted
    """Raw uint32 indices: strictly increasing and < numel. Returns ``(code, where)``."""
    prev = np.int64(-1)
    for j in range(raw.shape[0]):
        i = np.int64(raw[j])
        if i <= prev:
            return ERR_ORDER, j
        if i >= numel:
            return ERR_RANGE, j
        prev = i
    return OK, 0


# --------------------------------------------------------------------------------------------
# scatter


@njit(cache=True)
def scatter(idx, vals, out, accumulate):  # pragma: no cover - jitted
    """out[idx[j]] (+)= vals[j] (the caller zeroes ``out`` first when not accumulating; a NaN sum
    made positive, format.md §10)."""
    if accumulate:
        for j in range(idx.shape[0]):
            out[idx[j]] = pos_nan(out[idx[j]] + vals[j])
    else:
        for j in range(idx.shape[0]):
            out[idx[j]] = vals[j]


@njit(cache=True)
def count_nonfinite_values(v):  # pragma: no cover - jitted
    c = 0
    for j in range(v.shape[0]):
        c += not np.isfinite(v[j])
    return c


@njit(cache=True)
def first_below(v, t):  # pragma: no cover - jitted
    """First j with a non-finite v[j] or with |v[j]| < t (in float64), or -1."""
    for j in range(v.shape[0]):
        a = abs(np.float64(v[j]))
        if not (a >= t) or not np.isfinite(a):
            return j
    return -1


# --------------------------------------------------------------------------------------------
# Random-K indices (specs/codecs/randomk.md section 3)


@njit(cache=True, inline="always")
def _mulhi64(a, b):  # pragma: no cover - jitted
    """High 64 bits of the 128-bit product of two uint64."""
    m32 = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    al = a & m32
    ah = a >> s32
    bl = b & m32
    bh = b >> s32
    p0 = al * bl
    p1 = al * bh
    p2 = ah * bl
    p3 = ah * bh
    mid = (p0 >> s32) + (p1 & m32) + (p2 & m32)
    return p3 + (p1 >> s32) + (p2 >> s32) + (mid >> s32)


_DEBRUIJN = np.array(
    [
        0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4,
        62, 55, 59, 36, 53, 51, 43, 22, 45, 39, 33, 30, 24, 18, 12, 5,
        63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44, 32, 23, 11,
        46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6,
    ],
    dtype=np.int64,
)  # fmt: skip


def randomk_bitmap_words(n: int, k: int) -> int:
    """uint64 words of the bitmap :func:`randomk_indices` needs (none when k is 0 or n)."""
    return (n + 63) // 64 if 0 < k < n else 0


def randomk_indices(n: int, k: int, words: np.ndarray, out: np.ndarray) -> None:
    """Robert Floyd's sampling of k distinct indices of [0, n), driven by Philox words.

    ``words`` holds words 0 .. 2k-1 of the payload's stream. Draw m (m = 0 .. k-1) reads words 2m
    (low half) and 2m+1 (high half) as a uint64 ``u``, sets ``j = n - k + m`` and
    ``t = floor(u * (j + 1) / 2**64)``; t joins the set unless it is already there, in which case
    j joins. ``out`` receives the set in increasing order. A bitmap of n bits is the only
    temporary (n/8 bytes), allocated here rather than in the kernel: its size comes from a payload's
    numel, so it goes through gcodec's allocator (gcodec/alloc.py).
    """
    bitmap = alloc.empty("the randomk index bitmap", randomk_bitmap_words(n, k), np.uint64)
    bitmap[:] = 0
    _randomk_fill(n, k, words, out, bitmap)


@njit(cache=True)
def _randomk_fill(n, k, words, out, bitmap):  # pragma: no cover - jitted
    """:func:`randomk_indices` with its zeroed bitmap of (n + 63) // 64 words."""
    if k == n:
        for i in range(n):
            out[i] = i
        return
    if k == 0:
        return
    nwords = (n + 63) // 64
    one = np.uint64(1)
    for m in range(k):
        u = (np.uint64(words[2 * m + 1]) << np.uint64(32)) | np.uint64(words[2 * m])
        j = n - k + m
        t = np.int64(_mulhi64(u, np.uint64(j + 1)))
        tw = t >> 6
        tb = one << np.uint64(t & 63)
        if bitmap[tw] & tb:
            bitmap[j >> 6] |= one << np.uint64(j & 63)
        else:
            bitmap[tw] |= tb
    c = 0
    magic = np.uint64(0x03F79D71B4CB0A89)
    for q in range(nwords):
        w = bitmap[q]
        while w:
            low = w & (~w + one)
            out[c] = q * 64 + _DEBRUIJN[np.int64((low * magic) >> np.uint64(58))]
            c += 1
            w ^= low
