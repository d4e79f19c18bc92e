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
    """Run ``fn(comm)`` on ``size`` thread ranks; per rank its return value or the exception it raised.

    ``timeout``: what a rank may wait for its peers at one collective on an idle machine; it is
    raised to 60 s (a first call compiles its kernels: seconds on a cold cache) and scaled by
    tests/procs.py's :func:`~tests.procs.scaled` (the load, GCODEC_TEST_TIMEOUT_SCALE): it is there
    to end a hang, not to time the machine."""
    import threading

    from tests.procs import scaled

    timeout = scaled(max(timeout, 60.0))
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


class LockstepComm(Communicator):
    """Rank ``rank`` of ``size`` ranks whose protocols one thread runs in lockstep (see
    :func:`run_lockstep`): a real communicator of arrays of the caller's memory, host or device
    (Numba device arrays, the simulator's included), copied and summed by :mod:`gcodec.xp`.

    Each collective posts this rank's contribution (a copy, on its memory) under the number of the
    collective; its work completes once every rank has posted that collective, and its result is
    what an engine would deliver: receive buffers on the same memory as the input. One thread and
    no barriers, so the CUDA simulator (which runs one kernel at a time) can drive several ranks.
    Sums are in rank order, ``((r0 + r1) + r2) + ...``, as :class:`ThreadComm`'s."""

    def __init__(self, hub: _LockstepHub, rank: int) -> None:
        self.hub, self.rank, self.size = hub, rank, hub.size
        self._n = 0

    def _post(self, kind: str, item: Any, finish: Callable[[list], Any]) -> Work:
        n = self._n
        self._n += 1
        slot = self.hub.slots.setdefault(n, [None] * self.size)
        kinds = self.hub.kinds.setdefault(n, kind)
        if kinds != kind:  # what MPI leaves undefined: fail loudly here
            raise AssertionError(f"collective #{n}: rank {self.rank} runs {kind}, another rank {kinds}")
        slot[self.rank] = item
        return _LockstepWork(slot, finish)

    @staticmethod
    def _dup(a: Any) -> Any:
        from gcodec import xp

        f = xp.flat(a)
        out = xp.empty(f, f.shape[0], f.dtype)
        xp.copy(out, f)
        return out

    def allreduce(self, arr: Any, op: str = "sum") -> Work:
        from gcodec import xp

        if op != "sum" and xp.on_device(arr):
            raise AssertionError(f"LockstepComm has no device {op!r} reduction")

        def finish(parts: list) -> Any:
            dst = xp.flat(arr)
            if op == "sum":
                xp.copy(dst, parts[0])
                for q in parts[1:]:
                    xp.add(dst, q)
            else:
                dst[...] = np.max(np.stack(parts), axis=0)
            return arr

        return self._post("allreduce", self._dup(arr), finish)

    def allgather(self, arr: np.ndarray) -> Work:
        # control words: host int64, as every communicator takes them
        return self._post("allgather", np.array(arr, copy=True), lambda parts: np.stack(parts))

    def allgatherv(self, buf: Any, counts: Sequence[int]) -> Work:
        def finish(parts: list) -> list:
            for r, (p, c) in enumerate(zip(parts, counts)):
                if p.shape[0] != int(c):
                    raise AssertionError(f"allgatherv: rank {r} sent {p.shape[0]} bytes, rank {self.rank} expected {c}")
            return [self._dup(p) for p in parts]  # this rank's receive buffers

        return self._post("allgatherv", self._dup(buf), finish)

    def alltoallv(self, bufs: Sequence[Any], recv_counts: Sequence[int]) -> Work:
        me = self.rank

        def finish(rows: list) -> list:
            got = [rows[r][me] for r in range(self.size)]
            for r, (p, c) in enumerate(zip(got, recv_counts)):
                if p.shape[0] != int(c):
                    raise AssertionError(f"alltoallv: rank {r} sent {p.shape[0]} bytes, rank {me} expected {c}")
            return [self._dup(p) for p in got]

        return self._post("alltoallv", [self._dup(b) for b in bufs], finish)


class _LockstepWork(Work):
    def __init__(self, slot: list, finish: Callable[[list], Any]) -> None:
        self._slot, self._finish = slot, finish
        self._have, self._value = False, None

    def test(self) -> bool:
        return all(s is not None for s in self._slot)

    def wait(self) -> Any:
        if not self.test():
            raise AssertionError("a lockstep collective was waited on before every rank started it (deadlock)")
        return self.result()

    def result(self) -> Any:
        if not self._have:
            self._value, self._have = self._finish(self._slot), True
        return self._value


class _LockstepHub:
    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: dict[int, list] = {}
        self.kinds: dict[int, str] = {}


def run_lockstep(size: int, fn: Callable[[LockstepComm], Any]) -> list[Any]:
    """Run the protocol ``fn(comm)`` returns (a generator of works) on ``size`` lockstep ranks, in
    one thread: each rank advances until it waits on a collective its peers have not all started;
    per rank its protocol's value or the exception it raised. A round in which no rank can advance
    is a deadlock: every rank still running gets an AssertionError."""
    hub = _LockstepHub(size)
    gens = [fn(LockstepComm(hub, r)) for r in range(size)]
    work: list[Any] = [None] * size
    out: list[Any] = [None] * size
    done = [False] * size
    started = [False] * size
    while not all(done):
        moved = False
        for r in range(size):
            if done[r] or (started[r] and not work[r].test()):
                continue
            moved = True
            try:
                if started[r]:
                    work[r].wait()  # completes it, as an engine's wait does (in-place sums land here)
                work[r] = gens[r].send(None) if started[r] else next(gens[r])
                started[r] = True
            except StopIteration as stop:
                done[r], out[r] = True, stop.value
            except BaseException as e:  # the caller inspects every rank's outcome
                done[r], out[r] = True, e
        if not moved:
            for r in range(size):
                if not done[r]:
                    done[r], out[r] = True, AssertionError(f"rank {r} waits on a collective its peers never start")
    return out
