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

from .quant import CHUNK
from .threads import run_chunks

__all__ = ["forward", "inverse", "table"]


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
            if accumulate:
                out[s + i] += v
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
