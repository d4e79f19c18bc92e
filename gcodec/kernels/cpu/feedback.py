"""Error-feedback residuals on the CPU: ``residual = corrected - decoded`` in place, with a count of
non-finite results (the caller refuses to keep a residual that is not finite), and the decayed
correction ``corrected += decay * residual`` (two IEEE roundings: the product, then the sum)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .quant import CHUNK
from .threads import run_chunks

__all__ = ["add_decayed", "residual_inplace"]


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
    for i in range(lo, hi):
        d = decay * e[i]
        corrected[i] = corrected[i] + d
    return 0


def add_decayed(corrected: np.ndarray, e: np.ndarray, decay: float) -> None:
    """corrected += fl(decay * e) (flat arrays of one dtype, ``decay`` rounded to it first)."""
    run_chunks(_add_decayed_range, corrected.shape[0], CHUNK, corrected, e, corrected.dtype.type(decay))
