"""PowerSGD's products and reconstruction for small ranks, memory-bound (specs/codecs/powersgd.md).

For rank r <= 8 a skinny product is limited by reading M once, and general BLAS does poorly on it
(it repacks M, and torch's ``bmm`` with a transposed M is ~10x slower than one streaming pass).
These kernels stream M once per product, with the factor held transposed (``Qt``: r x n, rows
contiguous) and the rank padded to a multiple of 4 so that four accumulators share each load of
M:

* :func:`mat_q`: ``P = M @ Qt.T`` (m x rp), four dot products per row of M, parallel over rows.
* :func:`mat_tp`: ``Qt = P.T @ M`` (rp x n), axpy updates over column chunks that stay in L1,
  four rows of M at a time, parallel over column chunks (no reduction between threads).
* :func:`reconstruct`: ``out (+)= P @ Qt`` into the caller's buffer, row by row, no temporary of
  the output's size, in the exact order of specs/codecs/powersgd.md §6 (any rank).
* :func:`gram_schmidt`: in-place column orthonormalisation with an epsilon for zero columns.

Floating-point results of the encoder's products depend on summation order (``reassoc`` is allowed
there); PowerSGD's factors are not bit-reproducible across backends, and the spec does not ask them
to be. Decoding (:func:`reconstruct`) is: it is compiled without fastmath and follows the spec's
order, so every conforming backend decodes a payload to the same bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .cast import pos_nan
from .threads import run_chunks

_FM = {"reassoc", "contract", "nsz", "arcp"}  # no nnan/ninf: NaN and inf propagate as usual
MAX_KERNEL_RANK = 8  # above this, the encoder's products (compute_p, compute_q) use BLAS
_ROWS = 64  # rows of M per mat_q chunk


@njit(cache=True, nogil=True, fastmath=_FM)
def _mat_q_rows(M, Qt, P, lo, hi):  # pragma: no cover - jitted
    """Rows lo .. hi-1 of P[i, c] = sum_j M[i, j] * Qt[c, j] for c < rp (rp = Qt.shape[0], a multiple of 4)."""
    n = M.shape[1]
    rp = Qt.shape[0]
    for i in range(lo, hi):
        for c0 in range(0, rp, 4):
            a0 = M.dtype.type(0)
            a1 = M.dtype.type(0)
            a2 = M.dtype.type(0)
            a3 = M.dtype.type(0)
            for j in range(n):
                v = M[i, j]
                a0 += v * Qt[c0, j]
                a1 += v * Qt[c0 + 1, j]
                a2 += v * Qt[c0 + 2, j]
                a3 += v * Qt[c0 + 3, j]
            P[i, c0] = a0
            P[i, c0 + 1] = a1
            P[i, c0 + 2] = a2
            P[i, c0 + 3] = a3
    return 0


def mat_q(M: np.ndarray, Qt: np.ndarray, P: np.ndarray) -> None:
    """P = M @ Qt.T (m x rp), blocks of rows on the kernel threads."""
    run_chunks(_mat_q_rows, M.shape[0], _ROWS, M, Qt, P)


@njit(cache=True, fastmath=_FM, inline="never")
def _tp_chunk(M, P, Qt, j0_, j1_):  # pragma: no cover - jitted
    """Columns j0 .. j1-1 of Qt = P.T @ M. Unsigned column indices: no wraparound code, so LLVM vectorises."""
    m = M.shape[0]
    rp = P.shape[1]
    j0 = np.uint64(j0_)
    j1 = np.uint64(j1_)
    m4 = m - m % 4
    for c in range(rp):
        for j in range(j0, j1):
            Qt[c, j] = 0
    for c0 in range(0, rp, 4):
        for i0 in range(0, m4, 4):
            p00 = P[i0, c0]
            p01 = P[i0, c0 + 1]
            p02 = P[i0, c0 + 2]
            p03 = P[i0, c0 + 3]
            p10 = P[i0 + 1, c0]
            p11 = P[i0 + 1, c0 + 1]
            p12 = P[i0 + 1, c0 + 2]
            p13 = P[i0 + 1, c0 + 3]
            p20 = P[i0 + 2, c0]
            p21 = P[i0 + 2, c0 + 1]
            p22 = P[i0 + 2, c0 + 2]
            p23 = P[i0 + 2, c0 + 3]
            p30 = P[i0 + 3, c0]
            p31 = P[i0 + 3, c0 + 1]
            p32 = P[i0 + 3, c0 + 2]
            p33 = P[i0 + 3, c0 + 3]
            for j in range(j0, j1):
                v0 = M[i0, j]
                v1 = M[i0 + 1, j]
                v2 = M[i0 + 2, j]
                v3 = M[i0 + 3, j]
                Qt[c0, j] += v0 * p00 + v1 * p10 + v2 * p20 + v3 * p30
                Qt[c0 + 1, j] += v0 * p01 + v1 * p11 + v2 * p21 + v3 * p31
                Qt[c0 + 2, j] += v0 * p02 + v1 * p12 + v2 * p22 + v3 * p32
                Qt[c0 + 3, j] += v0 * p03 + v1 * p13 + v2 * p23 + v3 * p33
        for i in range(m4, m):
            p0 = P[i, c0]
            p1 = P[i, c0 + 1]
            p2 = P[i, c0 + 2]
            p3 = P[i, c0 + 3]
            for j in range(j0, j1):
                v = M[i, j]
                Qt[c0, j] += v * p0
                Qt[c0 + 1, j] += v * p1
                Qt[c0 + 2, j] += v * p2
                Qt[c0 + 3, j] += v * p3


@njit(cache=True, nogil=True)
def _tp_range(M, P, Qt, lo, hi):  # pragma: no cover - jitted
    _tp_chunk(M, P, Qt, lo, hi)
    return 0


def mat_tp(M: np.ndarray, P: np.ndarray, Qt: np.ndarray) -> None:
    """Qt[c, j] = sum_i P[i, c] * M[i, j] for c < rp (rp = P.shape[1], a multiple of 4).

    Columns are split into one contiguous range per kernel thread (whole blocks of 64), each a
    stream over all rows of M, four rows at a time; the range's Qt stays in cache.
    """
    run_chunks(_tp_range, M.shape[1], 64, M, P, Qt)


RECON_COLS = 1024  # output columns per reconstruct tile: the tile's sums stay in L1


@njit(cache=True, inline="never")  # no fastmath: the spec's order, each product rounded, no FMA
def _reconstruct_rows(P, Qt, out, i0, i1, accumulate):  # pragma: no cover - jitted
    """Rows i0 .. i1-1 of out (+)= P @ Qt, in the order of specs/codecs/powersgd.md §6.

    For each output element the sum starts at +0 and adds the rounded products for c = 0 .. r-1
    in turn; with ``accumulate`` the finished sum is added to ``out`` once (a NaN result made
    positive, format.md §10: only a NaN already in ``out`` can give one, P and Q being finite). The
    terms go four per pass over a tile of columns (still added one after the other:
    ``((s + t0) + t1) + ...``), and each update is elementwise over the tile, so it vectorises
    without reassociation. Without ``accumulate`` the sums are built in ``out`` itself; with it, in
    a tile ``acc`` whose last pass ends in the add into ``out`` (ranks 1 and 4 need no tile).
    """
    r = P.shape[1]
    n = Qt.shape[1]
    acc = np.empty(min(n, RECON_COLS), out.dtype)
    z = out.dtype.type(0)
    for i in range(i0, i1):
        for j0 in range(0, n, RECON_COLS):
            w = np.uint64(min(RECON_COLS, n - j0))
            b = np.uint64(i) * np.uint64(n) + np.uint64(j0)
            u = np.uint64(j0)
            c = 0
            first = True
            while c < r:
                k = 4 if r - c >= 4 else 1
                last = c + k == r
                p0 = P[i, c]
                p1 = P[i, c + 1] if k > 1 else p0
                p2 = P[i, c + 2] if k > 2 else p0
                p3 = P[i, c + 3] if k > 3 else p0
                if k == 4:
                    if first and last:
                        if accumulate:
                            for j in range(w):
                                out[b + j] = pos_nan(
                                    out[b + j]
                                    + (
                                        (((z + p0 * Qt[c, u + j]) + p1 * Qt[c + 1, u + j]) + p2 * Qt[c + 2, u + j])
                                        + p3 * Qt[c + 3, u + j]
                                    )
                                )
                        else:
                            for j in range(w):
                                out[b + j] = (
                                    ((z + p0 * Qt[c, u + j]) + p1 * Qt[c + 1, u + j]) + p2 * Qt[c + 2, u + j]
                                ) + p3 * Qt[c + 3, u + j]
                    elif first:
                        if accumulate:
                            for j in range(w):
                                acc[j] = (
                                    ((z + p0 * Qt[c, u + j]) + p1 * Qt[c + 1, u + j]) + p2 * Qt[c + 2, u + j]
                                ) + p3 * Qt[c + 3, u + j]
                        else:
                            for j in range(w):
                                out[b + j] = (
                                    ((z + p0 * Qt[c, u + j]) + p1 * Qt[c + 1, u + j]) + p2 * Qt[c + 2, u + j]
                                ) + p3 * Qt[c + 3, u + j]
                    elif last and accumulate:
                        for j in range(w):
                            out[b + j] = pos_nan(
                                out[b + j]
                                + (
                                    (((acc[j] + p0 * Qt[c, u + j]) + p1 * Qt[c + 1, u + j]) + p2 * Qt[c + 2, u + j])
                                    + p3 * Qt[c + 3, u + j]
                                )
                            )
                    elif accumulate:
                        for j in range(w):
                            acc[j] = (
                                ((acc[j] + p0 * Qt[c, u + j]) + p1 * Qt[c + 1, u + j]) + p2 * Qt[c + 2, u + j]
                            ) + p3 * Qt[c + 3, u + j]
                    else:
                        for j in range(w):
                            out[b + j] = (
                                ((out[b + j] + p0 * Qt[c, u + j]) + p1 * Qt[c + 1, u + j]) + p2 * Qt[c + 2, u + j]
                            ) + p3 * Qt[c + 3, u + j]
                    c += 4
                else:  # one term
                    if accumulate:
                        if first and last:
                            for j in range(w):
                                out[b + j] = pos_nan(out[b + j] + (z + p0 * Qt[c, u + j]))
                        elif first:
                            for j in range(w):
                                acc[j] = z + p0 * Qt[c, u + j]
                        elif last:
                            for j in range(w):
                                out[b + j] = pos_nan(out[b + j] + (acc[j] + p0 * Qt[c, u + j]))
                        else:
                            for j in range(w):
                                acc[j] = acc[j] + p0 * Qt[c, u + j]
                    else:
                        if first:
                            for j in range(w):
                                out[b + j] = z + p0 * Qt[c, u + j]
                        else:
                            for j in range(w):
                                out[b + j] = out[b + j] + p0 * Qt[c, u + j]
                    c += 1
                first = False


@njit(cache=True, nogil=True)
def _reconstruct_range(P, Qt, out, accumulate, lo, hi):  # pragma: no cover - jitted
    _reconstruct_rows(P, Qt, out, lo, hi, accumulate)
    return 0


def reconstruct(P: np.ndarray, Qt: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """out[i*n + j] (+)= sum_c P[i, c] * Qt[c, j]: ``out`` is the flat m*n output (float32/float64).

    Any rank. The sum of each element is the spec's (specs/codecs/powersgd.md §6): from +0, the
    products rounded one by one and added for c = 0 .. r-1, no fused multiply-add; then one add
    to ``out`` when accumulating. Blocks of rows on the kernel threads.
    """
    run_chunks(_reconstruct_range, P.shape[0], 8, P, Qt, out, accumulate)


@njit(cache=True)
def gram_schmidt(A, epsilon):  # pragma: no cover - jitted
    """Orthonormalise the columns of A (m x r) in place, left to right (torch's PowerSGD rule).

    Column c is divided by ``norm + epsilon`` (so a zero column stays zero instead of becoming
    NaN) and then projected out of the columns after it. Dot products and norms accumulate in
    float64.
    """
    m, r = A.shape
    for c in range(r):
        s = 0.0
        for i in range(m):
            s += np.float64(A[i, c]) * np.float64(A[i, c])
        inv = 1.0 / (np.sqrt(s) + epsilon) if (np.sqrt(s) + epsilon) > 0 else 0.0
        for i in range(m):
            A[i, c] = A[i, c] * inv
        for d in range(c + 1, r):
            dot = 0.0
            for i in range(m):
                dot += np.float64(A[i, c]) * np.float64(A[i, d])
            for i in range(m):
                A[i, d] = A[i, d] - dot * A[i, c]


@njit(cache=True)
def count_nonfinite(a):  # pragma: no cover - jitted
    c = 0
    for x in a.ravel():
        c += not np.isfinite(x)
    return c


@njit(cache=True)
def _max_abs_flat(a):  # pragma: no cover - jitted
    best = 0.0
    for x in a:
        v = abs(np.float64(x))
        if v != v:  # NaN, as np.max(np.abs(a)) gives
            return v
        if v > best:
            best = v
    return best


def max_abs(a: np.ndarray) -> float:
    """max |a| (0 for an empty array; NaN if ``a`` holds one), without the temporary ``np.abs(a)``
    would make: ``a`` may be a payload's factor, sized by its header."""
    return float(_max_abs_flat(a.reshape(-1))) if a.size else 0.0
