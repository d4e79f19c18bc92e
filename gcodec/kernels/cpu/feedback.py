"""Error-feedback residuals on the CPU: ``residual = corrected - decoded`` in place, with a count of
non-finite results (the caller refuses to keep a residual that is not finite), the corrected input
``x + residual`` (:func:`add`), and the decayed correction ``corrected += decay * residual`` (two
IEEE roundings: the product, then the sum). Both sums follow the NaN rule of specs/format.md §10:
a NaN sum is a positive NaN, so the corrected input has the same bits on every backend."""

from __future__ import annotations

import numpy as np
from numba import njit

from .cast import pos_nan
from .quant import CHUNK
from .threads import run_chunks

__all__ = ["add", "add_decayed", "residual_inplace"]


@njit(cache=True, nogil=True)
def _residual_range(corrected, decoded, lo, hi):  # pragma: no cover - jitted
    """corrected[lo:hi] -= decoded[lo:hi]; returns how many results are NaN or infinite."""
    bad = 0
    for i in range(lo, hi):
        r = corrected[i] - decoded[i]
        corrected[i] = r
        bad += not (abs(r) <= 1.7976931348623157e308)
    return bad


def residual_inplace(corrected: np.ndarray, decoded: np.ndarray) -> int:
    """corrected -= decoded (flat arrays of one dtype); returns how many results are NaN or infinite."""
    return run_chunks(_residual_range, corrected.shape[0], CHUNK, corrected, decoded)


@njit(cache=True, nogil=True)
def _add_decayed_range(corrected, e, decay, lo, hi):  # pragma: no cover - jitted
    """corrected[lo:hi] += decay * e[lo:hi], the product rounded first (no fused multiply-add:
    Numba does not contract without fastmath)."""
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)  # unsigned: no wraparound select, so the loop vectorises
        d = decay * e[i]
        corrected[i] = pos_nan(corrected[i] + d)
    return 0


def add_decayed(corrected: np.ndarray, e: np.ndarray, decay: float) -> None:
    """corrected += fl(decay * e) (flat arrays of one dtype, ``decay`` rounded to it first; a NaN sum
    is a positive NaN)."""
    run_chunks(_add_decayed_range, corrected.shape[0], CHUNK, corrected, e, corrected.dtype.type(decay))


@njit(cache=True, nogil=True)
def _add_range(out, x, e, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)
        out[i] = pos_nan(x[i] + e[i])
    return 0


def add(out: np.ndarray, x: np.ndarray, e: np.ndarray) -> None:
    """out = x + e, one IEEE addition per element, a NaN sum made positive (flat arrays of one
    dtype, float32 or float64; ``out`` may be ``x``): error feedback's corrected input, bit for bit
    what the fused encode kernels form."""
    run_chunks(_add_range, out.shape[0], CHUNK, out, x, e)
