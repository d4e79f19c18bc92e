"""The CUDA backend: Numba CUDA kernels on device memory (CuPy, torch CUDA tensors, Numba device
arrays, anything with ``__cuda_array_interface__``), the same modules and functions as
``gcodec.kernels.cpu``. Imported only when a device array is encoded or decoded, so ``import
gcodec`` never imports ``numba.cuda`` nor initialises CUDA.

Modules: ``cast`` (fp16/bf16), ``quant`` (uniform, qsgd, terngrad), ``minifloat`` (fp8, mx, nvfp4),
``sign``, ``sparse`` (top-k, threshold, random-k, delta index coding, scatter), ``chunked``
(chunked top-k and its in-chunk index codings), ``dct`` (the chunked DCT and its inverse), ``lowrank``
(PowerSGD), ``feedback`` (error-feedback residuals), ``philox`` (specs/rng.md), ``memory`` (device
payload buffers and the device CRC32C).
``launch`` holds the launch geometry, the caller's current stream and the float helpers that keep
the compiler from fusing multiply-adds. Kernels are written once and
tested under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) against the CPU backend's bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from . import cast, chunked, dct, feedback, lowrank, memory, minifloat, philox, quant, sign, sparse
from .launch import SIM, adopt

__all__ = [
    "SIM",
    "cast",
    "chunked",
    "dct",
    "feedback",
    "lowrank",
    "memory",
    "minifloat",
    "philox",
    "quant",
    "sign",
    "sparse",
    "threads_for",
    "view",
]


@contextlib.contextmanager
def threads_for(n: int) -> Iterator[None]:
    """Host threads play no part on the device: a no-op context (the CPU backend's has a job)."""
    yield


def view(x: Any) -> Any:
    """``x`` as the array type this backend's kernels take (a Numba device array), without a copy."""
    return adopt(x)
