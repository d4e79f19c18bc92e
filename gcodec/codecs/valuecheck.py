"""Value rules over a payload's sections in bounded chunks.

A rule such as "every scale is finite and >= +0" written as one NumPy expression over a section
makes temporaries of the section's length (a boolean mask, a shifted copy), and the section's length
comes from the header. Checking a chunk at a time keeps every temporary under a few hundred KiB, so
what a value check allocates does not grow with the payload, and it still stops at the first bad
element.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["CHUNK", "first_bad", "negative_or_nonfinite_f16", "negative_or_nonfinite_f32"]

#: Elements per chunk: 64 Ki, so a check's temporaries stay within 64 Ki x 8 bytes.
CHUNK = 1 << 16


def first_bad(values: np.ndarray, bad: Callable[[np.ndarray], np.ndarray]) -> int:
    """The index of the first element of 1-D ``values`` where ``bad(chunk)`` (a boolean mask of the
    chunk) is True, or -1."""
    for lo in range(0, values.shape[0], CHUNK):
        mask = bad(values[lo : lo + CHUNK])
        if mask.any():
            return lo + int(np.flatnonzero(mask)[0])
    return -1


def negative_or_nonfinite_f32(sc: np.ndarray) -> np.ndarray:
    """float32 scales that are NaN, infinite or carry the sign bit (-0 included)."""
    return ~np.isfinite(sc) | (sc.view(np.uint32) >> 31).astype(bool)


def negative_or_nonfinite_f16(bits: np.ndarray) -> np.ndarray:
    """binary16 scales (as uint16 bits) that carry the sign bit or the all-ones exponent."""
    return ((bits & 0x8000) != 0) | ((bits & 0x7C00) == 0x7C00)
