"""The CPU backend: fused Numba kernels on NumPy arrays in host memory, compiled once (``cache=True``).

Modules, one job each: ``cast`` (fp16/bf16), ``quant`` (scaled integer quantizers) with ``scales``
(group statistics and scale rules), ``bitpack`` (w-bit code streams) and ``simd`` (vector-IR
intrinsics), ``sign``, ``sparse`` (top-k selection, delta-coded indices, random-k), ``lowrank``
(PowerSGD products), ``philox`` (the generator of specs/rng.md), ``feedback`` (error-feedback
residuals), and ``threads`` (the chunk pool and the small-tensor rule).
"""

from __future__ import annotations

from . import cast, feedback, lowrank, philox, quant, sign, sparse
from .threads import SMALL, run_chunks, threads_for

__all__ = ["SMALL", "cast", "feedback", "lowrank", "philox", "quant", "run_chunks", "sign", "sparse", "threads_for"]
