"""Chunked top-k on the device (specs/codecs/chunktopk.md): the functions of
``gcodec.kernels.cpu.chunked`` that an encoder calls, with the same results bit for bit.

Selection: one thread block per chunk (a grid-stride loop over the chunks)
    1. **Radix select** in the block, 8 bits a digit from the top (four passes for float32 keys):
       the block histograms, in shared memory, the digit of the chunk's keys that match the prefix
       found so far, and thread 0 walks the histogram from the top to fix the next digit. The result
       is the chunk's exact ``kc``-th largest key ``K`` and ``ties``, how many keys equal to ``K``
       belong to its top ``kc``. The first pass also counts non-finite keys.
    2. **Segments**: thread ``t`` owns a contiguous segment of the chunk. It counts its keys ``> K``
       and ``== K``; thread 0 scans the counts, gives the ties to the lowest segments first (the
       lowest-index rule) and hands each thread its output offset; each thread writes its kept
       indices in increasing order, with their bit patterns (the values).

Index codings
    ``gap``: one thread per chunk computes its width and byte count; an exclusive scan gives the
    chunk offsets; one thread per chunk packs its gaps (chunks start on byte boundaries, so they never
    share a byte). ``packed``: one thread per output byte gathers its 8 bits from the fields that
    cover them (fields of ``W`` bits straddle bytes).

Decoding checks indices on the host (a device payload is validated from one host copy, docs/gpu.md),
so no unpacking runs here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from .launch import SIM, device, grid, host, missing, stream, upload
from .sparse import scan_exclusive

__all__ = ["gap_pack", "gap_widths", "packed_pack", "select"]

_T = 32 if SIM else 256  # threads of a selecting block
_BLOCKS = 2 if SIM else 4096  # blocks of the selecting grid (each loops over chunks)
_BINS = 256  # 8-bit digits


def __getattr__(name: str) -> object:
    raise missing("chunked", name)


@cuda.jit
def _select(bits, mask, infkey, chunk, k, nbits, idx, out_bits, bad):  # pragma: no cover - device
    hist = cuda.shared.array(_BINS, np.int32)
    st = cuda.shared.array(3, np.uint64)  # prefix, prefix mask, keys still to take
    gt = cuda.shared.array(_T, np.int64)
    eq = cuda.shared.array(_T, np.int64)
    tid = cuda.threadIdx.x
    T = cuda.blockDim.x
    n = bits.shape[0]
    nchunks = (n + chunk - 1) // chunk
    um = np.uint64(mask)
    uinf = np.uint64(infkey)
    nb = np.int64(0)
    for c in range(cuda.blockIdx.x, nchunks, cuda.gridDim.x):
        s = c * chunk
        L = min(chunk, n - s)
        kc = min(k, L)
        base = c * k  # every chunk before the last keeps k
        seg = (L + T - 1) // T
        lo = s + min(L, tid * seg)
        hi = s + min(L, tid * seg + seg)
        if kc == L:  # the whole chunk is kept (uniform across the block)
            for i in range(lo, hi):
                if (np.uint64(bits[i]) & um) >= uinf:
                    nb += 1
                idx[base + i - s] = i
                out_bits[base + i - s] = bits[i]
            continue
        if tid == 0:
            st[0] = np.uint64(0)
            st[1] = np.uint64(0)
            st[2] = np.uint64(kc)
        shift = nbits - 8
        first = True
        while shift >= 0:
            for b in range(tid, _BINS, T):
                hist[b] = 0
            cuda.syncthreads()
            prefix = st[0]
            pmask = st[1]
            ush = np.uint64(shift)
            for i in range(lo, hi):
                key = np.uint64(bits[i]) & um
                if first and key >= uinf:
                    nb += 1
                if (key & pmask) == prefix:
                    cuda.atomic.add(hist, np.int64((key >> ush) & np.uint64(0xFF)), 1)
            cuda.syncthreads()
            if tid == 0:
                rem = np.int64(st[2])
                acc = np.int64(0)
                d = _BINS - 1
                while d > 0 and acc + hist[d] < rem:
                    acc += hist[d]
                    d -= 1
                st[2] = np.uint64(rem - acc)
                st[0] = prefix | (np.uint64(d) << ush)
                st[1] = pmask | (np.uint64(0xFF) << ush)
            cuda.syncthreads()
            shift -= 8
            first = False
        K = st[0]
        ties = np.int64(st[2])
        g = np.int64(0)
        e = np.int64(0)
        for i in range(lo, hi):
            key = np.uint64(bits[i]) & um
            if key > K:
                g += 1
            elif key == K:
                e += 1
        gt[tid] = g
        eq[tid] = e
        cuda.syncthreads()
        if tid == 0:  # ties to the lowest segments; offsets of each segment's output
            off = np.int64(0)
            left = ties
            for t in range(T):
                take = min(eq[t], left)
                left -= take
                cnt = gt[t] + take
                gt[t] = off
                eq[t] = take
                off += cnt
        cuda.syncthreads()
        o = base + gt[tid]
        take = eq[tid]
        for i in range(lo, hi):
            key = np.uint64(bits[i]) & um
            if key > K or (key == K and take > 0):
                if key == K:
                    take -= 1
                idx[o] = i
                out_bits[o] = bits[i]
                o += 1
        cuda.syncthreads()  # the shared counts are reused by the next chunk
    if nb:
        cuda.atomic.add(bad, 0, nb)


def select(bits: Any, mask: Any, infkey: Any, chunk: int, k: int, idx: Any, out_bits: Any) -> int:
    """Device ``idx`` (int64) and ``out_bits`` get, chunk after chunk, the indices of each chunk's
    top ``min(k, length)`` keys in increasing order and their bit patterns. Returns 1 when some key
    is non-finite (the outputs are then unspecified): the one value read back on the host."""
    n = int(bits.shape[0])
    if n == 0:
        return 0
    bad = upload(np.zeros(1, np.int64))
    nchunks = (n + chunk - 1) // chunk
    blocks = max(1, min(_BLOCKS, nchunks))
    s = stream()
    cfg = (blocks, _T, s) if s else (blocks, _T)
    nbits = 8 * np.dtype(bits.dtype).itemsize
    _select[cfg](bits, mask, infkey, chunk, k, nbits, idx, out_bits, bad)
    return 1 if int(host(bad)[0]) else 0


# --------------------------------------------------------------------------------------------
# index_coding = "gap"


@cuda.jit
def _gap_widths(idx, chunk, k, n, widths, nbytes):  # pragma: no cover - device
    for c in range(cuda.grid(1), widths.shape[0], cuda.gridsize(1)):
        s = c * chunk
        kc = min(k, n - s)
        lo = c * k
        prev = np.int64(-1)
        acc = np.int64(0)
        for j in range(lo, lo + kc):
            o = np.int64(idx[j]) - s
            acc |= o - prev - 1
            prev = o
        w = 0
        while acc > 0:
            w += 1
            acc >>= 1
        widths[c] = w
        nbytes[c] = (kc * w + 7) // 8


def _offsets(idx: Any, chunk: int, k: int, n: int, widths: Any) -> tuple[Any, Any]:
    nc = int(widths.shape[0])
    off = cuda.device_array(nc, np.int64)
    _gap_widths[grid(nc)](idx, chunk, k, n, widths, off)
    return off, scan_exclusive(off)


def gap_widths(idx: Any, chunk: int, k: int, numel: int, widths: Any) -> int:
    """Each chunk's gap width into device ``widths``; returns the packed byte count (read on the
    host: the header needs it)."""
    if int(widths.shape[0]) == 0:
        return 0
    return int(host(_offsets(idx, chunk, k, numel, widths)[1])[0])


@cuda.jit
def _gap_pack(idx, chunk, k, n, widths, off, out):  # pragma: no cover - device
    for c in range(cuda.grid(1), widths.shape[0], cuda.gridsize(1)):
        s = c * chunk
        kc = min(k, n - s)
        lo = c * k
        w = np.uint64(widths[c])
        pos = np.int64(off[c])
        prev = np.int64(-1)
        acc = np.uint64(0)
        nacc = np.uint64(0)
        for j in range(lo, lo + kc):
            o = np.int64(idx[j]) - s
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


def gap_pack(idx: Any, chunk: int, k: int, numel: int, widths: Any, out: Any) -> int:
    """Pack every chunk's gaps at its width into device ``out``, one thread per chunk at its offset."""
    nc = int(widths.shape[0])
    if nc == 0:
        return 0
    w = device(widths)
    off, _ = _offsets(idx, chunk, k, numel, w)
    _gap_pack[grid(nc)](idx, chunk, k, numel, w, off, out)
    return int(out.shape[0])


# --------------------------------------------------------------------------------------------
# index_coding = "packed"


@cuda.jit
def _packed_pack(idx, chunk, width, out):  # pragma: no cover - device
    total = idx.shape[0]
    for b in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        v = np.int64(0)
        for q in range(8):
            bit = b * 8 + q
            e = bit // width
            if e < total:
                f = np.int64(idx[e]) % chunk
                v |= ((f >> (bit - e * width)) & 1) << q
        out[b] = np.uint8(v)


def packed_pack(idx: Any, chunk: int, width: int, out: Any) -> int:
    """Write ``idx[j] mod chunk`` at ``width`` bits, LSB first, into device ``out``; one thread per byte."""
    nb = int(out.shape[0])
    if nb and width:
        _packed_pack[grid(nb)](idx, chunk, width, out)
    return nb
