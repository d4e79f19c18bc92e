"""Sparse selection, index coding and scatter on the device (specs/codecs/topk.md, threshold.md,
randomk.md): the functions of ``gcodec.kernels.cpu.sparse`` that an encoder or a decoder into a
device ``out=`` calls, with the same results bit for bit.

Magnitude keys are the input's bits with the sign cleared, read as unsigned integers (see the CPU
module): no float compares anywhere.

Top-K, without a sort (exact k, ties to the lowest index)
    1. **Radix select** on the keys, most significant digit first, :data:`RADIX` bits a digit
       (three passes for float32 keys, six for float64): each pass histograms, in shared memory per
       block, the digit of the keys that match the prefix found so far, and one thread walks the
       histogram from the top to fix the next digit. The result is the exact k-th largest key ``K``
       and ``ties``, how many keys equal to ``K`` belong to the top k. The first pass also counts
       non-finite keys (NaN, infinity): the one number that comes back to the host.
    2. **Word masks**: one thread per word of 32 elements builds the bit masks of ``key > K`` and
       ``key == K``; an exclusive scan of the ``== K`` counts tells each word how many ties lie
       before it, so it keeps its lowest ``ties - before`` tied bits (the lowest-index rule).
    3. **Compaction**: an exclusive scan of the kept counts gives each word its output offset; the
       word writes its indices (increasing) and their bit patterns (the values).

Random-K (Floyd's algorithm, specs/codecs/randomk.md §3), in parallel
    Draw ``m`` computes ``t_m`` from words ``2m, 2m+1`` on its own. Whether ``t_m`` was already in
    the set when draw ``m`` ran (a *collision*, so that ``j_m = n - k + m`` joins instead) is:
    some earlier draw had the same ``t`` (a hash table of first occurrences, built with
    compare-and-swap and atomic min), or ``t_m = j_(m')`` for an earlier ``m' = t_m - (n - k)``
    whose own draw collided (followed back, a chain that strictly decreases). Each draw then marks
    its element in a bitmap of ``n`` bits; the bitmap's set bits, compacted as in step 3 above,
    are the sorted indices. The set equals the sequential algorithm's, step for step.

Index coding ("delta")
    One thread per block of 64 gaps: its width, its byte count (an exclusive scan gives the block
    offsets), and its packed bytes. Blocks start on byte boundaries, so they never share a byte.

Scans are exclusive prefix sums over int64 in segments (one thread per segment, recursively over
the segment sums). Decoding checks indices on the host (a device payload is validated from one
host copy, docs/gpu.md), so only :func:`scatter` runs on the device there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from ...layout.sparse import GAP_BLOCK
from .launch import SIM, device, grid, host, missing, one, pos_nan, upload

__all__ = [
    "candidate_capacity",
    "collect_ge",
    "count_ge",
    "count_nonfinite",
    "count_nonfinite_values",
    "delta_pack",
    "delta_widths",
    "gather",
    "randomk_indices",
    "scan_exclusive",
    "scatter",
    "topk_select",
]

RADIX = 11  # bits per radix-select digit (2048 bins: 8 KiB of shared memory per block)
_BINS = 1 << RADIX
_SEG = 8 if SIM else 1024  # elements a scan thread adds up
_HIST_BLOCKS = 1024  # blocks of a histogram pass

# selection state on the device (uint64): prefix, prefix mask, keys still to take (ties at the end)
_PREFIX, _PMASK, _REMAIN = 0, 1, 2


def __getattr__(name: str) -> object:
    raise missing("sparse", name)


# --------------------------------------------------------------------------------------------
# exclusive scans


@cuda.jit
def _seg_sums(a, sums, seg):  # pragma: no cover - device
    n = a.shape[0]
    for s in range(cuda.grid(1), sums.shape[0], cuda.gridsize(1)):
        acc = np.int64(0)
        for i in range(s * seg, min(n, (s + 1) * seg)):
            acc += np.int64(a[i])
        sums[s] = acc


@cuda.jit
def _seg_apply(a, sums, seg):  # pragma: no cover - device
    n = a.shape[0]
    for s in range(cuda.grid(1), sums.shape[0], cuda.gridsize(1)):
        acc = np.int64(sums[s])
        for i in range(s * seg, min(n, (s + 1) * seg)):
            v = np.int64(a[i])
            a[i] = acc
            acc += v


@cuda.jit
def _serial_scan(a, total):  # pragma: no cover - device
    if cuda.grid(1) == 0:
        acc = np.int64(0)
        for i in range(a.shape[0]):
            v = np.int64(a[i])
            a[i] = acc
            acc += v
        total[0] = acc


def scan_exclusive(a: Any) -> Any:
    """Replace device int64 ``a`` by its exclusive prefix sums; returns a device array holding the
    total (read it on the host only when the host needs it)."""
    n = int(a.shape[0])
    if n <= _SEG:
        total = cuda.device_array(1, np.int64)
        _serial_scan[one()](a, total)
        return total
    ns = (n + _SEG - 1) // _SEG
    sums = cuda.device_array(ns, np.int64)
    _seg_sums[grid(ns)](a, sums, _SEG)
    total = scan_exclusive(sums)
    _seg_apply[grid(ns)](a, sums, _SEG)
    return total


def _read(a: Any) -> int:
    return int(host(a)[0])


@cuda.jit
def _fill(a, v):  # pragma: no cover - device
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        a[i] = v


def _full(n: int, dtype: Any, v: int) -> Any:
    """A device array of ``n`` elements equal to ``v``, filled on the device."""
    a = cuda.device_array(max(n, 1), dtype)
    _fill[grid(n)](a, np.dtype(dtype).type(v))
    return a[:n]


# --------------------------------------------------------------------------------------------
# counting


@cuda.jit
def _count_ge(bits, mask, infkey, t, cnt):  # pragma: no cover - device
    c = np.int64(0)
    bad = np.int64(0)
    for i in range(cuda.grid(1), bits.shape[0], cuda.gridsize(1)):
        key = bits[i] & mask
        if key >= t:
            c += 1
        if key >= infkey:
            bad += 1
    if c:
        cuda.atomic.add(cnt, 0, c)
    if bad:
        cuda.atomic.add(cnt, 1, bad)


def count_ge(bits: Any, mask: Any, infkey: Any, t: Any) -> tuple[int, int]:
    """(#keys >= t, #non-finite keys): the counting pass of ``threshold`` (both come to the host)."""
    cnt = upload(np.zeros(2, np.int64))
    if int(bits.shape[0]):
        _count_ge[grid(bits.shape[0])](bits, mask, infkey, t, cnt)
    h = host(cnt)
    return int(h[0]), int(h[1])


def count_nonfinite(bits: Any, mask: Any, infkey: Any) -> int:
    """How many keys are at least the infinity key (infinities and NaNs)."""
    return count_ge(bits, mask, infkey, infkey)[1]


@cuda.jit
def _count_nonfinite_values(v, cnt):  # pragma: no cover - device
    c = np.int64(0)
    for j in range(cuda.grid(1), v.shape[0], cuda.gridsize(1)):
        a = abs(np.float64(v[j]))
        if not (a <= 1.7976931348623157e308):
            c += 1
    if c:
        cuda.atomic.add(cnt, 0, c)


def count_nonfinite_values(v: Any) -> int:
    cnt = upload(np.zeros(1, np.int64))
    if int(v.shape[0]):
        _count_nonfinite_values[grid(v.shape[0])](device(v), cnt)
    return _read(cnt)


# --------------------------------------------------------------------------------------------
# word masks and compaction


@cuda.jit
def _word_masks(bits, mask, K, ge, sel, eqm, ceq):  # pragma: no cover - device
    """sel[w]: bits of key > K (or key >= K when ``ge``); eqm[w]: key == K (not ``ge``); ceq[w]: its count."""
    n = bits.shape[0]
    for w in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
        g = np.uint32(0)
        e = np.uint32(0)
        lo = 32 * w
        for t in range(min(32, n - lo)):
            key = bits[lo + t] & mask
            if key > K or (ge and key == K):
                g |= np.uint32(1) << np.uint32(t)
            elif key == K:
                e |= np.uint32(1) << np.uint32(t)
        sel[w] = g
        eqm[w] = e
        ceq[w] = cuda.popc(e)


@cuda.jit
def _keep_ties(sel, eqm, before, st, cnt):  # pragma: no cover - device
    """Add to sel[w] the lowest (ties - before[w]) bits of eqm[w]; cnt[w] = kept count."""
    ties = np.int64(st[_REMAIN])
    for w in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
        r = ties - np.int64(before[w])
        m = np.uint32(eqm[w])
        keep = np.uint32(0)
        while r > 0 and m != np.uint32(0):
            low = np.uint32(m & np.uint32(~m + np.uint32(1)))
            keep |= low
            m ^= low
            r -= 1
        s = np.uint32(sel[w] | keep)
        sel[w] = s
        cnt[w] = cuda.popc(s)


@cuda.jit
def _popc(sel, cnt):  # pragma: no cover - device
    for w in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
        cnt[w] = cuda.popc(np.uint32(sel[w]))


@cuda.jit
def _emit(sel, off, bits, with_bits, out, out_bits):  # pragma: no cover - device
    """Word w writes its selected indices (increasing) from out[off[w]], and their bits."""
    cap = out.shape[0]
    for w in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
        o = np.int64(off[w])
        m = np.uint32(sel[w])
        t = 0
        while m != np.uint32(0):
            if m & np.uint32(1):
                i = 32 * w + t
                if o < cap:
                    out[o] = i
                    if with_bits:
                        out_bits[o] = bits[i]
                o += 1
            m = np.uint32(m >> np.uint32(1))
            t += 1


def _compact(sel: Any, cnt: Any, bits: Any, out: Any, out_bits: Any) -> Any:
    """Write the set bits of the word masks ``sel`` (counts ``cnt``) as increasing indices."""
    total = scan_exclusive(cnt)
    nw = int(sel.shape[0])
    with_bits = out_bits is not None
    ob = out_bits if with_bits else cuda.device_array(1, np.uint32)
    bb = bits if bits is not None else cuda.device_array(1, np.uint32)
    _emit[grid(nw)](sel, cnt, bb, with_bits, out, ob)
    return total


def _words(n: int) -> tuple[Any, Any, Any]:
    nw = (n + 31) // 32
    return cuda.device_array(nw, np.uint32), cuda.device_array(nw, np.uint32), cuda.device_array(nw, np.int64)


def collect_ge(bits: Any, mask: Any, t: Any, out: Any, outbits: Any) -> int:
    """Record, in increasing order, the indices i with key(i) >= t and their bits (capacity
    ``out.shape[0]``). Returns the number of such keys (read on the host: ``threshold`` has counted
    them already, so this is a check)."""
    n = int(bits.shape[0])
    if n == 0:
        return 0
    sel, eqm, ceq = _words(n)
    _word_masks[grid(sel.shape[0])](bits, mask, t, True, sel, eqm, ceq)
    _popc[grid(sel.shape[0])](sel, ceq)
    return _read(_compact(sel, ceq, bits, out, outbits))


# --------------------------------------------------------------------------------------------
# top-k


@cuda.jit
def _hist(bits, mask, st, shift, dmask, infkey, first, hist, bad):  # pragma: no cover - device
    """Histogram (shared memory, then global atomics) of digit ``(key >> shift) & dmask`` over the
    keys matching the prefix; the first pass also counts non-finite keys."""
    sh = cuda.shared.array(_BINS, np.int32)
    tid = cuda.threadIdx.x
    for b in range(tid, _BINS, cuda.blockDim.x):
        sh[b] = 0
    cuda.syncthreads()
    prefix = np.uint64(st[_PREFIX])
    pmask = np.uint64(st[_PMASK])
    nb = np.int64(0)
    for i in range(cuda.grid(1), bits.shape[0], cuda.gridsize(1)):
        key = np.uint64(bits[i] & mask)
        if (key & pmask) == prefix:
            cuda.atomic.add(sh, np.int64((key >> np.uint64(shift)) & np.uint64(dmask)), 1)
        if first and key >= np.uint64(infkey):
            nb += 1
    cuda.syncthreads()
    for b in range(tid, _BINS, cuda.blockDim.x):
        if sh[b]:
            cuda.atomic.add(hist, b, np.int64(sh[b]))
    if nb:
        cuda.atomic.add(bad, 0, nb)


@cuda.jit
def _pick_digit(hist, st, shift, dmask):  # pragma: no cover - device
    """The digit holding the remaining-th largest key; zeroes the histogram for the next pass."""
    if cuda.grid(1) == 0:
        rem = np.int64(st[_REMAIN])
        acc = np.int64(0)
        d = np.int64(dmask)
        while d > 0 and acc + hist[d] < rem:
            acc += hist[d]
            d -= 1
        st[_REMAIN] = np.uint64(rem - acc)
        st[_PREFIX] = np.uint64(st[_PREFIX]) | (np.uint64(d) << np.uint64(shift))
        st[_PMASK] = np.uint64(st[_PMASK]) | (np.uint64(dmask) << np.uint64(shift))
        for b in range(hist.shape[0]):
            hist[b] = 0


def _digits(nbits: int) -> list[tuple[int, int]]:
    """(shift, width) of each radix digit, most significant first."""
    out = []
    hi = nbits
    while hi > 0:
        w = min(RADIX, hi)
        out.append((hi - w, w))
        hi -= w
    return out


@cuda.jit
def _iota(out, bits, out_bits):  # pragma: no cover - device
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = i
        if out_bits.shape[0]:
            out_bits[i] = bits[i]


def candidate_capacity(n: int, k: int) -> int:
    """The device selection needs no candidate scratch from the caller."""
    return 0


def topk_select(
    bits: Any,
    mask: Any,
    infkey: Any,
    k: int,
    out: Any,
    out_bits: Any,
    cand: Any,
    cbits: Any,
    hist: Any,
) -> int:
    """Device ``out`` (int64, k) gets the indices of the top-k keys, increasing, and device
    ``out_bits`` their bit patterns. ``cand``, ``cbits``, ``hist`` (the CPU's scratch) are ignored.
    Returns the number of non-finite keys (the caller refuses such input; the outputs are then
    unspecified): the one value read back on the host."""
    n = int(bits.shape[0])
    if k == 0 or k == n:
        bad = count_nonfinite(bits, mask, infkey)
        if k and not bad:
            _iota[grid(n)](out, bits, out_bits)
        return bad
    st = upload(np.array([0, 0, k], np.uint64))
    hist_d = _full(_BINS, np.int64, 0)  # zeroed on the device: 16 KiB that need not cross from the host
    badc = upload(np.zeros(1, np.int64))
    nbits = 8 * np.dtype(bits.dtype).itemsize
    for p, (shift, width) in enumerate(_digits(nbits)):
        dmask = (1 << width) - 1
        # few blocks, many keys each: every block clears and flushes a shared histogram
        _hist[grid(n, _HIST_BLOCKS)](bits, mask, st, shift, dmask, infkey, p == 0, hist_d, badc)
        if p == 0:
            bad = _read(badc)
            if bad:
                return bad
        _pick_digit[one()](hist_d, st, shift, dmask)
    # st: prefix = K (the k-th largest key), remain = how many keys equal to K are kept
    sel, eqm, ceq = _words(n)
    nw = int(sel.shape[0])
    K = st[_PREFIX : _PREFIX + 1]
    _word_masks_st[grid(nw)](bits, mask, K, sel, eqm, ceq)
    scan_exclusive(ceq)
    cnt = cuda.device_array(nw, np.int64)
    _keep_ties[grid(nw)](sel, eqm, ceq, st, cnt)
    _compact(sel, cnt, bits, out, out_bits)
    return 0


@cuda.jit
def _word_masks_st(bits, mask, Kd, sel, eqm, ceq):  # pragma: no cover - device
    """:func:`_word_masks` with K read from device memory (the radix select's result)."""
    n = bits.shape[0]
    K = np.uint64(Kd[0])
    for w in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
        g = np.uint32(0)
        e = np.uint32(0)
        lo = 32 * w
        for t in range(min(32, n - lo)):
            key = np.uint64(bits[lo + t] & mask)
            if key > K:
                g |= np.uint32(1) << np.uint32(t)
            elif key == K:
                e |= np.uint32(1) << np.uint32(t)
        sel[w] = g
        eqm[w] = e
        ceq[w] = cuda.popc(e)


# --------------------------------------------------------------------------------------------
# gather / scatter


@cuda.jit
def _gather(x, idx, out):  # pragma: no cover - device
    for j in range(cuda.grid(1), idx.shape[0], cuda.gridsize(1)):
        out[j] = x[idx[j]]


def gather(x: Any, idx: Any, out: Any) -> None:
    """out[j] = x[idx[j]] (device ``x``, ``out``; ``idx`` device or host)."""
    if int(idx.shape[0]):
        _gather[grid(idx.shape[0])](x, device(idx), out)


@cuda.jit
def _scatter(idx, vals, out, accumulate):  # pragma: no cover - device
    for j in range(cuda.grid(1), idx.shape[0], cuda.gridsize(1)):
        i = idx[j]
        if accumulate:  # a NaN sum made positive (format.md §10)
            out[i] = pos_nan(out[i] + vals[j])
        else:
            out[i] = vals[j]


def scatter(idx: Any, vals: Any, out: Any, accumulate: bool) -> None:
    """out[idx[j]] (+)= vals[j] into device ``out``; ``idx`` and ``vals`` may be host arrays (the
    indices a host-side check decoded, the values of a host payload): copied once. Indices are
    distinct, so no two threads touch one element."""
    if int(idx.shape[0]):
        _scatter[grid(idx.shape[0])](device(idx), device(vals), out, bool(accumulate))


# --------------------------------------------------------------------------------------------
# delta index coding


@cuda.jit
def _block_widths(idx, widths, nbytes):  # pragma: no cover - device
    k = idx.shape[0]
    for b in range(cuda.grid(1), widths.shape[0], cuda.gridsize(1)):
        lo = b * GAP_BLOCK
        hi = min(lo + GAP_BLOCK, k)
        prev = np.int64(-1) if lo == 0 else np.int64(idx[lo - 1])
        acc = np.int64(0)
        for j in range(lo, hi):
            acc |= np.int64(idx[j]) - prev - 1
            prev = np.int64(idx[j])
        w = 0
        while acc > 0:
            w += 1
            acc >>= 1
        widths[b] = w
        nbytes[b] = ((hi - lo) * w + 7) // 8


def _block_offsets(idx: Any, widths: Any) -> tuple[Any, Any]:
    nb = int(widths.shape[0])
    off = cuda.device_array(nb, np.int64)
    _block_widths[grid(nb)](idx, widths, off)
    return off, scan_exclusive(off)


def delta_widths(idx: Any, widths: Any) -> int:
    """Per-block widths (device ``widths``) of the gap stream of increasing device ``idx``; returns
    the packed byte count (read on the host: the header needs it)."""
    if int(widths.shape[0]) == 0:
        return 0
    return _read(_block_offsets(idx, widths)[1])


@cuda.jit
def _pack(idx, widths, off, out):  # pragma: no cover - device
    k = idx.shape[0]
    for b in range(cuda.grid(1), widths.shape[0], cuda.gridsize(1)):
        lo = b * GAP_BLOCK
        hi = min(lo + GAP_BLOCK, k)
        prev = np.int64(-1) if lo == 0 else np.int64(idx[lo - 1])
        w = np.uint64(widths[b])
        pos = np.int64(off[b])
        acc = np.uint64(0)
        nacc = np.uint64(0)
        for j in range(lo, hi):
            d = np.uint64(np.int64(idx[j]) - prev - 1)
            prev = np.int64(idx[j])
            acc |= d << nacc
            nacc += w
            while nacc >= np.uint64(8):
                out[pos] = np.uint8(acc & np.uint64(0xFF))
                pos += 1
                acc >>= np.uint64(8)
                nacc -= np.uint64(8)
        if nacc > np.uint64(0):
            out[pos] = np.uint8(acc & np.uint64(0xFF))


def delta_pack(idx: Any, widths: Any, out: Any) -> int:
    """Pack the gaps of device ``idx`` block by block at the given widths into device ``out``; one
    thread per block at the block's offset."""
    nb = int(widths.shape[0])
    if nb == 0:
        return 0
    off, _ = _block_offsets(idx, device(widths))
    _pack[grid(nb)](idx, device(widths), off, out)
    return int(out.shape[0])


# --------------------------------------------------------------------------------------------
# Random-K indices


@cuda.jit(device=True)
def _mulhi64(a, b):  # pragma: no cover - device
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


@cuda.jit(device=True)
def _slot(t, hmask):  # pragma: no cover - device
    z = np.uint64(t) * np.uint64(0x9E3779B97F4A7C15)
    return np.int64((z ^ (z >> np.uint64(29))) & np.uint64(hmask))


@cuda.jit
def _draw(words, n, k, t, keys, first, hmask):  # pragma: no cover - device
    """t[m] = floor(u_m (j_m + 1) / 2**64); first[slot(t)] = the lowest m drawing that t."""
    for m in range(cuda.grid(1), k, cuda.gridsize(1)):
        u = (np.uint64(words[2 * m + 1]) << np.uint64(32)) | np.uint64(words[2 * m])
        j = n - k + m
        tm = np.int64(_mulhi64(u, np.uint64(j + 1)))
        t[m] = tm
        h = _slot(tm, hmask)
        while True:
            old = cuda.atomic.cas(keys, h, np.int64(-1), tm)
            if old == -1 or old == tm:
                cuda.atomic.min(first, h, np.int64(m))
                break
            h = (h + 1) & hmask


@cuda.jit(device=True)
def _first_of(tm, keys, first, hmask):  # pragma: no cover - device
    h = _slot(tm, hmask)
    while keys[h] != tm:
        h = (h + 1) & hmask
    return first[h]


@cuda.jit
def _mark(t, n, k, keys, first, hmask, bitmap):  # pragma: no cover - device
    """Draw m adds j_m when t_m was in the set already (a collision), else t_m, to the bitmap."""
    base = n - k
    for m in range(cuda.grid(1), k, cuda.gridsize(1)):
        c = m
        coll = False
        while True:
            tc = t[c]
            if _first_of(tc, keys, first, hmask) < c:
                coll = True  # an earlier draw had the same t
                break
            if tc >= base and tc - base < c:
                c = tc - base  # t_c = j_(c'): in the set iff draw c' collided
                continue
            break
        e = base + m if coll else t[m]
        cuda.atomic.or_(bitmap, e >> 5, np.uint32(1) << np.uint32(e & 31))


def randomk_indices(n: int, k: int, words: Any, out: Any) -> None:
    """Floyd's sampling of k distinct indices of [0, n) from Philox words 0 .. 2k-1 (device
    ``words``), into device ``out`` (int64, increasing): the set of the sequential algorithm."""
    if k == 0:
        return
    if k == n:
        _iota[grid(n)](out, out, cuda.device_array(0, np.int64))
        return
    H = 2
    while H < 2 * k:
        H *= 2
    t = cuda.device_array(k, np.int64)
    keys = _full(H, np.int64, -1)
    first = _full(H, np.int64, k)
    _draw[grid(k)](device(words), n, k, t, keys, first, H - 1)
    nw = (n + 31) // 32
    bitmap = _full(nw, np.uint32, 0)
    _mark[grid(k)](t, n, k, keys, first, H - 1, bitmap)
    cnt = cuda.device_array(nw, np.int64)
    _popc[grid(nw)](bitmap, cnt)
    _compact(bitmap, cnt, None, out, None)
