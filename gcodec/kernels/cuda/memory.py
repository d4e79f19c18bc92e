"""Payload memory on the device: one uint8 device buffer laid out exactly as the wire bytes.

The writer (``gcodec.format.container.write_payload``) builds the preamble and the msgpack header on
the host and calls the functions here through ``kernels.of(buf).memory``: :func:`alloc` (the device
buffer), :func:`put` (the header bytes, one host-to-device copy), :func:`zero` (padding),
:func:`view` (sections, zero-copy), :func:`crc32c_store` (the payload CRC32C, computed on the
device and written into the buffer's last four bytes without visiting the host) and
:func:`result` (a :class:`DevicePayload`).

The CRC32C is parallel: each thread computes the standard CRC32C of one chunk of :data:`CRC_CHUNK`
bytes (table-driven, reflected polynomial 0x82F63B78), then one thread combines them left to right
with zlib's ``crc32_combine`` arithmetic (multiplication by x^(8 len) modulo the polynomial), so the
result equals ``gcodec.checksum.crc32c`` of the same bytes.

The reader (``gcodec.format.container.read_payload``) checks a device payload where it lies: only
the preamble and the header (:func:`host_bytes`), the stored CRC and small words (an index, a count)
come to the host. :func:`crc32c` checks rule F14 on the device, :func:`first_nonzero` the padding
(F15), and :func:`first_bad` a codec's value rule over a section (the names and verdicts of the host
backend's ``VALUE_RULES``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from ...errors import ConfigError
from .launch import (
    SIM,
    _count,
    adopt,
    device,
    grid,
    host,
    is_device,
    mul32,
    one,
    pos_nan,
    stream,
    transferred,
    upload,
)
from .minifloat import e4m3_value

__all__ = [
    "CRC_CHUNK",
    "VALUE_RULES",
    "DevicePayload",
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

CRC_CHUNK = 64 if SIM else 16384
_POLY = 0x82F63B78


def _table() -> np.ndarray:
    t = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t[i] = c
    return t


def _multmodp(a: int, b: int) -> int:
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _x2nmodp(n: int, k: int) -> int:
    """x^(n * 2^k) modulo the polynomial (reflected), as zlib's x2nmodp."""
    p = 1 << 31
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


_X2N = [1 << 30]
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))
_TABLE_HOST = _table()
_TABLE_DEV: list[Any] = []


def _dev_table() -> Any:
    if not _TABLE_DEV:
        _TABLE_DEV.append(upload(_TABLE_HOST))  # once per process: 1 KiB, counted like every copy
    return _TABLE_DEV[0]


@cuda.jit(device=True)
def _mult(a, b):  # pragma: no cover - device
    """a * b modulo the CRC polynomial (reflected bit order), zlib's multmodp."""
    m = np.uint32(0x80000000)
    p = np.uint32(0)
    a = np.uint32(a)
    b = np.uint32(b)
    for _ in range(32):
        if a & m:
            p = np.uint32(p ^ b)
        m = np.uint32(m >> np.uint32(1))
        b = (
            np.uint32(np.uint32(b >> np.uint32(1)) ^ np.uint32(0x82F63B78))
            if b & np.uint32(1)
            else np.uint32(b >> np.uint32(1))
        )
    return p


@cuda.jit
def _crc_chunks(data, table, crcs, chunk):  # pragma: no cover - device
    n = data.shape[0]
    nch = crcs.shape[0]
    for c in range(cuda.grid(1), nch, cuda.gridsize(1)):
        crc = np.uint32(0xFFFFFFFF)
        hi = min(n, (c + 1) * chunk)
        for i in range(c * chunk, hi):
            crc = np.uint32(
                table[np.uint32(crc ^ np.uint32(data[i])) & np.uint32(0xFF)] ^ np.uint32(crc >> np.uint32(8))
            )
        crcs[c] = np.uint32(crc ^ np.uint32(0xFFFFFFFF))


@cuda.jit
def _crc_combine(crcs, x_full, x_last, dst):  # pragma: no cover - device
    """crc = combine(crc, crcs[c]) left to right; chunks are full except maybe the last one; the
    result is stored little-endian into dst[0:4]."""
    if cuda.grid(1) == 0:
        nch = crcs.shape[0]
        crc = np.uint32(crcs[0])
        for c in range(1, nch):
            x = x_last if c == nch - 1 else x_full
            crc = np.uint32(_mult(x, crc) ^ np.uint32(crcs[c]))
        for t in range(4):
            dst[t] = np.uint8(np.uint32(crc >> np.uint32(8 * t)) & np.uint32(0xFF))


def _crc_into(data: Any, dst: Any) -> None:
    n = int(data.shape[0])
    if n == 0:
        _count(4)
        dst.copy_to_device(np.zeros(4, np.uint8), stream=stream())  # CRC32C of nothing is 0
        return
    nch = (n + CRC_CHUNK - 1) // CRC_CHUNK
    crcs = cuda.device_array(nch, np.uint32)
    _crc_chunks[grid(nch)](data, _dev_table(), crcs, CRC_CHUNK)
    last = n - (nch - 1) * CRC_CHUNK
    x_full = np.uint32(_x2nmodp(CRC_CHUNK, 3))
    x_last = np.uint32(_x2nmodp(last, 3))
    _crc_combine[one()](crcs, x_full, x_last, dst)


# --------------------------------------------------------------------------------------------
# the writer's operations


def alloc(nbytes: int) -> Any:
    """A fresh device buffer of ``nbytes`` (uninitialised; the writer writes every byte)."""
    return cuda.device_array(int(nbytes), np.uint8)


def put(buf: Any, lo: int, data: bytes) -> None:
    """buf[lo : lo + len(data)] = data (one host-to-device copy)."""
    if data:
        _count(len(data))
        buf[lo : lo + len(data)].copy_to_device(np.frombuffer(data, np.uint8), stream=stream())


@cuda.jit
def _zero(a):  # pragma: no cover - device
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        a[i] = np.uint8(0)


def zero(buf: Any, lo: int, hi: int) -> None:
    if hi > lo:
        _zero[grid(hi - lo)](buf[lo:hi])


def empty(n: int, dtype: Any, what: str = "a codec's temporary") -> Any:
    """An uninitialised device array of ``n`` elements (codecs' temporaries: indices, values).
    ``what`` names it, as in the host backend's ``empty``."""
    return cuda.device_array(max(int(n), 1), np.dtype(dtype))[: int(n)]


@cuda.jit
def _copy(dst, src, accumulate):  # pragma: no cover - device
    for i in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        if accumulate:  # a NaN sum made positive (format.md §10)
            dst[i] = pos_nan(dst[i] + src[i])
        else:
            dst[i] = src[i]


def copy(dst: Any, src: Any, accumulate: bool = False) -> None:
    """dst[:] = src (or dst += src, a NaN sum a positive NaN: specs/format.md §10), converting the
    element type as NumPy's assignment does (flat arrays of one length; ``src`` may be host memory:
    copied once)."""
    if int(dst.shape[0]):
        _copy[grid(dst.shape[0])](dst, device(src), bool(accumulate))


@cuda.jit
def _scale(dst, src, s):  # pragma: no cover - device
    for i in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        dst[i] = src[i] * s


def scale(dst: Any, src: Any, s: float) -> None:
    """dst[:] = src * s, one multiplication in dst's type (float32 or float64; flat, one length;
    ``dst`` may be ``src``)."""
    if int(dst.shape[0]):
        _scale[grid(dst.shape[0])](dst, src, dst.dtype.type(s))


@cuda.jit
def _fill(dst, v):  # pragma: no cover - device
    for i in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        dst[i] = v


def fill(dst: Any, value: Any) -> None:
    """dst[:] = value (flat; ``value`` a scalar of dst's type, or a bit pattern of it)."""
    if int(dst.shape[0]):
        _fill[grid(dst.shape[0])](dst, dst.dtype.type(value))


def view(buf: Any, lo: int, hi: int, dtype: Any) -> Any:
    return buf[lo:hi].view(np.dtype(dtype))


def crc32c(buf: Any, lo: int, hi: int) -> int:
    """The CRC32C of buf[lo:hi] (computed on the device; four bytes come back)."""
    dst = cuda.device_array(4, np.uint8)
    _crc_into(buf[lo:hi], dst)
    return int(host(dst).view("<u4")[0])


def crc32c_store(buf: Any, lo: int, hi: int, at: int) -> None:
    """buf[at : at + 4] = little-endian CRC32C of buf[lo:hi], all on the device."""
    _crc_into(buf[lo:hi], buf[at : at + 4])


def to_host(buf: Any) -> np.ndarray:
    """Host bytes of a device payload (a :class:`DevicePayload`, a Numba device array, or any CUDA
    array adopted without a copy), as a flat uint8 array."""
    if isinstance(buf, DevicePayload):
        return buf.to_host()
    if not is_device(buf):
        buf = adopt(buf)
    return host(buf).reshape(-1).view(np.uint8)


class DevicePayload:
    """A payload in device memory: the device buffer for NCCL / CUDA-aware MPI, host bytes on request.

    ``device`` is the Numba device array (uint8, the whole payload); ``__cuda_array_interface__``
    (on a GPU) lets CuPy and torch view it without a copy; ``bytes(p)``, :meth:`tobytes` and
    ``numpy.asarray(p)`` copy it to the host, byte-identical to what the CPU backend writes.
    ``gcodec.decode`` and ``gcodec.validate`` accept it as it is.
    """

    __gcodec_device_payload__ = True  # gcodec.arrays.backend_of says "cuda" without importing this module

    def __init__(self, buf: Any) -> None:
        self.device = buf

    @property
    def nbytes(self) -> int:
        return int(self.device.shape[0])

    def __len__(self) -> int:
        return self.nbytes

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:  # pragma: no cover - needs a GPU
        return self.device.__cuda_array_interface__

    def tobytes(self) -> bytes:
        return bytes(self.to_host())

    def to_host(self) -> np.ndarray:
        """The payload's bytes as a host uint8 array (one device-to-host copy)."""
        return host(self.device)

    def __bytes__(self) -> bytes:
        return self.tobytes()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.to_host()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"DevicePayload({self.nbytes} bytes on the device)"


def result(buf: Any) -> DevicePayload:
    return DevicePayload(buf)


# --------------------------------------------------------------------------------------------
# the reader's operations


def payload_bytes(buf: Any) -> Any:
    """The flat uint8 device array of a device payload (a :class:`DevicePayload`, a Numba device
    array, or any CUDA array adopted without a copy)."""
    d = buf.device if isinstance(buf, DevicePayload) else buf if is_device(buf) else adopt(buf)
    if d.dtype != np.uint8 or d.ndim != 1:
        if not d.is_c_contiguous():
            raise ConfigError("a device payload must be contiguous")
        d = d.reshape(d.size).view(np.uint8)
    return d


def host_bytes(buf: Any, lo: int, hi: int) -> bytes:
    """buf[lo:hi] copied to the host (the preamble, the header, a stored CRC: small words)."""
    if hi <= lo:
        return b""
    return host(buf[lo:hi]).tobytes()


_NONE = np.iinfo(np.int64).max


@cuda.jit
def _first_nonzero(buf, gaps, res):  # pragma: no cover - device
    for g in range(cuda.grid(1), gaps.shape[0], cuda.gridsize(1)):
        for i in range(gaps[g, 0], gaps[g, 1]):
            if buf[i] != 0:
                cuda.atomic.min(res, 0, i)
                break


def first_nonzero(buf: Any, gaps: list[tuple[int, int]]) -> int:
    """The first index of a non-zero byte of device ``buf`` in the ranges ``gaps``, or -1: one
    thread per range (padding ranges are shorter than the alignment), one word back."""
    gaps = [(lo, hi) for lo, hi in gaps if hi > lo]
    if not gaps:
        return -1
    res = upload(np.array([_NONE], np.int64))
    _first_nonzero[grid(len(gaps))](buf, upload(np.array(gaps, np.int64)), res)
    i = int(host(res)[0])
    return -1 if i == _NONE else i


#: Rule name -> the number :func:`_breaks` switches on (the host backend's ``VALUE_RULES``).
VALUE_RULES = {
    "negative_or_nonfinite_f32": 0,
    "negative_or_nonfinite_f16": 1,
    "product_overflows_f32": 2,
    "above": 3,
    "e4m3_signed_or_nan": 4,
    "e4m3_times_overflows": 5,
}
_INF = np.uint32(0x7F800000)


@cuda.jit(device=True)
def _inf32(p):  # pragma: no cover - device
    return np.uint32(np.float32(p).view(np.uint32) & np.uint32(0x7FFFFFFF)) == _INF


@cuda.jit(device=True)
def _breaks(v, rule, arg):  # pragma: no cover - device
    if rule == 0:  # float32 bits: the sign bit, or the all-ones exponent (NaN, infinity)
        b = np.uint32(v)
        return (b >> np.uint32(31)) != 0 or (b & _INF) == _INF
    if rule == 1:
        b = np.uint32(v)
        return (b & np.uint32(0x8000)) != 0 or (b & np.uint32(0x7C00)) == np.uint32(0x7C00)
    if rule == 2:  # float32 bits v: float32(value * arg) infinite
        return _inf32(mul32(np.uint32(v).view(np.float32), np.float32(arg)))
    if rule == 3:
        return np.int64(v) > np.int64(arg)
    if rule == 4:
        c = np.uint32(v)
        return (c & np.uint32(0x80)) != 0 or c == np.uint32(0x7F)
    d = mul32(e4m3_value(np.uint32(v) & np.uint32(0x7F)), np.float32(arg))
    return _inf32(mul32(d, np.float32(6.0)))


@cuda.jit
def _first_bad(values, rule, arg, res):  # pragma: no cover - device
    for i in range(cuda.grid(1), values.shape[0], cuda.gridsize(1)):
        if _breaks(values[i], rule, arg):
            cuda.atomic.min(res, 0, i)


def first_bad(values: Any, rule: str, arg: float = 0.0) -> int:
    """The index of the first element of device ``values`` that breaks the named rule, or -1 (one
    word back). float32 sections are read as their bits."""
    n = int(values.shape[0])
    if n == 0:
        return -1
    if values.dtype == np.float32:
        values = values.view(np.uint32)
    res = upload(np.array([_NONE], np.int64))
    _first_bad[grid(n)](values, VALUE_RULES[rule], np.float64(arg), res)
    i = int(host(res)[0])
    return -1 if i == _NONE else i
