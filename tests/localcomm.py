"""In-process communicators: one rank (:class:`LocalComm`), or several ranks as threads
(:class:`ThreadComm`), to run the transport protocols without an engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gcodec.transports import Communicator, DoneWork, Work


class LocalComm(Communicator):
    rank = 0
    size = 1

    def allreduce(self, arr: np.ndarray, op: str = "sum") -> Work:
        return DoneWork(arr)

    def allgather(self, arr: np.ndarray) -> Work:
        return DoneWork(arr.reshape(1, *arr.shape).copy())

    def allgatherv(self, buf: np.ndarray, counts: Sequence[int]) -> Work:
        return DoneWork([np.array(buf[: int(counts[0])], copy=True)])

    def alltoallv(self, bufs: Sequence[np.ndarray], recv_counts: Sequence[int]) -> Work:
        return DoneWork([np.array(bufs[0], copy=True)])


class ThreadComm(Communicator):
    """Rank ``rank`` of ``size`` ranks run as threads of one process (see :func:`run_threads`): real
    collectives over shared slots, each one a barrier, so a rank that waits for a message its peers
    never send fails with ``threading.BrokenBarrierError`` after ``timeout`` seconds instead of hanging."""

    def __init__(self, hub: _Hub, rank: int) -> None:
        self.hub, self.rank, self.size = hub, rank, hub.size

    def _swap(self, item: object) -> list:
        h = self.hub
        h.slots[self.rank] = item
        h.barrier.wait()
        got = list(h.slots)
        h.barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return got

    def allreduce(self, arr: np.ndarray, op: str = "sum") -> Work:
        parts = self._swap(arr.copy())
        arr[...] = np.sum(parts, axis=0) if op == "sum" else np.max(parts, axis=0)
        return DoneWork(arr)

    def allgather(self, arr: np.ndarray) -> Work:
        return DoneWork(np.stack(self._swap(np.array(arr, copy=True))))

    def allgatherv(self, buf: np.ndarray, counts: Sequence[int]) -> Work:
        parts = self._swap(np.array(buf, copy=True))
        for r, (p, c) in enumerate(zip(parts, counts)):
            if p.shape[0] != int(c):  # what MPI leaves undefined: fail loudly here
                raise AssertionError(f"allgatherv: rank {r} sent {p.shape[0]} bytes, rank {self.rank} expected {c}")
        return DoneWork(parts)

    def alltoallv(self, bufs: Sequence[np.ndarray], recv_counts: Sequence[int]) -> Work:
        rows = self._swap([np.array(b, copy=True) for b in bufs])
        got = [rows[r][self.rank] for r in range(self.size)]
        for r, (p, c) in enumerate(zip(got, recv_counts)):
            if p.shape[0] != int(c):
                raise AssertionError(f"alltoallv: rank {r} sent {p.shape[0]} bytes, rank {self.rank} expected {c}")
        return DoneWork(got)


class _Hub:
    def __init__(self, size: int, timeout: float) -> None:
        import threading

        self.size = size
        self.slots: list = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)


def run_threads(size: int, fn: Callable[[ThreadComm], Any], timeout: float = 20.0) -> list[Any]:
    """Run ``fn(comm)`` on ``size`` thread ranks; per rank its return value or the exception it raised."""
    import threading

    hub = _Hub(size, timeout)
    out: list[Any] = [None] * size

    def body(r: int) -> None:
        try:
            out[r] = fn(ThreadComm(hub, r))
        except BaseException as e:  # the caller inspects every rank's outcome
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return out
