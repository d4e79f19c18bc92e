"""Chunked top-k: selection per chunk and the in-chunk index codings (specs/codecs/chunktopk.md).

Selection (one pass per chunk, exact, ties to the lowest index)
    The flat tensor is cut into chunks of ``C`` elements (the last may be shorter); chunk ``c``
    keeps ``kc = min(k, its length)`` elements. Per chunk (16 KiB of float32: it stays in L1):

    1. cut the chunk into ``kc`` groups and take ``t``, the smallest of the groups' largest keys:
       every group has a key ``>= t``, so at least ``kc`` keys reach it (a vectorised max pass);
    2. tighten it, when a counting pass (8 keys per vector compare) shows that at least ``kc`` keys
       reach it, to the group maximum of rank ``kc - kc/8`` (about 2 ``kc`` keys reach that for
       Gaussian data, against 5 ``kc`` for ``t``);
    3. collect the candidates in increasing index order: 64 keys make one bit word of 8 vector
       compares, whose few set bits are read with a count of trailing zeros;
    4. find the exact ``kc``-th largest candidate key ``K`` (Wirth's selection);
    5. keep the candidates with ``key > K`` and the lowest-indexed ones with ``key == K``.

    The chunk's largest key is a candidate, so a non-finite element (key >= the infinity key)
    shows among them: no separate counting pass.

Index codings (spec §3, §4)
    ``packed``: every in-chunk index in ``w = bitlength(C - 1)`` bits, one LSB-first stream over the
    whole tensor. ``gap``: per chunk, the gaps of its sorted in-chunk indices (``d_0 = i_0``,
    ``d_j = i_j - i_(j-1) - 1``) packed LSB-first at the bit length of the chunk's largest gap, one
    width byte per chunk, each chunk starting on a byte boundary.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from ...layout.sparse import ERR_BYTES, ERR_NOT_MINIMAL, ERR_ORDER, ERR_PAD, ERR_RANGE, OK
from .sparse import _CNTU, _bit_length, _emit_from64, _ge_mask8, _kth_largest

__all__ = [
    "gap_bytes",
    "gap_pack",
    "gap_unpack",
    "gap_widths",
    "packed_pack",
    "packed_unpack",
    "select",
]

_CB = 8  # keys per vector compare


_SCRATCH = threading.local()


def _scratch(chunk: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-thread selection scratch (a chunk's candidates, their bits and keys, a radix histogram),
    kept and grown between calls: re-allocating it per encode costs page faults."""
    st = _SCRATCH.__dict__
    cap = chunk + _CB  # the compaction writes 8 slots at a time
    cand = st.get("cand")
    if cand is None or cand.shape[0] < cap:
        cand = st["cand"] = np.empty(cap, np.int64)
    key = f"b{np.dtype(dtype).itemsize}"
    got = st.get(key)
    if got is None or got[0].shape[0] < cap:
        got = st[key] = (np.empty(cap, dtype), np.empty(cap, dtype))
    hist = st.get("hist")
    if hist is None:
        hist = st["hist"] = np.empty(1 << 16, np.int64)
    return cand, got[0], got[1], hist


def select(bits: np.ndarray, mask: Any, infkey: Any, chunk: int, k: int, idx: np.ndarray, out_bits: np.ndarray) -> int:
    """The top ``min(k, length)`` of every chunk of ``chunk`` keys, in increasing index order: global
    indices into ``idx`` (int64) and the elements' bit patterns into ``out_bits`` (both of the total
    kept count). Returns 1 when some element is NaN or ±inf (the outputs are then unspecified)."""
    if bits.shape[0] == 0:
        return 0
    return int(_select(bits, mask, infkey, chunk, k, idx, out_bits, *_scratch(chunk, bits.dtype)))


@njit(cache=True)
def _select(bits, mask, infkey, chunk, k, idx, out_bits, cand, cbits, ckeys, hist):  # pragma: no cover - jitted
    """The top ``min(k, length)`` of every chunk of ``chunk`` keys, in increasing index order.

    Writes global indices into ``idx`` and the elements' bit patterns into ``out_bits`` (both of the
    total kept count). Scratch: ``cand`` (int64), ``cbits`` and ``ckeys`` (the keys' type), each of
    ``chunk + 8`` slots, and ``hist`` (2**16 int64, for :func:`._kth_largest`'s fallback). Returns 1
    when some element is NaN or ±inf (nothing useful is written then), else 0.
    """
    n = bits.shape[0]
    nchunks = (n + chunk - 1) // chunk
    pos = 0
    cb = np.uint64(_CB)
    for c in range(nchunks):
        s = c * chunk
        e = min(s + chunk, n)
        L = e - s
        kc = min(k, L)
        if kc == L:  # the whole chunk is kept
            for i in range(s, e):
                if (bits[i] & mask) >= infkey:
                    return 1
                idx[pos] = i
                out_bits[pos] = bits[i]
                pos += 1
            continue
        # 1. the groups' largest keys: cut the chunk into kc groups; each has a key >= its maximum,
        # so at least kc keys reach the smallest maximum t0 (and at least kc - j + 1 keys reach the
        # j-th smallest). Unsigned indices: Numba then emits no negative-index wraparound and LLVM
        # vectorises the max.
        gs = np.uint64(L // kc)
        us = np.uint64(s)
        ue = np.uint64(e)
        t0 = mask
        for g in range(np.uint64(kc)):
            lo = us + g * gs
            hi = ue if g == np.uint64(kc - 1) else lo + gs
            mg = bits[lo] & mask
            for i in range(lo + np.uint64(1), hi):
                v = bits[i] & mask
                mg = v if v > mg else mg
            ckeys[g] = mg
            t0 = min(t0, mg)
        # 2. a tighter threshold, when enough keys reach it: the maximum of rank kc - kc/8 (for
        # Gaussian data ~2 kc keys reach it, against ~5 kc for t0); a count pass checks it
        t = t0
        j = kc // 8
        if j > 0:
            t1 = _kth_largest(ckeys[:kc], kc - j, mask, hist)
            cnt = 0
            i = us
            while i + cb <= ue:
                cnt += _CNTU[_ge_mask8(bits, np.int64(i), mask, t1)]
                i += cb
            while i < ue:
                cnt += np.uint64((bits[i] & mask) >= t1)
                i += np.uint64(1)
            if cnt >= np.uint64(kc):
                t = bits.dtype.type(t1)
        # 3. the candidates (key >= t), in increasing index order: 64 keys a word of 8 vector
        # compares, then the word's set bits (a few per word: the loop rarely mispredicts)
        m = np.uint64(0)
        i = us
        while i + np.uint64(64) <= ue:
            w = np.uint64(0)
            for q in range(8):
                w |= np.uint64(_ge_mask8(bits, np.int64(i) + 8 * q, mask, t)) << np.uint64(8 * q)
            while w != np.uint64(0):
                jj = i + np.uint64(trailing_zeros(w))
                cand[m] = jj
                cbits[m] = bits[jj]
                m += np.uint64(1)
                w &= w - np.uint64(1)
            i += np.uint64(64)
        while i < ue:
            if (bits[i] & mask) >= t:
                cand[m] = i
                cbits[m] = bits[i]
                m += np.uint64(1)
            i += np.uint64(1)
        mc = np.int64(m)
        # 4. the exact kc-th largest candidate key; the chunk's largest key is a candidate, so a
        # non-finite element shows here
        top = cbits[0] & mask
        for q in range(mc):
            ky = cbits[q] & mask
            ckeys[q] = ky
            top = max(top, ky)
        if top >= infkey:
            return 1
        K = np.uint64(_kth_largest(ckeys[:mc], kc, mask, hist))
        above = 0
        for q in range(mc):
            above += np.uint64(cbits[q] & mask) > K
        # 5. keep every key > K and the lowest-indexed keys == K
        pos += _emit_from64(cand[:mc], cbits[:mc], mask, K, kc - above, idx[pos : pos + kc], out_bits[pos : pos + kc])
    return 0


# --------------------------------------------------------------------------------------------
# index_coding = "packed": bitlength(C - 1) bits per in-chunk index, one stream


@njit(cache=True)
def packed_pack(idx, chunk, width, out):  # pragma: no cover - jitted
    """Write ``idx[j] mod chunk`` for every j at ``width`` bits, LSB first, into ``out``."""
    w = np.uint64(width)
    acc = np.uint64(0)
    nacc = np.uint64(0)
    pos = 0
    for j in range(idx.shape[0]):
        acc |= np.uint64(idx[j] % chunk) << nacc
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
def packed_unpack(packed, chunk, k, width, numel, total, idx):  # pragma: no cover - jitted
    """Read ``total`` in-chunk indices of ``width`` bits into global ``idx`` and check them.

    Returns ``(code, where)``: ERR_RANGE (an index not below its chunk's length), ERR_ORDER (not
    above the one before it in its chunk), ERR_PAD (unused bits of the last byte not zero), at the
    position ``where``.
    """
    w = np.uint64(width)
    fmask = (np.uint64(1) << w) - np.uint64(1)
    kf = min(k, chunk)
    acc = np.uint64(0)
    nacc = np.uint64(0)
    pos = 0
    prev = np.int64(-1)
    for j in range(total):
        while nacc < w:
            acc |= np.uint64(packed[pos]) << nacc
            pos += 1
            nacc += np.uint64(8)
        d = np.int64(acc & fmask)
        acc = acc >> w
        nacc -= w
        c = j // kf
        r = j - c * kf
        s = c * chunk
        L = min(chunk, numel - s)
        if r == 0:
            prev = np.int64(-1)
        if d >= L:
            return ERR_RANGE, j
        if d <= prev:
            return ERR_ORDER, j
        prev = d
        idx[j] = s + d
    if acc != np.uint64(0):
        return ERR_PAD, total
    return OK, 0


# --------------------------------------------------------------------------------------------
# index_coding = "gap": per-chunk gaps at the chunk's own width, chunks byte-aligned


@njit(cache=True)
def gap_widths(idx, chunk, k, numel, widths):  # pragma: no cover - jitted
    """Each chunk's gap width into ``widths`` (one per chunk); returns the packed byte count."""
    kf = min(k, chunk)
    total = 0
    for c in range(widths.shape[0]):
        s = c * chunk
        kc = min(kf, numel - s)
        lo = c * kf
        prev = np.int64(-1)
        acc = np.int64(0)
        for j in range(lo, lo + kc):
            o = idx[j] - s
            acc |= o - prev - 1
            prev = o
        wc = _bit_length(acc)
        widths[c] = wc
        total += (kc * wc + 7) // 8
    return total


@njit(cache=True)
def gap_pack(idx, chunk, k, numel, widths, out):  # pragma: no cover - jitted
    """Pack every chunk's gaps LSB first at its width, each chunk from a byte boundary."""
    kf = min(k, chunk)
    pos = 0
    for c in range(widths.shape[0]):
        s = c * chunk
        kc = min(kf, numel - s)
        lo = c * kf
        w = np.uint64(widths[c])
        prev = np.int64(-1)
        acc = np.uint64(0)
        nacc = np.uint64(0)
        for j in range(lo, lo + kc):
            o = idx[j] - s
            acc |= np.uint64(o - prev - 1) << nacc
            prev = o
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
def gap_bytes(widths, chunk, k, numel):  # pragma: no cover - jitted
    """The index bytes the widths imply, or ``-1 - c`` when chunk c's width exceeds
    ``bitlength(length - 1)`` (no gap of the chunk can need more)."""
    kf = min(k, chunk)
    total = 0
    for c in range(widths.shape[0]):
        s = c * chunk
        L = min(chunk, numel - s)
        kc = min(kf, L)
        wc = np.int64(widths[c])
        if wc > _bit_length(L - 1):
            return -1 - c
        total += (kc * wc + 7) // 8
    return total


@njit(cache=True)
def gap_unpack(packed, widths, chunk, k, numel, idx):  # pragma: no cover - jitted
    """Decode every chunk's gaps into global ``idx`` and check them. Returns ``(code, where)``.

    Widths must have been checked by :func:`gap_bytes` (and their total against the section).
    ERR_RANGE: an index not below its chunk's length (where = the position); ERR_NOT_MINIMAL: a
    width that is not the bit length of the chunk's largest gap (where = the chunk); ERR_PAD: the
    unused bits of a chunk's last byte are not zero (where = the chunk).
    """
    kf = min(k, chunk)
    pos = 0
    for c in range(widths.shape[0]):
        s = c * chunk
        L = min(chunk, numel - s)
        kc = min(kf, L)
        lo = c * kf
        wi = np.int64(widths[c])
        w = np.uint64(wi)
        fmask = (np.uint64(1) << w) - np.uint64(1)
        acc = np.uint64(0)
        nacc = np.uint64(0)
        orall = np.int64(0)
        prev = np.int64(-1)
        for j in range(lo, lo + kc):
            while nacc < w:
                acc |= np.uint64(packed[pos]) << nacc
                pos += 1
                nacc += np.uint64(8)
            d = np.int64(acc & fmask)
            acc = acc >> w
            nacc -= w
            orall |= d
            o = prev + 1 + d
            if o >= L:
                return ERR_RANGE, j
            idx[j] = s + o
            prev = o
        if _bit_length(orall) != wi:
            return ERR_NOT_MINIMAL, c
        if acc != np.uint64(0):
            return ERR_PAD, c
    if pos != packed.shape[0]:
        return ERR_BYTES, pos
    return OK, 0
