"""The communicator interface the protocols need, and the drivers that run a protocol on it.

A protocol (summable, gather, two-phase, PowerSGD) is written once, as a *generator* that starts
non-blocking collectives on a :class:`Communicator` and yields each :class:`Work` it must wait for.
It never blocks and never knows the engine. A driver decides how to wait:

* :func:`run_blocking` waits on each work in turn (``gcodec.mpi.allreduce``);
* :class:`Serial` runs protocols one after another and advances them only as far as completed
  work allows (``gcodec.mpi.iallreduce``'s ``test()``/``wait()``);
* ``gcodec.torch`` runs protocols on a queue thread of its own that waits on each work and
  completes a ``torch.futures.Future`` (the DDP hook returns that future and never blocks).

The interface is deliberately small: an in-place sum/max of a numeric array, an all-gather of
equal-sized arrays (for sizes), and variable-size all-gather and all-to-all of byte buffers. Every
engine has these (MPI natively; torch.distributed by padding the all-gather).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "AllWork",
    "Communicator",
    "DoneWork",
    "Protocol",
    "Serial",
    "Task",
    "Work",
    "run_blocking",
    "with_riders",
]


class Work(ABC):
    """A started collective. ``result()`` is valid once ``test()`` is true or ``wait()`` returned."""

    @abstractmethod
    def test(self) -> bool:
        """True when the collective has completed (never blocks)."""

    @abstractmethod
    def wait(self) -> Any:
        """Block until the collective completes; return its result."""

    @abstractmethod
    def result(self) -> Any:
        """The result of a completed collective."""


class DoneWork(Work):
    """A work that completed when it was made (size-1 communicators, empty exchanges)."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def test(self) -> bool:
        return True

    def wait(self) -> Any:
        return self._value

    def result(self) -> Any:
        return self._value


class AllWork(Work):
    """Several collectives started together (in the same order on every rank) and waited for as one;
    the result is the list of their results."""

    def __init__(self, works: Sequence[Work]) -> None:
        self._works = list(works)

    def test(self) -> bool:
        return all(w.test() for w in self._works)

    def wait(self) -> Any:
        return [w.wait() for w in self._works]

    def result(self) -> Any:
        return [w.result() for w in self._works]


class Communicator(ABC):
    """What a protocol needs from an engine. Every method starts a collective and returns at once.

    All ranks of the group must call the same methods in the same order with matching sizes, as
    for any collective; the protocols guarantee this, including when a rank fails locally (it then
    still takes part, sending a failure marker, so that no peer waits forever).

    **Arrays live on the caller's device.** The arrays a protocol hands over (values, payload bytes)
    live where its tensor lives: NumPy arrays in host memory, or device arrays (Numba device arrays;
    anything with ``__cuda_array_interface__``). A communicator moves them as they are (NCCL or a
    CUDA-aware MPI for device memory) and returns results on the same device: receive buffers are
    allocated where the input lives, never copied through the host. The one exception is
    :meth:`allgather`'s control words, which are always small host int64 arrays (a communicator
    whose engine takes no host memory, as NCCL, moves those few words through the device itself).
    """

    rank: int
    size: int

    @abstractmethod
    def allreduce(self, arr: Any, op: str = "sum") -> Work:
        """Reduce ``arr`` (float32, float64 or int64, C-contiguous, host or device) in place across ranks.
        A sum may also be of host float16 or bfloat16 (PowerSGD's 16-bit factors, summed in that
        format); a communicator that cannot sum one raises ConfigError.

        ``op`` is ``"sum"`` or ``"max"``. The result is ``arr``.
        """

    @abstractmethod
    def allgather(self, arr: np.ndarray) -> Work:
        """Gather one equal-sized int64 array from each rank; the result has shape ``(size, *arr.shape)``."""

    @abstractmethod
    def allgatherv(self, buf: Any, counts: Sequence[int]) -> Work:
        """Gather a uint8 buffer from each rank; ``counts[r]`` is rank r's length (known to all).

        The result is a list of ``size`` uint8 arrays on ``buf``'s device, rank order.
        """

    @abstractmethod
    def alltoallv(self, bufs: Sequence[Any], recv_counts: Sequence[int]) -> Work:
        """Send ``bufs[r]`` (uint8, all on one device) to rank r; receive ``recv_counts[r]`` bytes
        from rank r.

        The result is a list of ``size`` uint8 arrays on that device, rank order.
        """


#: A protocol: a generator that yields the works it waits for and returns its result.
Protocol = Generator[Work, None, Any]


def with_riders(comm: Communicator, riders: Any, data: Work) -> Work:
    """The data collective ``data`` (already started), with ``riders`` (flat float values of
    uncompressed tensors whose length the agreed configuration fixes, or None) summed in place by an
    allreduce started right after it, both waited for as one: the riders cost no round trip of
    their own. Every rank must call it at the same point, after the exchange's agreement."""
    if riders is None or riders.shape[0] == 0:
        return data
    return AllWork([comm.allreduce(riders, "sum"), data])


def run_blocking(proto: Protocol) -> Any:
    """Run a protocol to completion, waiting on each collective in turn; return its result."""
    try:
        work = next(proto)
        while True:
            work.wait()
            work = proto.send(None)
    except StopIteration as stop:
        return stop.value


class Task:
    """One protocol run by a :class:`Serial` queue: ``test()`` and ``wait()`` like an MPI request."""

    def __init__(self, queue: Serial, proto: Protocol) -> None:
        self._queue = queue
        self._proto = proto
        self._work: Work | None = None
        self._started = False
        self.done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def _advance(self) -> None:
        try:
            self._work = self._proto.send(None) if self._started else next(self._proto)
            self._started = True
        except StopIteration as stop:
            self.done, self._value, self._work = True, stop.value, None
        except BaseException as e:  # kept for wait(); the queue moves on to the next protocol
            self.done, self._error, self._work = True, e, None

    def _step(self, block: bool) -> bool:
        """Advance as far as completed work allows (or to the end when ``block``); True when done."""
        if not self._started:
            self._advance()
        while not self.done:
            assert self._work is not None
            if block:
                try:
                    self._work.wait()
                except BaseException as e:
                    self.done, self._error = True, e
                    break
            elif not self._work.test():
                return False
            self._advance()
        return True

    def test(self) -> bool:
        """Advance the queue without blocking; True once this protocol has finished."""
        self._queue.pump(None)
        return self.done

    def wait(self) -> Any:
        """Run the queue up to and including this protocol; return its result or raise its error."""
        self._queue.pump(self)
        if self._error is not None:
            raise self._error
        return self._value


class Serial:
    """Run protocols one at a time, in the order they were submitted.

    Collectives on one communicator must be started in the same order on every rank. Two protocols
    in flight at once would interleave their collectives in whatever order their waits happen to
    run, which can differ between ranks; a FIFO queue makes the order the submission order, which
    is the program order and hence the same everywhere.
    """

    def __init__(self) -> None:
        self._queue: deque[Task] = deque()

    def submit(self, proto: Protocol) -> Task:
        task = Task(self, proto)
        self._queue.append(task)
        self.pump(None)
        return task

    def pump(self, until: Task | None) -> None:
        """Advance queued protocols in order: without blocking, or blocking until ``until`` is done."""
        while self._queue:
            head = self._queue[0]
            block = until is not None and not until.done
            if not head._step(block):
                return
            self._queue.popleft()
            if until is not None and head is until:
                return
