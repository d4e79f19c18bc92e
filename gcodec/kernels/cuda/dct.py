"""The chunked DCT of ``dct`` (specs/codecs/dct.md §3, §6) on the device, bit-identical to
``gcodec.kernels.cpu.dct``: one thread per coefficient (forward) or per element (inverse), each a
loop in increasing order over exact binary32 x binary32 products accumulated in binary64 and rounded
once. A fused multiply-add of an exact product rounds exactly like the separate add, so the
compiler's contraction cannot change a bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from .launch import device, grid, mul32, pos_nan

__all__ = ["forward", "forward2", "inverse", "inverse2", "table"]

_TABLES: dict[int, Any] = {}


def table(t: np.ndarray) -> Any:
    """The basis table in device memory, uploaded once per chunk length."""
    c = int(t.shape[0])
    d = _TABLES.get(c)
    if d is None:
        d = _TABLES[c] = cuda.to_device(np.ascontiguousarray(t))
    return d


@cuda.jit
def _forward(x, chunk, tab, coef):  # pragma: no cover - device
    n = x.shape[0]
    for g in range(cuda.grid(1), coef.shape[0], cuda.gridsize(1)):
        s = (g // chunk) * chunk
        u = g - s
        L = min(chunk, n - s)
        acc = np.float64(0.0)
        for i in range(L):
            acc += np.float64(tab[u, i]) * np.float64(x[s + i])
        coef[g] = np.float32(acc)


def forward(x: Any, chunk: int, table: Any, coef: Any) -> None:
    """DCT-II of every chunk of device float32 ``x`` into device ``coef``."""
    m = int(coef.shape[0])
    if m:
        _forward[grid(m)](x, chunk, table, coef)


@cuda.jit
def _inverse(idx, vals, chunk, k, tab, out, accumulate):  # pragma: no cover - device
    for g in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        c = g // chunk
        s = c * chunk
        i = g - s
        acc = np.float64(0.0)
        for j in range(c * k, c * k + k):
            acc += np.float64(tab[idx[j] - s, i]) * np.float64(vals[j])
        v = np.float32(acc)
        if accumulate:  # a NaN sum made positive (format.md §10)
            out[g] = pos_nan(out[g] + v)
        else:
            out[g] = v


def inverse(idx: Any, vals: Any, chunk: int, k: int, table: Any, out: Any, accumulate: bool) -> None:
    """The inverse DCT of the kept coefficients (host-checked ``idx`` and ``vals``, copied once) into
    device ``out``."""
    n = int(out.shape[0])
    if n:
        _inverse[grid(n)](device(idx), device(vals), chunk, k, table, out, accumulate)


# --------------------------------------------------------------------------------------------
# dims = 2: s x s tiles, both dimensions (the CPU's order, one thread per output number)


@cuda.jit
def _columns(x, rows, cols, s, tab, T):  # pragma: no cover - device
    ntc = (cols + s - 1) // s
    for g in range(cuda.grid(1), T.shape[0], cuda.gridsize(1)):
        t = g // (s * s)
        p = (g // s) % s
        j = g % s
        r0 = (t // ntc) * s
        c0 = (t % ntc) * s
        acc = np.float64(0.0)
        if j < min(s, cols - c0):
            for i in range(min(s, rows - r0)):
                acc += np.float64(tab[p, i]) * np.float64(x[(r0 + i) * cols + c0 + j])
        T[g] = np.float32(acc)


@cuda.jit
def _rows(T, s, tab, coef):  # pragma: no cover - device
    for g in range(cuda.grid(1), coef.shape[0], cuda.gridsize(1)):
        t = g // (s * s)
        p = (g // s) % s
        q = g % s
        row = t * s * s + p * s
        acc = np.float64(0.0)
        for j in range(s):
            acc += np.float64(tab[q, j]) * np.float64(T[row + j])
        coef[g] = np.float32(acc)


def forward2(x: Any, rows: int, cols: int, s: int, table: Any, coef: Any) -> None:
    """2-D DCT-II of every s x s tile of device ``x`` (row-major rows x cols) into device ``coef``."""
    m = int(coef.shape[0])
    if m:
        T = cuda.device_array(m, np.float32)
        _columns[grid(m)](x, rows, cols, s, table, T)
        _rows[grid(m)](T, s, table, coef)


@cuda.jit
def _inverse2(idx, vals, rows, cols, s, k, tab, out, accumulate):  # pragma: no cover - device
    ntc = (cols + s - 1) // s
    for g in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        r = g // cols
        c = g - r * cols
        t = (r // s) * ntc + c // s
        i = r - (r // s) * s
        jj = c - (c // s) * s
        base = t * s * s
        acc = np.float64(0.0)
        for j in range(t * k, t * k + k):
            pq = np.int64(idx[j]) - base
            b = mul32(tab[pq // s, i], tab[pq % s, jj])
            acc += np.float64(b) * np.float64(vals[j])
        v = np.float32(acc)
        if accumulate:  # a NaN sum made positive (format.md §10)
            out[g] = pos_nan(out[g] + v)
        else:
            out[g] = v


def inverse2(idx: Any, vals: Any, rows: int, cols: int, s: int, k: int, table: Any, out: Any, accumulate: bool) -> None:
    """The inverse 2-D DCT of the kept coefficients (host-checked, copied once) into device ``out``."""
    n = int(out.shape[0])
    if n:
        _inverse2[grid(n)](device(idx), device(vals), rows, cols, s, k, table, out, accumulate)
