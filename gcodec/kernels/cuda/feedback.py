"""Error-feedback residuals on the device: ``residual = corrected - decoded`` in place, with a count of
non-finite results (the caller refuses to keep a residual that is not finite), as the CPU's
``gcodec.kernels.cpu.feedback``: one IEEE subtraction per element, so the residual is bit-identical;
and the decayed correction ``corrected += decay * residual``, its product rounded on its own
(``launch.mul32``/``mul64``: the compiler must not fuse it into the sum); and the corrected input
``x + residual`` (:func:`add`). Both sums follow the NaN rule of specs/format.md §10 (a NaN sum is a
positive NaN), as on the CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from .launch import grid, host, mul32, mul64, pos_nan, upload

__all__ = ["add", "add_decayed", "residual_inplace"]


@cuda.jit
def _residual(corrected, decoded, bad):  # pragma: no cover - device
    c = np.int64(0)
    for i in range(cuda.grid(1), corrected.shape[0], cuda.gridsize(1)):
        r = corrected[i] - decoded[i]
        corrected[i] = r
        if not (abs(r) <= 1.7976931348623157e308):
            c += 1
    if c:
        cuda.atomic.add(bad, 0, c)


def residual_inplace(corrected: Any, decoded: Any) -> int:
    """corrected -= decoded (flat device arrays of one dtype); returns how many results are NaN or
    infinite (the one number that comes back to the host)."""
    bad = upload(np.zeros(1, np.int64))
    if int(corrected.shape[0]):
        _residual[grid(corrected.shape[0])](corrected, decoded, bad)
    return int(host(bad)[0])


@cuda.jit
def _add_decayed32(corrected, e, decay):  # pragma: no cover - device
    for i in range(cuda.grid(1), corrected.shape[0], cuda.gridsize(1)):
        corrected[i] = pos_nan(corrected[i] + mul32(decay, e[i]))


@cuda.jit
def _add_decayed64(corrected, e, decay):  # pragma: no cover - device
    for i in range(cuda.grid(1), corrected.shape[0], cuda.gridsize(1)):
        corrected[i] = pos_nan(corrected[i] + mul64(decay, e[i]))


def add_decayed(corrected: Any, e: Any, decay: float) -> None:
    """corrected += fl(decay * e) (flat device arrays of one dtype, ``decay`` rounded to it first)."""
    n = int(corrected.shape[0])
    if not n:
        return
    if np.dtype(corrected.dtype) == np.float32:
        _add_decayed32[grid(n)](corrected, e, np.float32(decay))
    else:
        _add_decayed64[grid(n)](corrected, e, np.float64(decay))


@cuda.jit
def _add(out, x, e):  # pragma: no cover - device
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = pos_nan(x[i] + e[i])


def add(out: Any, x: Any, e: Any) -> None:
    """out = x + e, a NaN sum made positive (flat device arrays of one dtype; ``out`` may be ``x``):
    error feedback's corrected input, as the CPU's :func:`gcodec.kernels.cpu.feedback.add`."""
    n = int(out.shape[0])
    if n:
        _add[grid(n)](out, x, e)
