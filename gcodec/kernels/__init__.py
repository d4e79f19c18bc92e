"""Hot loops, one per backend. ``*_cpu`` modules hold fused Numba kernels compiled with cache=True.

Every kernel works on flat, C-contiguous arrays and is the only place a codec's inner loop lives.
Parallel kernels split the work into fixed-size chunks over ``numba.prange``; their result does not
depend on the number of threads.

Waking a thread pool costs tens of microseconds, and milliseconds when the cores are busy, which
dwarfs the work on a bias vector. :func:`threads_for` runs tensors below :data:`SMALL` elements on
the calling thread alone; the API layer wraps every encode and decode in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba

__all__ = ["SMALL", "threads_for"]

#: Tensors with fewer elements than this run single-threaded.
SMALL = 1 << 16


@contextmanager
def threads_for(n: int) -> Iterator[None]:
    """Limit Numba's parallel regions to one thread (thread-locally) when ``n`` is small."""
    if n >= SMALL:
        yield
        return
    old = numba.get_num_threads()
    if old == 1:
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(old)
