"""Byte buffers for the collectives, and the error codes by which ranks tell each other they failed.

The codes travel in the control messages of :mod:`gcodec.transports.control`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import errors, xp

__all__ = ["EMPTY", "as_bytes", "empty_like", "error_code", "joined", "raise_agreed"]

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
    errors.ProtocolOrderError,
)


def as_bytes(buf: Any) -> Any:
    """A uint8 view of a payload (memoryview, bytes, ndarray, device payload or array) without
    copying, in the payload's own memory."""
    return xp.as_bytes(buf)


def empty_like(buf: Any) -> Any:
    """A zero-length buffer on ``buf``'s memory: the failure marker a rank sends in place of a
    payload on that memory (a communicator of device arrays takes device arrays only)."""
    return EMPTY if isinstance(buf, np.ndarray) or not xp.on_device(buf) else xp.empty(buf, 0, np.uint8)


def joined(bufs: Sequence[np.ndarray]) -> np.ndarray:
    """The concatenation of 1-D uint8 buffers, without a copy when each starts where the previous
    one ends (the chunks of one payload's values, as the summable mode sends them).

    The caller keeps ``bufs`` alive while the result is in use (the protocols hold them until their
    collective completes).
    """
    if not bufs:
        return EMPTY
    dev = next((b for b in bufs if not isinstance(b, np.ndarray)), None)
    if dev is not None:  # device buffers: one new buffer on their memory
        return xp.concat(bufs, dev)
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
