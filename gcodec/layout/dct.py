"""The DCT basis of ``dct`` (specs/codecs/dct.md §3): one float32 table per chunk length, shared by
every backend so that the CPU, the GPU and a stranger's decoder multiply by the same numbers.

``B[u][i]`` is the real number ``a_u cos(pi (2i + 1) u / (2C))``, ``a_0 = sqrt(1/C)``, ``a_u =
sqrt(2/C)`` otherwise (the orthonormal DCT-II), rounded to the nearest binary32. Evaluated here in
binary64 and rounded once: no entry lies near a binary32 rounding midpoint (tests/test_dct.py checks
every allowed C against 50-digit values), so this rounding is the correct one.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["ALL_CHUNKS", "CHUNKS", "CHUNKS_2D", "basis", "matrix_view", "side"]

#: The chunk lengths of a 1-D ``dct`` payload (C1): powers of two up to 256.
CHUNKS = tuple(1 << j for j in range(9))
#: The chunk lengths of a 2-D payload: tiles of s x s, s a power of two from 2 to 64.
CHUNKS_2D = tuple(1 << (2 * j) for j in range(1, 7))
ALL_CHUNKS = tuple(sorted(set(CHUNKS) | set(CHUNKS_2D)))


def side(chunk: int) -> int:
    """s of a 2-D tile of ``chunk = s * s`` elements."""
    return math.isqrt(chunk)


def matrix_view(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of the tensor as 2-D tiles see it: ``shape[0]`` rows, the product of the other
    dimensions as columns (never numel / rows: ``[0, 5]`` is 0 rows of 5, no tiles); one row for a
    0-d or 1-d tensor (dct.md §1, "Coefficients, dims = 2" and "Empty tensors")."""
    if len(shape) < 2:
        return 1, math.prod(shape)
    return shape[0], math.prod(shape[1:])


@functools.cache
def basis(chunk: int) -> np.ndarray:
    """The ``chunk`` x ``chunk`` float32 table ``B[u, i]`` (read-only)."""
    c = int(chunk)
    t = np.empty((c, c), np.float64)
    for u in range(c):
        a = math.sqrt((1.0 if u == 0 else 2.0) / c)
        for i in range(c):
            t[u, i] = a * math.cos(math.pi * (2 * i + 1) * u / (2 * c))
    out = t.astype(np.float32)
    out.flags.writeable = False
    return out
