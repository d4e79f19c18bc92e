"""PowerSGD on the device (specs/codecs/powersgd.md): the initial Q, the products, the
orthogonalisation, and the reconstruction in the spec's exact order.

* :func:`initial_q`: ``Q0[j, c] = 2 u(j r + c) - 1`` from the device Philox words (§5 step 2, normative):
  bit-identical to the CPU.
* :func:`compute_p` / :func:`compute_q`: ``P = M Q`` and ``Q = M^T P``, one thread per entry, each
  a sequential sum in the matrix's dtype. The spec leaves the encoder's products free (§5: factors
  are not bit-reproducible across implementations), so they differ from the CPU's (vectorised,
  reassociated) sums in the last bits. A cuBLAS path (CuPy) is the obvious next step for large
  matrices; it is not here.
* :func:`orthogonalize`: Gram-Schmidt for r <= 2 exactly as the CPU (float64 sums in the same
  order, products and differences through ``mul64``/``sub64``: no fused multiply-add), so it is
  bit-identical given the same input; Householder QR for r > 2 with LAPACK's reflector
  conventions (``geqrf``/``orgqr``: same signs as ``numpy.linalg.qr``), in float64. Both run on one
  thread: r is small and m is a layer's dimension, so this is short next to the products.
* :func:`reconstruct`: ``out (+)= P Qt`` with one thread per output element: ``s = +0``, then for
  c = 0 .. r-1 in order ``s = s + round(P[i, c] * Qt[c, j])`` (``mul32``/``mul64``: never fused),
  then ``out = s`` or ``out = out + s``: §6 step by step, so the bits equal the CPU decoder's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda

from ...rng import split64
from .launch import SIM, device, grid, host, mul32, mul64, one, pos_nan, stream, sub64, upload
from .philox import word

__all__ = [
    "MAX_KERNEL_RANK",
    "compute_p",
    "compute_q",
    "copy_of",
    "count_nonfinite",
    "gram_schmidt",
    "initial_q",
    "max_abs",
    "orthogonalize",
    "reconstruct",
]

MAX_KERNEL_RANK = 1 << 30  # every rank runs the kernels here (the CPU hands large ranks to BLAS)


# --------------------------------------------------------------------------------------------
# initial Q


@cuda.jit
def _initial_q(q, r, k0, k1, s0, s1):  # pragma: no cover - device
    n = q.shape[0]
    for w in range(cuda.grid(1), n * r, cuda.gridsize(1)):
        u = np.float32(np.uint32(word(w, s0, s1, k0, k1)) >> np.uint32(8)) * np.float32(5.9604644775390625e-08)
        q[w // r, w % r] = mul32(np.float32(2.0), u) - np.float32(1.0)  # exact: u has 24 bits


def initial_q(n: int, rank: int, seed: int, stream: int, dtype: Any = np.float32) -> Any:
    """The spec's initial Q (n x rank) on the device, bit for bit the CPU's."""
    q = cuda.device_array((max(n, 1), max(rank, 1)), np.dtype(dtype))[:n, :rank]
    if n * rank:
        k0, k1 = split64(seed)
        s0, s1 = split64(stream)
        _initial_q[grid(n * rank)](q, rank, k0, k1, s0, s1)
    return q


# --------------------------------------------------------------------------------------------
# products


@cuda.jit
def _mq(M, Q, P):  # pragma: no cover - device
    """P[i, c] = sum_j M[i, j] Q[j, c], j increasing."""
    m, n = M.shape
    r = Q.shape[1]
    for t in range(cuda.grid(1), m * r, cuda.gridsize(1)):
        i = t // r
        c = t - i * r
        s = P.dtype.type(0)
        for j in range(n):
            s += M[i, j] * Q[j, c]
        P[i, c] = s


@cuda.jit
def _mtp(M, P, Q):  # pragma: no cover - device
    """Q[j, c] = sum_i M[i, j] P[i, c], i increasing."""
    m, n = M.shape
    r = P.shape[1]
    for t in range(cuda.grid(1), n * r, cuda.gridsize(1)):
        j = t // r
        c = t - j * r
        s = Q.dtype.type(0)
        for i in range(m):
            s += M[i, j] * P[i, c]
        Q[j, c] = s


def _mat(rows: int, cols: int, dtype: Any) -> Any:
    return cuda.device_array((max(rows, 1), max(cols, 1)), np.dtype(dtype))[:rows, :cols]


def _cupy() -> Any:
    """CuPy, when it is installed and this is a real GPU (the simulator has no cuBLAS): the
    products then go to cuBLAS. The spec leaves the encoder's products free (powersgd.md §5), so
    no decode changes; only the factors' last bits do."""
    if SIM:
        return None
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _matmul(cp: Any, a: Any, b: Any, out: Any) -> None:  # pragma: no cover - needs a GPU and CuPy
    """out = a @ b with cuBLAS, on gcodec's current stream (views of the Numba arrays, no copy)."""
    s = stream()
    ptr = int(s.handle.value) if s else 0
    with cp.cuda.ExternalStream(ptr) if ptr else cp.cuda.Stream.null:
        cp.matmul(cp.asarray(a), cp.asarray(b), out=cp.asarray(out))


def compute_p(m: Any, q: Any, out: Any = None) -> Any:
    """P = M Q (device M: m x n, Q: n x r); cuBLAS through CuPy where CuPy is installed."""
    p = _mat(m.shape[0], q.shape[1], m.dtype) if out is None else out
    if p.size:
        cp = _cupy()
        if cp is not None:  # pragma: no cover - needs a GPU and CuPy
            _matmul(cp, m, device(q), p)
        else:
            _mq[grid(p.size)](m, device(q), p)
    return p


def compute_q(m: Any, p: Any, out: Any = None) -> Any:
    """Q = M^T P (device M: m x n, P: m x r); cuBLAS through CuPy where CuPy is installed."""
    q = _mat(m.shape[1], p.shape[1], m.dtype) if out is None else out
    if q.size:
        cp = _cupy()
        if cp is not None:  # pragma: no cover - needs a GPU and CuPy
            _matmul(cp, m.T, device(p), q)
        else:
            _mtp[grid(q.size)](m, device(p), q)
    return q


# --------------------------------------------------------------------------------------------
# orthogonalisation


@cuda.jit
def _gram_schmidt(A, epsilon):  # pragma: no cover - device
    """gcodec.kernels.cpu.lowrank.gram_schmidt, operation for operation (one thread)."""
    if cuda.grid(1) != 0:
        return
    m, r = A.shape
    for c in range(r):
        s = 0.0
        for i in range(m):
            a = np.float64(A[i, c])
            s += a * a  # exact in float64 (a float32 square): fused or not, the same
        d = math.sqrt(s) + epsilon
        inv = 1.0 / d if d > 0 else 0.0
        for i in range(m):
            A[i, c] = mul64(A[i, c], inv)
        for e in range(c + 1, r):
            dot = 0.0
            for i in range(m):
                dot += np.float64(A[i, c]) * np.float64(A[i, e])
            for i in range(m):
                A[i, e] = sub64(A[i, e], mul64(dot, A[i, c]))


def gram_schmidt(A: Any, epsilon: float) -> None:
    """Orthonormalise the columns of device A (m x r) in place, left to right (torch's rule)."""
    if A.size:
        _gram_schmidt[one()](A, float(epsilon))


@cuda.jit
def _householder(A, V, tau):  # pragma: no cover - device
    """A (m x r, m >= r) <- the reduced Q of its Householder QR, LAPACK's conventions, in float64.

    geqrf: for column k, alpha = A[k, k], x = A[k+1:, k]; beta = -sign(alpha) * ||(alpha, x)||,
    tau = (beta - alpha) / beta, v = (1, x / (alpha - beta)); the reflector is applied to the
    columns after k. orgqr: column c of Q is H_0 H_1 ... H_(r-1) e_c."""
    if cuda.grid(1) != 0:
        return
    m, r = A.shape
    for i in range(m):
        for c in range(r):
            V[i, c] = np.float64(A[i, c])
    for k in range(r):
        alpha = V[k, k]
        xn = 0.0
        for i in range(k + 1, m):
            xn += V[i, k] * V[i, k]
        if xn == 0.0:
            tau[k] = 0.0
            for i in range(k + 1, m):
                V[i, k] = 0.0
            continue
        beta = -math.copysign(math.sqrt(alpha * alpha + xn), alpha)
        tau[k] = (beta - alpha) / beta
        scal = 1.0 / (alpha - beta)
        for i in range(k + 1, m):
            V[i, k] = V[i, k] * scal
        for c in range(k + 1, r):
            w = V[k, c]
            for i in range(k + 1, m):
                w += V[i, k] * V[i, c]
            w *= tau[k]
            V[k, c] -= w
            for i in range(k + 1, m):
                V[i, c] -= w * V[i, k]
    for c in range(r):
        # x = e_c, then x <- H_k x for k = r-1 .. 0; x lives in A's column c (in float64 via V? no: A)
        for i in range(m):
            A[i, c] = 1.0 if i == c else 0.0
        for kk in range(r):
            k = r - 1 - kk
            if tau[k] == 0.0:
                continue
            w = np.float64(A[k, c])
            for i in range(k + 1, m):
                w += V[i, k] * np.float64(A[i, c])
            w *= tau[k]
            A[k, c] = np.float64(A[k, c]) - w
            for i in range(k + 1, m):
                A[i, c] = np.float64(A[i, c]) - w * V[i, k]


def orthogonalize(a: Any, epsilon: float = 1e-8) -> Any:
    """Orthonormalise the columns of device ``a`` (m x r) in place: Gram-Schmidt for r <= 2,
    Householder QR above (as the CPU: torch's choice)."""
    m, r = int(a.shape[0]), int(a.shape[1])
    if r == 0 or m == 0:
        return a
    if r <= 2:
        gram_schmidt(a, epsilon)
    else:
        # float64 work space: the Householder vectors, and Q itself for a float32 ``a`` (rounded once)
        V = cuda.device_array((m, r), np.float64)
        tau = cuda.device_array(r, np.float64)
        q64 = a if a.dtype == np.float64 else cuda.device_array((m, r), np.float64)
        if q64 is not a:
            _cast2[grid(m * r)](a, q64)
        _householder[one()](q64, V, tau)
        if q64 is not a:
            _cast2[grid(m * r)](q64, a)
    return a


@cuda.jit
def _cast2(src, dst):  # pragma: no cover - device
    r = src.shape[1]
    for t in range(cuda.grid(1), src.shape[0] * r, cuda.gridsize(1)):
        dst[t // r, t % r] = src[t // r, t % r]


# --------------------------------------------------------------------------------------------
# reconstruction (specs/codecs/powersgd.md §6)


@cuda.jit
def _recon32(P, Qt, out, accumulate):  # pragma: no cover - device
    r = P.shape[1]
    n = Qt.shape[1]
    for t in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        i = t // n
        j = t - i * n
        s = np.float32(0.0)
        for c in range(r):
            s = s + mul32(P[i, c], Qt[c, j])
        out[t] = pos_nan(out[t] + s) if accumulate else s  # format.md §10's NaN rule


@cuda.jit
def _recon64(P, Qt, out, accumulate):  # pragma: no cover - device
    r = P.shape[1]
    n = Qt.shape[1]
    for t in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        i = t // n
        j = t - i * n
        s = np.float64(0.0)
        for c in range(r):
            s = s + mul64(P[i, c], Qt[c, j])
        out[t] = pos_nan(out[t] + s) if accumulate else s  # format.md §10's NaN rule


def reconstruct(P: Any, Qt: Any, out: Any, accumulate: bool) -> None:
    """out[i*n + j] (+)= sum_c P[i, c] * Qt[c, j] in the order of §6, into device ``out`` (float32
    or float64, flat); ``P`` (m x r) and ``Qt`` (r x n) in out's dtype, host or device (copied once)."""
    if int(out.shape[0]) == 0:
        return
    kern = _recon64 if np.dtype(out.dtype) == np.float64 else _recon32
    kern[grid(out.shape[0])](device(P), device(Qt), out, bool(accumulate))


# --------------------------------------------------------------------------------------------
# checks and copies


@cuda.jit
def _nonfinite_maxabs(a, res, mx):  # pragma: no cover - device
    c = np.int64(0)
    best = 0.0
    for t in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        v = abs(np.float64(a[t]))
        if not (v <= 1.7976931348623157e308):
            c += 1
        elif v > best:
            best = v
    if c:
        cuda.atomic.add(res, 0, c)
    cuda.atomic.max(mx, 0, best)


def _flat(a: Any) -> Any:
    return a.reshape(int(a.size)) if a.ndim != 1 else a


def _scan(a: Any) -> tuple[int, float]:
    res = upload(np.zeros(1, np.int64))
    mx = upload(np.zeros(1, np.float64))
    if int(a.size):
        f = _flat(a)
        _nonfinite_maxabs[grid(f.shape[0])](f, res, mx)
    return int(host(res)[0]), float(host(mx)[0])


def count_nonfinite(a: Any) -> int:
    """How many entries of device ``a`` are NaN or infinite (the count comes to the host)."""
    return _scan(a)[0]


def max_abs(a: Any) -> float:
    """max |a| over the finite entries of device ``a`` (0 for an empty array)."""
    return _scan(a)[1]


@cuda.jit
def _copy_flat(src, dst):  # pragma: no cover - device
    for t in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        dst[t] = src[t]


def copy_of(a: Any, dtype: Any = None) -> Any:
    """A device copy of ``a`` (device or host, 2-D) in ``dtype`` (default: a's)."""
    dt = np.dtype(a.dtype if dtype is None else dtype)
    if isinstance(a, np.ndarray):
        return upload(np.ascontiguousarray(a, dtype=dt))
    out = _mat(a.shape[0], a.shape[1], dt)
    if int(a.size):
        _copy_flat[grid(a.size)](_flat(a), _flat(out))
    return out
