"""Variable-size collectives built from the communicator's primitives, and error agreement.

Sizes travel first (one small all-gather), then the bytes. Every helper is a protocol (a
generator, see :mod:`gcodec.transports.comm`) so that it composes with ``yield from``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import errors
from .comm import Communicator, Protocol

__all__ = ["EMPTY", "agree", "allgather_bytes", "alltoall_bytes", "as_bytes", "joined"]

#: A zero-length buffer: a rank that failed locally sends it in place of a payload (a failure marker).
EMPTY = np.empty(0, np.uint8)

# Error classes a rank can report to its peers, by code (0 = no error). A peer re-raises the same
# class, so every rank ends with the error of the rank that failed first (lowest rank wins).
_CLASSES: tuple[type[errors.GcodecError], ...] = (
    errors.GcodecError,
    errors.ConfigError,
    errors.FormatError,
    errors.HeaderError,
    errors.LayoutError,
    errors.SizeMismatchError,
    errors.ChecksumError,
    errors.PayloadValueError,
    errors.LimitExceededError,
    errors.UnknownCodecError,
    errors.UnsupportedVersionError,
    errors.UnsupportedFeatureError,
)


def as_bytes(buf: Any) -> np.ndarray:
    """A uint8 view of a payload (memoryview, bytes, ndarray) without copying."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, np.uint8)


def joined(bufs: Sequence[np.ndarray]) -> np.ndarray:
    """The concatenation of 1-D uint8 buffers, without a copy when each starts where the previous
    one ends (the chunks of one payload's values, as the summable mode sends them).

    The caller keeps ``bufs`` alive while the result is in use (the protocols hold them until their
    collective completes).
    """
    if not bufs:
        return EMPTY
    start = addr = bufs[0].ctypes.data
    for b in bufs:
        if b.ctypes.data != addr or b.ndim != 1 or b.strides[0] != 1:
            return np.concatenate(bufs)
        addr += b.shape[0]
    return np.lib.stride_tricks.as_strided(bufs[0], shape=(addr - start,), strides=(1,))


def error_code(exc: BaseException | None) -> int:
    """The code of ``exc`` in the agreement table: 0 for none, 1 + index of its most specific class."""
    if exc is None:
        return 0
    for i in range(len(_CLASSES) - 1, -1, -1):
        if type(exc) is _CLASSES[i]:
            return i + 1
    return 1  # any other exception: peers see a GcodecError


def raise_agreed(codes: np.ndarray, local: BaseException | None, what: str) -> None:
    """Raise on every rank if any rank failed: the local error where there is one, else the class of
    the lowest failing rank's error, naming that rank."""
    if local is not None:
        raise local
    bad = np.flatnonzero(codes)
    if bad.size:
        r = int(bad[0])
        cls = _CLASSES[int(codes[r]) - 1]
        raise cls(f"{what}: rank {r} failed ({cls.__name__}); see that rank's error for details")


def agree(comm: Communicator, local: BaseException | None, what: str) -> Protocol:
    """Error agreement: one tiny allreduce after which every rank raises if any rank failed."""
    codes = np.zeros(comm.size, np.int64)
    codes[comm.rank] = error_code(local)
    w = comm.allreduce(codes, "max")
    yield w
    raise_agreed(codes, local, what)


def allgather_bytes(
    comm: Communicator, buf: np.ndarray, local: BaseException | None = None, what: str = ""
) -> Protocol:
    """Every rank's byte buffer, rank order.

    The sizes travel first, together with each rank's error code: when any rank failed locally
    (``local`` is its error; it sends no bytes), every rank raises right after the sizes, before
    any data moves.
    """
    head = np.array([buf.shape[0], error_code(local)], np.int64)
    w = comm.allgather(head)
    yield w
    table = w.result().reshape(comm.size, 2)
    raise_agreed(table[:, 1], local, what)
    w = comm.allgatherv(buf, [int(c) for c in table[:, 0]])
    yield w
    return w.result()


def alltoall_bytes(
    comm: Communicator, bufs: Sequence[np.ndarray], local: BaseException | None = None, what: str = ""
) -> Protocol:
    """Send ``bufs[r]`` to rank r; return what each rank sent here (sizes and error codes first)."""
    p = comm.size
    head = np.array([*(b.shape[0] for b in bufs), error_code(local)], np.int64)
    w = comm.allgather(head)
    yield w
    table = w.result().reshape(p, p + 1)  # table[src, dst], last column: src's error code
    raise_agreed(table[:, p], local, what)
    w = comm.alltoallv(bufs, [int(c) for c in table[:, comm.rank]])
    yield w
    return w.result()
