"""The CPU backend's threads: a small pool for ``nogil`` range kernels, and one thread for small tensors.

Kernels split their work into fixed-size chunks; their result never depends on the number of
threads. The quantizer, sign and feedback kernels are ``njit(nogil=True)`` functions over a range
of chunks, run on a small thread pool by :func:`run_chunks` (a ``parallel=True`` wrapper per kernel
cost 3-4 s of cold compile each); the others use ``numba.prange``. Both follow
``numba.get_num_threads()``.

Waking a thread pool costs tens of microseconds, and milliseconds when the cores are busy, which
dwarfs the work on a bias vector. :func:`threads_for` runs tensors below :data:`SMALL` elements on
the calling thread alone; the API layer wraps every encode and decode in it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numba

__all__ = ["SMALL", "run_chunks", "threads_for"]

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


_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _forget_pool_after_fork() -> None:
    # A forked child has none of the parent's worker threads, and the lock may have been held by
    # another parent thread at the fork: start over with a new lock and, when needed, a new pool.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _executor() -> ThreadPoolExecutor:
    """The worker threads (NUMBA_NUM_THREADS - 1 of them; made anew in a forked child)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max(1, numba.config.NUMBA_NUM_THREADS - 1), thread_name_prefix="gcodec")
            _pool_pid = os.getpid()
        return _pool


def run_chunks(kernel: Any, n: int, C: int, *args: Any) -> int:
    """The sum of ``kernel(*args, lo, hi)`` over a partition of [0, n) into ranges of whole
    ``C``-element chunks, one range per thread.

    ``kernel`` is an ``njit(nogil=True)`` function that does a range of chunks in order. As many
    threads run as ``numba.get_num_threads()`` says (the calling thread is one of them), so
    ``numba.set_num_threads`` and :func:`gcodec.kernels.threads_for` apply as to a ``prange``;
    the bytes never depend on the thread count. (A ``prange`` wrapper per kernel cost 3-4 s of
    cold compile each.)
    """
    nchunks = -(-n // C)
    t = min(numba.get_num_threads(), nchunks)
    if t <= 1:
        return int(kernel(*args, 0, n))
    cut = [min(n, nchunks * i // t * C) for i in range(t + 1)]
    futures = [_executor().submit(kernel, *args, cut[i], cut[i + 1]) for i in range(1, t)]
    total = int(kernel(*args, cut[0], cut[1]))
    return total + sum(int(f.result()) for f in futures)
