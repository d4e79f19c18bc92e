"""Kernel threads for ranks that share a machine.

gcodec's kernels run on gcodec's thread pool, which by default has one thread per core. When p
ranks share a machine, p pools of that size fight for the same cores (docs/transports.md,
"Threads", has what that cost a hook). Transports therefore pick a thread count from the job, in
this order:

1. the ``num_threads=`` argument of the transport state (an explicit choice always wins);
2. the ``GCODEC_NUM_THREADS`` environment variable;
3. ``OMP_NUM_THREADS`` (torchrun sets it to 1 when it starts several ranks per node);
4. the cores per local rank: ``os.sched_getaffinity`` (or ``os.cpu_count``) divided by the number of
   ranks on this host (learnt in the first handshake), and no more than torch's own
   ``torch.get_num_threads()`` when torch is loaded.

The count applies to the kernels the transport runs (encode, decode, residuals), on whatever thread
runs them (the DDP hook's callbacks run on the engine's threads), and never above
``NUMBA_NUM_THREADS``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numba

from ..threads import num_threads

__all__ = ["job_threads", "kernel_threads"]


def _max_threads() -> int:
    return max(int(numba.config.NUMBA_NUM_THREADS), 1)  # type: ignore[attr-defined]


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    try:
        n = int(v)
    except ValueError:
        return None
    return n if n > 0 else None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def job_threads(local_ranks: int, override: int | None = None) -> int:
    """The kernel thread count for one of ``local_ranks`` ranks on this machine (see the module doc)."""
    for n in (override, _env_int("GCODEC_NUM_THREADS"), _env_int("OMP_NUM_THREADS")):
        if n is not None:
            return max(1, min(n, _max_threads()))
    n = max(1, _cores() // max(1, local_ranks))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        n = min(n, max(1, int(torch.get_num_threads())))
    return max(1, min(n, _max_threads()))


@contextmanager
def kernel_threads(n: int | None) -> Iterator[None]:
    """Run the enclosed kernels on ``n`` threads (gcodec's setting, per calling thread)."""
    if n is None:
        yield
        return
    with num_threads(n):
        yield
