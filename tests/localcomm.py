"""A one-rank, in-process Communicator: runs the transport protocols without an engine."""

from __future__ import annotations

from collections.abc import Sequence

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
