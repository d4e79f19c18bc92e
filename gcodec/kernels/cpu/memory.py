"""Payload memory in host RAM: the writer's operations on a NumPy uint8 buffer.

``gcodec.format.container.write_payload`` lays a payload out through ``kernels.of(buf).memory``, so
that one writer serves host buffers (this module) and device buffers (``gcodec.kernels.cuda.memory``).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ... import alloc as _alloc
from ...checksum import crc32c as _crc32c

__all__ = [
    "alloc",
    "copy",
    "crc32c",
    "crc32c_store",
    "empty",
    "fill",
    "put",
    "result",
    "scale",
    "to_host",
    "transferred",
    "view",
    "zero",
]


def alloc(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def put(buf: np.ndarray, lo: int, data: bytes) -> None:
    buf[lo : lo + len(data)] = np.frombuffer(data, np.uint8)


def zero(buf: np.ndarray, lo: int, hi: int) -> None:
    buf[lo:hi] = 0


def empty(n: int, dtype: Any, what: str = "a codec's temporary") -> np.ndarray:
    """An uninitialised array of ``n`` elements (codecs' temporaries: indices, values), from the one
    allocator (gcodec/alloc.py: no memory is a LimitExceededError naming ``what``)."""
    return _alloc.empty(what, n, dtype)


def copy(dst: np.ndarray, src: np.ndarray, accumulate: bool = False) -> None:
    """dst[:] = src, or dst += src (NumPy's conversion of the element type)."""
    if accumulate:
        dst += src
    else:
        dst[...] = src


def scale(dst: np.ndarray, src: np.ndarray, s: float) -> None:
    """dst[:] = src * s, one multiplication in dst's type (``dst`` may be ``src``)."""
    np.multiply(src, dst.dtype.type(s), out=dst)


def fill(dst: np.ndarray, value: Any) -> None:
    """dst[:] = value."""
    dst[...] = value


def transferred() -> int:
    """Bytes copied between host and device memory: none, in host memory."""
    return 0


def view(buf: np.ndarray, lo: int, hi: int, dtype: np.dtype) -> np.ndarray:
    return buf[lo:hi].view(dtype)


def crc32c(buf: np.ndarray, lo: int, hi: int) -> int:
    return _crc32c(buf[lo:hi])


def crc32c_store(buf: np.ndarray, lo: int, hi: int, at: int) -> None:
    buf[at : at + 4] = np.frombuffer(struct.pack("<I", _crc32c(buf[lo:hi])), np.uint8)


def to_host(buf: np.ndarray) -> np.ndarray:
    return buf


def result(buf: np.ndarray) -> memoryview:
    return buf.data
