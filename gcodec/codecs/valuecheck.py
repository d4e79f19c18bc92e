"""Value rules over a payload's sections, run by the backend that holds the section.

A rule such as "every scale is finite and >= +0" is named (the backends' ``VALUE_RULES``), not
written as a NumPy expression here, so that a section in device memory is checked on the device
and only the index of the first bad element comes back (docs/gpu.md, "Decoding a device payload").
The host backend checks a chunk at a time, so what a value check allocates does not grow with the
section (whose length comes from the header), and it still stops at the first bad element.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import kernels

__all__ = ["first_bad", "host_value", "last_byte"]


def first_bad(values: Any, rule: str, arg: float = 0.0) -> int:
    """The index of the first element of 1-D ``values`` that breaks the named rule, or -1.

    Rules: ``negative_or_nonfinite_f32`` (NaN, infinity or the sign bit, -0 included),
    ``negative_or_nonfinite_f16`` (binary16 bits: the sign bit or the all-ones exponent),
    ``product_overflows_f32`` (``float32(v * arg)`` infinite), ``above`` (a code above ``arg``),
    ``e4m3_signed_or_nan`` (an E4M3 code with the sign bit or 0x7F) and ``e4m3_times_overflows``
    (``float32(float32(e4m3(c) * arg) * 6)`` infinite)."""
    return int(kernels.of(values).memory.first_bad(values, rule, float(arg)))


def host_value(values: Any, i: int) -> Any:
    """Element ``i`` of 1-D ``values`` as a NumPy scalar (a small word copied from device memory)."""
    if isinstance(values, np.ndarray):
        return values[i]
    w = values.dtype.itemsize
    raw = kernels.of(values).memory.host_bytes(values.view(np.uint8), i * w, (i + 1) * w)
    return np.frombuffer(raw, values.dtype)[0]


def last_byte(values: Any) -> int:
    """The last byte of a uint8 section (the one whose unused high bits must be zero)."""
    return int(host_value(values, int(values.shape[0]) - 1))
