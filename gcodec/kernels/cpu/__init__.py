"""The CPU backend: fused Numba kernels on NumPy arrays in host memory, compiled once (``cache=True``).

Modules, one job each: ``cast`` (fp16/bf16), ``quant`` (scaled integer quantizers) with ``scales``
(group statistics and scale rules), ``bitpack`` (w-bit code streams) and ``simd`` (vector-IR
intrinsics), ``minifloat`` (fp8, mx and nvfp4 elements), ``sign``, ``sparse`` (top-k selection,
delta-coded indices, random-k), ``chunked`` (chunked top-k and its in-chunk index codings),
``dct`` (the chunked DCT and its inverse), ``lowrank`` (PowerSGD products), ``philox`` (the
generator of specs/rng.md), ``feedback`` (error-feedback residuals), ``memory`` (the payload
writer's buffer operations), and ``threads`` (the chunk pool and the small-tensor rule).
"""

from __future__ import annotations

from . import cast, chunked, dct, feedback, lowrank, memory, minifloat, philox, quant, sign, sparse
from .threads import SMALL, run_chunks, threads_for


def view(x: object) -> object:
    """``x`` as this backend's kernels take it: intake already made it a C-contiguous NumPy array."""
    return x


__all__ = [
    "SMALL",
    "cast",
    "chunked",
    "dct",
    "feedback",
    "lowrank",
    "memory",
    "minifloat",
    "philox",
    "quant",
    "run_chunks",
    "sign",
    "sparse",
    "threads_for",
    "view",
]
