"""The few array operations the transports need, on the memory where the array lives.

A protocol (summable, gather, two-phase, PowerSGD, reduce-scatter) is written once; it allocates
its buffers, slices and joins byte buffers, scales, copies and sums through this module, which
dispatches on where the array lives (:func:`gcodec.arrays.backend_of`) to that backend's kernels
(``kernels.of(array).memory``, ``.cast``): NumPy arrays in host memory, Numba device arrays in
device memory (the simulator's too). CuPy arrays and torch CUDA tensors are taken in as Numba device
arrays without a copy (``kernels.of(x).view``) by the engines that hand them over.

What crosses between host and device here is only what the protocols must read on the host: the
small int64 words of sizes and error codes (:func:`to_host`, :func:`from_host`). Every byte that
crosses is counted (:func:`transferred`), so a transport can report its ``host_bytes``; a device
operation that has no kernel raises :class:`~gcodec.ConfigError`, never a silent host copy.

========================  =======================================================================
``empty(like, n, dt)``     an uninitialised flat array on ``like``'s memory (``zeros``: zeroed)
``as_bytes(buf)``          a flat uint8 view of a payload or array, no copy
``contiguous(a)``          ``a`` C-contiguous (a host copy only for strided host views)
``is_contiguous(a)``       whether ``a`` is C-contiguous (so that :func:`flat` is a view of it)
``concat(parts, like)``    one new flat array holding ``parts`` one after the other
``copy(dst, src)``         ``dst[:] = src`` (element type converted as NumPy does; float16 rounds
                           to nearest even through the cast kernel)
``add(dst, src)``          ``dst += src``
``subtract(dst, src)``     ``dst -= src``
``scale(dst, src, s)``     ``dst = src * s`` in dst's type
``fill(dst, v)``           ``dst[:] = v``
``to_host(a)``             a host copy of a small device array (header words, codes)
``from_host(h, like)``     ``h`` on ``like``'s memory (small host words into a device buffer)
``transferred(like)``      bytes this thread moved between host and device, so far
========================  =======================================================================
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import alloc, kernels
from .arrays import BFLOAT16, backend_of
from .errors import ConfigError

__all__ = [
    "add",
    "as_bytes",
    "backend",
    "concat",
    "contiguous",
    "copy",
    "empty",
    "fill",
    "flat",
    "from_host",
    "is_contiguous",
    "on_device",
    "scale",
    "subtract",
    "to_host",
    "transferred",
    "zeros",
]


def backend(a: Any) -> str:
    """``"cpu"`` or ``"cuda"``: where ``a`` lives."""
    if isinstance(a, np.ndarray):  # the hot path of every host exchange
        return "cpu"
    return backend_of(a)


def on_device(a: Any) -> bool:
    return backend(a) != "cpu"


def _native(a: Any) -> Any:
    """``a`` as its backend's kernels take it (NumPy array, Numba device array), no copy."""
    if isinstance(a, np.ndarray):
        return a
    dev = getattr(a, "device", None)
    if getattr(type(a), "__gcodec_device_payload__", False):
        return dev
    if backend_of(a) == "cpu":
        return as_bytes(a) if not hasattr(a, "dtype") else np.asarray(a)
    return kernels.of(a).view(a)


def flat(a: Any) -> Any:
    """A flat view of C-contiguous ``a`` (host or device)."""
    return _native(a).reshape(-1)


def _storage(dtype: Any) -> np.dtype:
    """The element type device memory holds for ``dtype``: bfloat16 as its 16 bits (Numba has no
    bfloat16), every other type as it is."""
    dt = np.dtype(dtype)
    return np.dtype(np.uint16) if dt == BFLOAT16 else dt


def empty(like: Any, n: int, dtype: Any) -> Any:
    """An uninitialised flat array of ``n`` elements of ``dtype`` on the memory of ``like``
    (on a device, bfloat16 is held as uint16 bits: see :func:`gcodec.aggregate.add_values`)."""
    if isinstance(like, np.ndarray) or not on_device(like):
        return alloc.empty("a transport buffer", int(n), dtype)  # out of memory: LimitExceededError
    return kernels.of(like).memory.empty(int(n), _storage(dtype), "a transport buffer")


def zeros(like: Any, n: int, dtype: Any) -> Any:
    """:func:`empty`, zeroed (+0 in every element)."""
    if isinstance(like, np.ndarray) or not on_device(like):
        return alloc.empty("a transport buffer", int(n), dtype, make=np.zeros)
    a = empty(like, n, dtype)
    if int(n):
        kernels.of(a).memory.zero(a.view(np.uint8), 0, int(n) * a.dtype.itemsize)
    return a


def is_contiguous(a: Any) -> bool:
    """Whether ``a`` (host or device) is C-contiguous: :func:`flat` of it is then a view."""
    if isinstance(a, np.ndarray):
        return bool(a.flags.c_contiguous)
    return bool(_native(a).is_c_contiguous())


def contiguous(a: Any) -> Any:
    """``a`` as a C-contiguous array on its memory: as it is when it already is one (a device
    array that is not is a ConfigError: no hidden copy kernel for strided device views)."""
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a)
    if not a.is_c_contiguous():
        raise ConfigError(f"a strided device array of shape {a.shape} needs a contiguous copy first")
    return a


def as_bytes(buf: Any) -> Any:
    """A flat uint8 view of a payload (memoryview, bytes, NumPy array, DevicePayload, device array)
    without copying."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    if getattr(type(buf), "__gcodec_device_payload__", False):
        return buf.device
    if backend_of(buf) != "cpu":
        return kernels.of(buf).view(buf).reshape(-1).view(np.uint8)
    return np.frombuffer(buf, np.uint8)


def concat(parts: Sequence[Any], like: Any, dtype: Any = None) -> Any:
    """One new flat array holding ``parts`` (flat arrays) in order, on the memory of ``like``, of
    ``dtype`` (default: the first part's; elements converted as :func:`copy` does). Host parts
    joining a device buffer are small words (part sizes, codes): copied once each, and counted."""
    if isinstance(like, np.ndarray) or not on_device(like):
        out = np.concatenate(parts) if parts else np.empty(0, np.uint8 if dtype is None else dtype)
        return out if dtype is None else out.astype(dtype, copy=False)
    dt = np.dtype(dtype) if dtype is not None else parts[0].dtype if parts else np.dtype(np.uint8)
    out = empty(like, sum(int(p.shape[0]) for p in parts), dt)
    K = kernels.of(out)
    pos = 0
    for p in parts:
        n = int(p.shape[0])
        if n:
            K.memory.copy(out[pos : pos + n], p)  # a host part is uploaded (and counted) by the kernel's intake
        pos += n
    return out


def copy(dst: Any, src: Any) -> None:
    """``dst[:] = src`` for flat arrays of one length, converting the element type: a float32
    source into float16 rounds to nearest even (the fp16 codec's cast kernel, as NumPy's
    ``astype``), others as NumPy converts."""
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        dst[...] = src
        return
    K = kernels.of(dst)
    if dst.dtype == np.float16 and src.dtype != np.float16:
        if src.dtype != np.float32:
            raise ConfigError(f"copy: no device conversion of {src.dtype} into float16 (convert to float32 first)")
        K.cast.encode_f16(src, dst.view(np.uint16))
        return
    K.memory.copy(dst, src)


def add(dst: Any, src: Any) -> None:
    """``dst += src`` (flat, one length; the addition in dst's type; on the host as NumPy promotes,
    float16 or bfloat16 + float32 in float32, rounded once into dst). A NaN sum is a positive NaN
    on every backend (specs/format.md §10's NaN rule)."""
    kernels.of(dst).memory.copy(dst, src, True)


def subtract(dst: Any, src: Any) -> None:
    """``dst -= src`` (flat, one length; on a device as ``dst + (-src)``, which IEEE 754 defines
    to round the same; ``src`` is negated and restored in place)."""
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        np.subtract(dst, src, out=dst)
        return
    M = kernels.of(dst).memory
    M.scale(src, src, -1.0)
    M.copy(dst, src, True)
    M.scale(src, src, -1.0)


def scale(dst: Any, src: Any, s: float) -> None:
    """``dst = src * s``, one multiplication in dst's type (``dst`` may be ``src``)."""
    kernels.of(dst).memory.scale(dst, src, s)


def fill(dst: Any, value: Any, dtype: Any = None) -> None:
    """``dst[:] = value``; ``dtype`` names the element type when ``dst`` holds its bits (a device's
    bfloat16 or float16 values held as uint16): the value's bit pattern is written."""
    dt = np.dtype(dtype) if dtype is not None else dst.dtype
    if isinstance(dst, np.ndarray):
        dst.view(dt)[...] = value
        return
    if dt != dst.dtype:
        value = np.array(value, dt).view(dst.dtype)[()]
    kernels.of(dst).memory.fill(dst, value)


def to_host(a: Any) -> np.ndarray:
    """A host copy of a *small* device array (sizes, codes, header bytes); host arrays as they are."""
    if isinstance(a, np.ndarray):
        return a
    return np.asarray(kernels.of(a).launch.host(kernels.of(a).view(a)))


def from_host(h: np.ndarray, like: Any) -> Any:
    """Small host words ``h`` on the memory of ``like`` (as they are for host memory)."""
    if isinstance(like, np.ndarray) or not on_device(like):
        return h
    out = empty(like, h.size, h.dtype)
    kernels.of(out).memory.copy(out, np.ascontiguousarray(h).reshape(-1))
    return out


def transferred() -> int:
    """Bytes this thread has copied between host and device memory through gcodec so far (0 while
    no device array was ever handled: the CUDA backend is then not even imported)."""
    launch = sys.modules.get("gcodec.kernels.cuda.launch")
    return 0 if launch is None else int(launch.transferred())
