"""Payload memory in host RAM: the writer's operations on a NumPy uint8 buffer.

``gcodec.format.container.write_payload`` lays a payload out through ``kernels.of(buf).memory``, so
that one writer serves host buffers (this module) and device buffers (``gcodec.kernels.cuda.memory``).
The reader (``read_payload``) and the codecs' value rules use the same module: :func:`host_bytes`
(the preamble and the header), :func:`crc32c`, :func:`first_nonzero` (padding) and
:func:`first_bad` (a named value rule over a section, :data:`VALUE_RULES`).
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import numpy as np
from numba import njit

from ... import alloc as _alloc
from ...arrays import torch_view
from ...checksum import crc32c as _crc32c
from ...errors import FormatError
from ...excerpt import short
from ...layout.minifloat import ELEMENTS, values_table
from .cast import CHUNK, pos_nan
from .threads import run_chunks

__all__ = [
    "VALUE_RULES",
    "alloc",
    "copy",
    "crc32c",
    "crc32c_store",
    "empty",
    "fill",
    "first_bad",
    "first_nonzero",
    "host_bytes",
    "payload_bytes",
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


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@njit(cache=True, nogil=True)
def _add_range(dst, src, lo, hi):  # pragma: no cover - jitted
    base = np.uint64(lo)
    for j in range(hi - lo):
        i = base + np.uint64(j)  # unsigned: no wraparound select, so the loop vectorises
        dst[i] = pos_nan(dst[i] + src[i])
    return 0


def _positive_nans(a: np.ndarray) -> None:
    """Clear the sign bit of every NaN in the float array ``a`` (float16 and bfloat16 too), in
    place: specs/format.md §10's NaN rule applied after a NumPy addition. One ``isnan`` pass; only
    an array that holds a NaN is written."""
    if a.dtype.kind in "biu":
        return
    nan = np.isnan(a)
    if nan.any():
        np.abs(a, out=a, where=nan)


def copy(dst: np.ndarray, src: np.ndarray, accumulate: bool = False) -> None:
    """dst[:] = src, or dst += src (NumPy's conversion of the element type: float16 or bfloat16 +
    float32 added in float32 and rounded once into ``dst``), where a NaN sum is a positive NaN
    whatever the operands' signs (specs/format.md §10's NaN rule)."""
    if accumulate:
        if dst.shape == src.shape and dst.ndim == 1 and dst.dtype in _FLOATS and src.dtype in _FLOATS:
            run_chunks(_add_range, dst.shape[0], CHUNK, dst, src)  # the sum in the wider type, as NumPy
        else:
            np.add(dst, src, out=dst, casting="unsafe")
            _positive_nans(dst)  # the sign survives the rounding into dst, so it is cleared there
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


# --------------------------------------------------------------------------------------------
# the reader's operations


def payload_bytes(buf: Any) -> np.ndarray:
    """A payload given as bytes, a bytes-like object, a NumPy array or a CPU uint8 tensor, as a
    flat uint8 array of the same memory (FormatError for what holds no plain bytes)."""
    if type(buf).__module__.startswith("torch"):  # a CPU uint8 tensor (what torch collectives deliver)
        buf = torch_view(buf)
    if isinstance(buf, np.ndarray):
        if buf.dtype.hasobject or buf.dtype.fields is not None:
            raise FormatError(
                f"payload must be an array of plain bytes, not of {short(str(buf.dtype))} elements "
                "(object and structured arrays hold no payload bytes)"
            )
        if not buf.flags.c_contiguous:
            raise FormatError("payload buffer must be contiguous")
        if buf.dtype != np.uint8 or buf.ndim != 1:
            buf = buf.reshape(-1).view(np.uint8)
        return buf
    try:
        mv = memoryview(buf)
    except TypeError:
        raise FormatError(f"payload must be a bytes-like object, not {type(buf).__name__}") from None
    if not mv.c_contiguous:
        raise FormatError("payload buffer must be contiguous")
    return np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)


def host_bytes(buf: np.ndarray, lo: int, hi: int) -> bytes:
    """buf[lo:hi] as bytes (the preamble, the header, a stored CRC: small words)."""
    return buf[lo:hi].tobytes()


def first_nonzero(buf: np.ndarray, gaps: list[tuple[int, int]]) -> int:
    """The first index of a non-zero byte of ``buf`` in the ranges ``gaps`` (in order), or -1."""
    for lo, hi in gaps:
        if hi > lo and buf[lo:hi].any():
            return lo + int(np.flatnonzero(buf[lo:hi])[0])
    return -1


def _f32(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float32)


def _product_overflows(v: np.ndarray, top: float) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isinf(_f32(v) * np.float32(top))


@functools.cache
def _e4m3_table() -> np.ndarray:
    return values_table(ELEMENTS["e4m3"])


#: The value rules of the codecs' pages, by name: ``rule(chunk, arg)`` is True where an element
#: breaks it. The CUDA backend has the same names, element for element the same verdicts.
VALUE_RULES: dict[str, Any] = {
    # float32 values that are NaN, infinite or carry the sign bit (-0 included)
    "negative_or_nonfinite_f32": lambda v, _: ~np.isfinite(v) | (v.view(np.uint32) >> 31).astype(bool),
    # binary16 values (as uint16 bits) that carry the sign bit or the all-ones exponent
    "negative_or_nonfinite_f16": lambda v, _: ((v & 0x8000) != 0) | ((v & 0x7C00) == 0x7C00),
    # float32 values v with float32(v * arg) infinite
    "product_overflows_f32": _product_overflows,
    # integer codes above arg
    "above": lambda v, top: v > int(top),
    # E4M3 codes with the sign bit or the NaN pattern (block scales)
    "e4m3_signed_or_nan": lambda v, _: ((v & 0x80) != 0) | (v == 0x7F),
    # E4M3 codes c with float32(float32(value(c & 0x7F) * arg) * 6) infinite (NVFP4's NV2)
    "e4m3_times_overflows": lambda v, s: _product_overflows(_e4m3_table()[v & 0x7F] * np.float32(s), 6.0),
}

#: Elements per chunk of :func:`first_bad`: 64 Ki, so a check's temporaries stay within 64 Ki x 8
#: bytes whatever the section's length (which comes from a header).
CHECK_CHUNK = 1 << 16


def first_bad(values: np.ndarray, rule: str, arg: float = 0.0) -> int:
    """The index of the first element of 1-D ``values`` that breaks :data:`VALUE_RULES` ``[rule]``,
    or -1. Checked a chunk at a time, so it stops at the first bad chunk and allocates little."""
    bad = VALUE_RULES[rule]
    for lo in range(0, values.shape[0], CHECK_CHUNK):
        mask = bad(values[lo : lo + CHECK_CHUNK], arg)
        if mask.any():
            return lo + int(np.flatnonzero(mask)[0])
    return -1
