"""The chunked DCT of ``dct`` (specs/codecs/dct.md §3, §6) on the CPU.

Both directions multiply binary32 table entries by binary32 values: each product is exact in
binary64, the products are added in binary64 in increasing order, and the sum is rounded once to
binary32. Nothing here depends on the order in which LLVM schedules the loop or on fused
multiply-adds (an exact product plus a sum rounds the same either way), so the CUDA kernels give the
same bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .cast import pos_nan
from .quant import CHUNK
from .threads import run_chunks

__all__ = ["forward", "forward2", "inverse", "inverse2", "table"]


def table(t: np.ndarray) -> np.ndarray:
    """The basis table as this backend's kernels take it: the host array itself."""
    return t


@njit(cache=True, nogil=True)
def _forward_range(x, chunk, table, coef, lo, hi):  # pragma: no cover - jitted
    """Coefficients of chunks lo .. hi-1: coef[c C + u] = fl32(sum_i B[u, i] x[c C + i]) over the
    chunk's elements (the zeros that pad a short last chunk add nothing)."""
    n = x.shape[0]
    for c in range(lo, hi):
        s = c * chunk
        L = min(chunk, n - s)
        for u in range(chunk):
            acc = 0.0
            for i in range(L):
                acc += np.float64(table[u, i]) * np.float64(x[s + i])
            coef[s + u] = np.float32(acc)
    return 0


def forward(x: np.ndarray, chunk: int, table: np.ndarray, coef: np.ndarray) -> None:
    """DCT-II of every chunk of float32 ``x`` into ``coef`` (``ceil(n / chunk) * chunk`` float32)."""
    nchunks = (x.shape[0] + chunk - 1) // chunk
    if nchunks:
        run_chunks(_forward_range, nchunks, max(1, CHUNK // (chunk * chunk)), x, chunk, table, coef)


@njit(cache=True, nogil=True)
def _inverse_range(idx, vals, chunk, k, table, n, out, accumulate, lo, hi):  # pragma: no cover - jitted
    """out[c C + i] (+)= fl32(sum_j B[u_j, i] v_j) over chunk c's kept entries j in increasing order."""
    for c in range(lo, hi):
        s = c * chunk
        L = min(chunk, n - s)
        j0 = c * k
        for i in range(L):
            acc = 0.0
            for j in range(j0, j0 + k):
                acc += np.float64(table[idx[j] - s, i]) * np.float64(vals[j])
            v = np.float32(acc)
            if accumulate:  # a NaN sum made positive (format.md §10)
                out[s + i] = pos_nan(out[s + i] + v)
            else:
                out[s + i] = v
    return 0


def inverse(
    idx: np.ndarray, vals: np.ndarray, chunk: int, k: int, table: np.ndarray, out: np.ndarray, accumulate: bool
) -> None:
    """The inverse DCT (DCT-III) of the kept coefficients (global coefficient indices ``idx``, k per
    chunk, increasing, and float32 ``vals``) into ``out`` (the tensor's ``n`` elements)."""
    n = out.shape[0]
    nchunks = (n + chunk - 1) // chunk
    if nchunks:
        run_chunks(
            _inverse_range,
            nchunks,
            max(1, CHUNK // (chunk * max(k, 1))),
            idx,
            vals,
            chunk,
            k,
            table,
            n,
            out,
            accumulate,
        )


# --------------------------------------------------------------------------------------------
# dims = 2: s x s tiles of a rows x cols matrix, transformed along both dimensions (spec §3.2)


@njit(cache=True, nogil=True)
def _forward2_range(x, rows, cols, s, table, coef, lo, hi):  # pragma: no cover - jitted
    """Tiles lo .. hi-1: T[p, j] = fl32(sum_i B[p, i] x[i, j]) down the columns, then
    coef[t s^2 + p s + q] = fl32(sum_j B[q, j] T[p, j]) along the rows (padding elements are +0)."""
    ntc = (cols + s - 1) // s
    T = np.empty((s, s), np.float32)
    for t in range(lo, hi):
        r0 = (t // ntc) * s
        c0 = (t % ntc) * s
        ri = min(s, rows - r0)
        cj = min(s, cols - c0)
        for p in range(s):
            for j in range(s):
                acc = 0.0
                if j < cj:
                    for i in range(ri):
                        acc += np.float64(table[p, i]) * np.float64(x[(r0 + i) * cols + c0 + j])
                T[p, j] = np.float32(acc)
        base = t * s * s
        for p in range(s):
            for q in range(s):
                acc = 0.0
                for j in range(s):
                    acc += np.float64(table[q, j]) * np.float64(T[p, j])
                coef[base + p * s + q] = np.float32(acc)
    return 0


def forward2(x: np.ndarray, rows: int, cols: int, s: int, table: np.ndarray, coef: np.ndarray) -> None:
    """2-D DCT-II of every s x s tile of the row-major ``rows x cols`` float32 ``x`` into ``coef``."""
    ntiles = coef.shape[0] // (s * s)
    if ntiles:
        run_chunks(_forward2_range, ntiles, max(1, CHUNK // (s * s * s)), x, rows, cols, s, table, coef)


@njit(cache=True, nogil=True)
def _inverse2_range(idx, vals, rows, cols, s, k, table, out, accumulate, lo, hi):  # pragma: no cover - jitted
    """out[r, c] (+)= fl32(sum_j fl32(B[p_j, i] B[q_j, jj]) v_j) over tile t's kept entries j in order."""
    ntc = (cols + s - 1) // s
    for t in range(lo, hi):
        r0 = (t // ntc) * s
        c0 = (t % ntc) * s
        base = t * s * s
        j0 = t * k
        for i in range(min(s, rows - r0)):
            for jj in range(min(s, cols - c0)):
                acc = 0.0
                for j in range(j0, j0 + k):
                    pq = idx[j] - base
                    b = np.float32(table[pq // s, i] * table[pq % s, jj])
                    acc += np.float64(b) * np.float64(vals[j])
                v = np.float32(acc)
                o = (r0 + i) * cols + c0 + jj
                if accumulate:
                    out[o] = pos_nan(out[o] + v)
                else:
                    out[o] = v
    return 0


def inverse2(
    idx: np.ndarray,
    vals: np.ndarray,
    rows: int,
    cols: int,
    s: int,
    k: int,
    table: np.ndarray,
    out: np.ndarray,
    accumulate: bool,
) -> None:
    """The inverse 2-D DCT of the kept coefficients (k per tile) into the row-major ``out``."""
    ntiles = ((rows + s - 1) // s) * ((cols + s - 1) // s)
    if ntiles:
        run_chunks(
            _inverse2_range,
            ntiles,
            max(1, CHUNK // (s * s * max(k, 1))),
            idx,
            vals,
            rows,
            cols,
            s,
            k,
            table,
            out,
            accumulate,
        )
