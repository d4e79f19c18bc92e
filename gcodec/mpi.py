"""Compressed allreduce over MPI (mpi4py): ``gcodec.mpi.allreduce`` and ``iallreduce``.

>>> from mpi4py import MPI                                   # doctest: +SKIP
>>> import gcodec, gcodec.mpi, numpy as np                   # doctest: +SKIP
>>> grad = np.random.default_rng(MPI.COMM_WORLD.rank).standard_normal(1 << 20, dtype=np.float32)
>>> mean = gcodec.mpi.allreduce(MPI.COMM_WORLD, grad, "uniform", key="w")   # doctest: +SKIP

The protocol follows ``codec.aggregation`` and ``mode`` (docs/transports.md has the table):
summable codecs reduce their values, PowerSGD runs its two rounds, other codecs gather (p <= 2) or
run two-phase (p > 2). Before the first exchange of a key, all ranks agree on (codec config, shape,
dtype, mode, op); a mismatch is a :class:`gcodec.ConfigError` on every rank.

Error feedback and statistics live in a :class:`State` passed as ``state=`` (or pass
``state=gcodec.ErrorFeedback(codec)`` for worker residuals only). Importing this module imports
mpi4py; ``import gcodec`` does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from . import xp
from .arrays import BFLOAT16, host_array
from .codecs import Codec
from .deprecation import renamed_kwarg, renamed_names
from .errors import ConfigError
from .feedback import ErrorFeedback
from .policy import Policy
from .transports import Communicator, Serial, Task, TransportState, Work
from .transports.collectives import joined
from .transports.control import failed_exchange
from .transports.router import Router, call_protocol

__all__ = ["MPICommunicator", "Request", "Router", "State", "allreduce", "iallreduce"]

#: ``PolicyState``, the router's old name here
__getattr__ = renamed_names("gcodec.mpi", {"PolicyState": ("Router", Router)})

#: The transport state: error-feedback residuals (worker and two-phase server), PowerSGD factors,
#: step counters, agreed keys and statistics (``state.stats()``), with ``state_dict()``.
State = TransportState
#: What :func:`iallreduce` returns: ``test()`` advances without blocking, ``wait()`` returns the result.
Request = Task

_OPS = {"sum": MPI.SUM, "max": MPI.MAX}
_UNSET: Any = object()  # ef= not given (None is a value of state=)


class _MPIWork(Work):
    def __init__(self, req: MPI.Request, result: Any, keep: Any = None) -> None:
        self._req, self._result, self._keep = req, result, keep  # keep: send buffers MPI still reads

    def test(self) -> bool:
        return bool(self._req.Test())

    def wait(self) -> Any:
        self._req.Wait()
        return self._result

    def result(self) -> Any:
        return self._result


def _split(buf: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return [buf[offs[i] : offs[i + 1]] for i in range(len(counts))]


class MPICommunicator(Communicator):
    """:class:`~gcodec.transports.Communicator` on an mpi4py communicator (non-blocking collectives).

    Arrays given and returned live on the caller's device: receive buffers are allocated where the
    input lives (:mod:`gcodec.xp`), so a CUDA-aware MPI gets device pointers for device arrays
    (mpi4py takes any object with ``__cuda_array_interface__`` as a buffer) and host memory for
    NumPy arrays. The control messages stay host int64 words.
    """

    #: MPI has no bfloat16 datatype: PowerSGD's bf16 factors are refused before they travel
    sums_bfloat16 = False

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def allreduce(self, arr: Any, op: str = "sum") -> Work:
        if arr.dtype == BFLOAT16:  # no MPI datatype (float16 has one: MPICH's MPIX_C_FLOAT16)
            raise ConfigError("MPI has no bfloat16 sum: use PowerSGD's factors='fp16' (or none) with gcodec.mpi")
        return _MPIWork(self.comm.Iallreduce(MPI.IN_PLACE, arr, op=_OPS[op]), arr)

    def allgather(self, arr: np.ndarray) -> Work:
        recv = np.empty((self.size, *arr.shape), arr.dtype)
        return _MPIWork(self.comm.Iallgather(arr, recv), recv, arr)

    def allgatherv(self, buf: Any, counts: Sequence[int]) -> Work:
        counts = [int(c) for c in counts]
        recv = xp.empty(buf, sum(counts), np.uint8)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
        req = self.comm.Iallgatherv(buf, [recv, counts, displs, MPI.BYTE])
        return _MPIWork(req, _split(recv, counts), buf)

    def alltoallv(self, bufs: Sequence[Any], recv_counts: Sequence[int]) -> Work:
        scounts = [int(b.shape[0]) for b in bufs]
        send = joined(bufs)
        sdispls = np.concatenate([[0], np.cumsum(scounts)[:-1]]).astype(np.int64).tolist()
        rcounts = [int(c) for c in recv_counts]
        recv = xp.empty(send, sum(rcounts), np.uint8)
        rdispls = np.concatenate([[0], np.cumsum(rcounts)[:-1]]).astype(np.int64).tolist()
        req = self.comm.Ialltoallv([send, scounts, sdispls, MPI.BYTE], [recv, rcounts, rdispls, MPI.BYTE])
        return _MPIWork(req, _split(recv, rcounts), send)


# One adapter and one FIFO queue per communicator: collectives of overlapping iallreduce calls must
# start in the same order on every rank, which the queue makes the call order.
_adapters: dict[int, tuple[MPICommunicator, Serial]] = {}


def _array(x: Any) -> Any:
    """``x`` as the protocols take it: a NumPy array for host data (lists, scalars, torch CPU
    tensors are viewed or converted as ``gcodec.encode`` does), a Numba device array for CuPy,
    Numba or torch CUDA arrays (no copy: a CUDA-aware MPI moves device memory itself)."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__cuda_array_interface__"):
        return host_array(x)
    from . import kernels

    return kernels.of(x).view(x)


def _adapter(comm: MPI.Comm) -> tuple[MPICommunicator, Serial]:
    key = id(comm)
    got = _adapters.get(key)
    if got is None or got[0].comm is not comm:
        got = (MPICommunicator(comm), Serial())
        _adapters[key] = got
    return got


def iallreduce(
    comm: MPI.Comm,
    x: Any,
    codec: Codec | str | dict[str, Any] | Policy | None,
    op: str = "mean",
    *,
    key: str | None = None,
    mode: str = "auto",
    out: np.ndarray | None = None,
    state: TransportState | ErrorFeedback | Router | None = None,
    ef: Any = _UNSET,
) -> Request:
    """Start a compressed allreduce; returns a request whose ``wait()`` returns the result array.

    Arguments are those of :func:`allreduce`. ``x`` must not change until the request is done.
    Several requests may be in flight: they run one after another in call order (which is then
    the same on every rank), each advancing whenever any request's ``test()`` or ``wait()`` runs.
    """
    given = renamed_kwarg("gcodec.mpi.iallreduce", "ef", "state", ef, state, unset=_UNSET)
    adapter, queue = _adapter(comm)
    try:
        arr = _array(x)
        if out is None:
            out = xp.empty(arr, arr.size, arr.dtype).reshape(arr.shape)  # where x lives
        elif not (isinstance(out, np.ndarray) or hasattr(out, "__cuda_array_interface__")):
            raise ConfigError(f"out= must be a numpy or device array, not {type(out).__name__}")
        elif xp.backend(out) != xp.backend(arr):
            raise ConfigError(f"out= lives in {xp.backend(out)} memory and x in {xp.backend(arr)}")
        proto = call_protocol(adapter, ("mpi", id(comm)), arr, out, codec, op, key or "tensor", mode, given)
    except Exception as e:  # take part, so that the peers raise too instead of waiting
        return queue.submit(failed_exchange(adapter, e, f"allreduce of {key or 'tensor'!r}"))
    return queue.submit(proto)


def allreduce(
    comm: MPI.Comm,
    x: Any,
    codec: Codec | str | dict[str, Any] | Policy | None,
    op: str = "mean",
    *,
    key: str | None = None,
    mode: str = "auto",
    out: np.ndarray | None = None,
    state: TransportState | ErrorFeedback | Router | None = None,
    ef: Any = _UNSET,
) -> np.ndarray:
    """Compressed allreduce of ``x`` across ``comm``; returns an array of ``x``'s shape and dtype.

    Args:
        comm: an mpi4py intracommunicator.
        x: any array gcodec encodes (float32, float64, float16, bfloat16), in host memory or on a
            CUDA device (CuPy, Numba, torch CUDA: the protocol runs there and a CUDA-aware MPI moves
            device memory; docs/gpu.md).
        codec: a codec, its id or config. Must be the same on every rank (the handshake checks).
            A :class:`gcodec.policy.Policy` picks the codec per key and step (dense when it says
            None); None when ``state`` is a :class:`Router` (its policy or controller decides).
        op: ``"mean"`` (the usual gradient average) or ``"sum"``.
        key: names the tensor: its error-feedback residual, warm start, random streams and
            statistics are kept under this key. Give each tensor its own key.
        mode: ``"auto"``, ``"summable"``, ``"gather"``, ``"two_phase"`` or ``"lowrank"``.
        out: the array to write the result into (may be ``x``); a new one by default.
        state: None (no error feedback), a :class:`gcodec.ErrorFeedback` (worker residuals kept in
            it), a :class:`State` (worker and server residuals, steps, statistics, checkpointable),
            or a :class:`Router` (a policy or adaptive controller choosing per key and step,
            with residuals that follow a key across codec changes). The same argument as
            ``gcodec.torch.all_reduce(state=)``.
        ef: the old name of ``state`` (a DeprecationWarning).

    Raises :class:`gcodec.ConfigError` on every rank when ranks disagree on the configuration, and a
    :class:`gcodec.GcodecError` on every rank when any rank's payload fails (never a hang).
    """
    given = renamed_kwarg("gcodec.mpi.allreduce", "ef", "state", ef, state, unset=_UNSET)
    return iallreduce(comm, x, codec, op, key=key, mode=mode, out=out, state=given).wait()
