"""The CPU backend's threads: gcodec's own small pool for ``nogil`` range kernels.

Every CPU kernel is an ``njit(nogil=True)`` function over a range of whole chunks; :func:`run_chunks`
splits the work into one contiguous range per thread and runs them on a small
``ThreadPoolExecutor``. The bytes never depend on the number of threads.

gcodec never starts Numba's threading layer (no ``parallel=True``, no ``prange``, no
``numba.get/set_num_threads``). That layer is GNU OpenMP, TBB or Numba's ``workqueue``, whichever
loads; GNU OpenMP kills a child forked after a parallel region ("fork() called from a process already
using GNU OpenMP"), which is what DataLoader workers and many launchers do, and ``workqueue`` aborts
when several Python threads enter parallel regions at once. A plain pool has neither problem: it is
forgotten in a forked child and made anew on first use, and any number of Python threads may call
the kernels at once (tested under every layer). Compiling a ``parallel=True`` kernel also cost
3-4 s each, cold.

How many threads: :func:`get_num_threads` (default ``NUMBA_NUM_THREADS``, i.e. the cores, or the
environment variable), :func:`set_num_threads` for the process, :func:`num_threads` for a block of
code on the calling thread only. Waking a pool costs tens of microseconds, and milliseconds when the
cores are busy, which dwarfs the work on a bias vector: :func:`threads_for` runs tensors below
:data:`SMALL` elements on the calling thread alone; the API layer wraps every encode and decode in it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numba

__all__ = ["SMALL", "get_num_threads", "num_threads", "run_chunks", "set_num_threads", "threads_for"]

#: Tensors with fewer elements than this run single-threaded.
SMALL = 1 << 16


_default_threads: int | None = None  # set_num_threads(); None: NUMBA_NUM_THREADS
_local = threading.local()  # num_threads() overrides, per calling thread


def _check(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of kernel threads must be an integer >= 1, got {n!r}")
    return n


def get_num_threads() -> int:
    """Threads a kernel call on this thread may use: a :func:`num_threads` block's, else the process
    setting (:func:`set_num_threads`), else ``NUMBA_NUM_THREADS``."""
    n = getattr(_local, "n", None)
    if n is not None:
        return int(n)
    return _default_threads or int(numba.config.NUMBA_NUM_THREADS)


def set_num_threads(n: int | None) -> None:
    """Set the process-wide number of kernel threads (``None``: back to ``NUMBA_NUM_THREADS``).

    Several ranks on one machine should share its cores (see docs/transports.md): with two ranks on
    two cores, one thread each ran a uniform-4 DDP hook 3x faster than the default.
    """
    global _default_threads
    _default_threads = None if n is None else _check(n)


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Use ``n`` kernel threads for the calls made on this thread inside the block."""
    _check(n)
    old = getattr(_local, "n", None)
    _local.n = n
    try:
        yield
    finally:
        _local.n = old


@contextmanager
def threads_for(n: int) -> Iterator[None]:
    """Run a tensor of ``n`` elements on the calling thread alone when it is small (< :data:`SMALL`)."""
    if n >= SMALL or get_num_threads() == 1:
        yield
        return
    with num_threads(1):
        yield


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


_pool_size = 0


#: Address space a new pool thread may take: its stack (glibc's default 8 MiB, or
#: ``threading.stack_size()``) and the thread-local data of the loaded libraries, with room to spare.
_THREAD_ROOM = 32 << 20


def _room_for_threads(workers: int) -> bool:
    """Whether ``workers`` more threads fit under the process's address-space limit (``RLIMIT_AS``,
    e.g. ``ulimit -v`` or a job's memory cap). A thread that cannot get its thread-local data
    aborts the whole process inside glibc ("cannot allocate memory for thread-local data"), which
    nothing can catch; so without the room, the kernels run on the calling thread alone."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft == resource.RLIM_INFINITY:
            return True
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):  # no limit to read: nothing to guard against
        return True
    stack = threading.stack_size() or (8 << 20)
    return soft - mapped > workers * max(stack + (8 << 20), _THREAD_ROOM)


def _executor(workers: int) -> ThreadPoolExecutor | None:
    """A pool with at least ``workers`` threads (made anew in a forked child, or when more are
    needed); None when the process's address-space limit leaves no room for them."""
    global _pool, _pool_pid, _pool_size
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid() or _pool_size < workers:
            if not _room_for_threads(max(workers, int(numba.config.NUMBA_NUM_THREADS) - 1, 1)):
                return None
            old = _pool if _pool_pid == os.getpid() else None
            _pool_size = max(workers, int(numba.config.NUMBA_NUM_THREADS) - 1, 1)
            _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="gcodec")
            _pool_pid = os.getpid()
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def run_chunks(kernel: Any, n: int, C: int, *args: Any) -> int:
    """The sum of ``kernel(*args, lo, hi)`` over a partition of [0, n) into ranges of whole
    ``C``-element chunks, one range per thread.

    ``kernel`` is an ``njit(nogil=True)`` function that does a range of chunks in order. As many
    threads run as :func:`get_num_threads` says (the calling thread is one of them); the bytes
    never depend on the thread count.
    """
    nchunks = -(-n // C)
    t = min(get_num_threads(), nchunks)
    if t <= 1:
        return int(kernel(*args, 0, n))
    cut = [min(n, nchunks * i // t * C) for i in range(t + 1)]
    pool = _executor(t - 1)
    if pool is None:  # no room for threads under the address-space limit: the same bytes, on one thread
        return int(kernel(*args, 0, n))
    futures = [pool.submit(kernel, *args, cut[i], cut[i + 1]) for i in range(1, t)]
    total = int(kernel(*args, cut[0], cut[1]))
    return total + sum(int(f.result()) for f in futures)
