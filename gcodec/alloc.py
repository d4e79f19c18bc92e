"""The one allocator of decoding and validating: running out of memory is a LimitExceededError.

Every buffer whose size a payload decides (a decoded tensor, a 16-bit output's float32 staging
buffer, the indices and values of a sparse codec, random words, PowerSGD's factor copies, a
nested codec's output) is allocated by :func:`empty`. The limits bound those sizes before anything
is allocated (docs/limits.md), but a process can have less memory than the limits admit; then the
allocation fails here and the caller gets a :class:`~gcodec.LimitExceededError` that names what was
being allocated and how many bytes, never a ``MemoryError`` (specs/format.md §9: exceeding a limit is
a ``LimitExceededError``, never an allocation failure).

What is not allocated here is bounded by a constant (a kernel's fixed-size tile, the chunks a value
check works through) or is the parsed header, whose Python objects the header limits bound and whose
parse converts a ``MemoryError`` the same way (:func:`out_of_memory`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import LimitExceededError

__all__ = ["empty", "out_of_memory"]


def out_of_memory(what: str, nbytes: int | None = None) -> LimitExceededError:
    """The error of an allocation (of ``nbytes``, when it is one buffer) for ``what`` that the
    process could not make."""
    size = f"{nbytes} bytes" if nbytes is not None else "memory"
    return LimitExceededError(
        f"out of memory: cannot allocate {size} for {what}; this process has less memory than the "
        "limits admit: lower max_output_bytes and max_scratch_bytes (docs/limits.md) to refuse such "
        "payloads up front"
    )


def empty(what: str, shape: int | tuple[int, ...], dtype: Any, *, make: Callable[..., Any] = np.empty) -> Any:
    """An uninitialised array of ``shape`` and ``dtype`` for ``what`` (a few words: "the decoded
    tensor", "topk indices"), made by ``make(shape, dtype)`` (a backend's own allocator for device
    memory). A ``MemoryError`` becomes :func:`out_of_memory`'s ``LimitExceededError``."""
    try:
        return make(shape, dtype)
    except MemoryError:
        count = 1
        for d in (shape,) if isinstance(shape, int) else shape:
            count *= int(d)
        raise out_of_memory(what, count * np.dtype(dtype).itemsize) from None
