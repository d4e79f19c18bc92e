"""float32 <-> binary16 / bfloat16 on the device (specs/codecs/fp16.md, bf16.md).

The scalar conversions are the CPU backend's formulations (``gcodec.kernels.cpu.cast``), written as
CUDA device functions: integer steps plus one float addition that rounds to nearest even at the
binary16 ulp (no multiply, so nothing for the compiler to contract; subnormals are kept: Numba
compiles without flush-to-zero unless ``fastmath``). One thread per element, grid-stride.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .launch import device, grid

__all__ = [
    "decode_bf16",
    "decode_f16",
    "encode_bf16",
    "encode_f16",
    "f16_bits_to_f32",
    "f32_to_f16_bits",
    "sum2_bf16",
    "sum2_f16",
]


@cuda.jit(device=True)
def f32_to_f16_bits(x):  # pragma: no cover - device
    u = np.float32(x).view(np.uint32)
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    sign = np.uint32(np.uint32(u >> np.uint32(16)) & np.uint32(0x8000))
    ac = min(a, np.uint32(0x477FF000))
    mb = np.uint32(max(np.uint32(ac & np.uint32(0x7F800000)), np.uint32(0x38800000)) + np.uint32(13 << 23))
    s = np.float32(np.uint32(ac).view(np.float32) + np.uint32(mb).view(np.float32)).view(np.uint32)
    o = np.uint32(np.uint32(s - mb) + np.uint32(np.uint32(mb >> np.uint32(13)) - np.uint32(126 << 10)))
    nan = np.uint32(0x0200) if a > np.uint32(0x7F800000) else np.uint32(0)
    return np.uint16(o | nan | sign)


@cuda.jit(device=True)
def f16_bits_to_f32(h):  # pragma: no cover - device
    hu = np.uint32(h)
    sign = np.uint32(np.uint32(hu & np.uint32(0x8000)) << np.uint32(16))
    em = np.uint32(hu & np.uint32(0x7FFF))
    sh = np.uint32(em << np.uint32(13))
    normal = np.uint32(sh + np.uint32(0x38000000))
    special = np.uint32(sh + np.uint32(0x70000000))
    sub = np.float32(np.uint32(em + np.uint32(0x3F000000)).view(np.float32) - np.float32(0.5)).view(np.uint32)
    u = special if em >= np.uint32(0x7C00) else (sub if em < np.uint32(0x0400) else normal)
    return np.uint32(u | sign).view(np.float32)


@cuda.jit(device=True)
def f32_to_bf16_bits(x):  # pragma: no cover - device
    u = np.float32(x).view(np.uint32)
    odd = np.uint32(np.uint32(u >> np.uint32(16)) & np.uint32(1))
    r = np.uint32(np.uint32(u + np.uint32(0x7FFF) + odd) >> np.uint32(16))
    nan = np.uint32(np.uint32(np.uint32(u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    return np.uint16(nan if np.uint32(u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else r)


@cuda.jit(device=True)
def bf16_bits_to_f32(h):  # pragma: no cover - device
    return np.uint32(np.uint32(h) << np.uint32(16)).view(np.float32)


@cuda.jit
def _enc_f16(x, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] = f32_to_f16_bits(np.float32(x[i]))


@cuda.jit
def _enc_bf16(x, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] = f32_to_bf16_bits(np.float32(x[i]))


@cuda.jit
def _dec_f16(h, out, accumulate):  # pragma: no cover - device
    for i in range(cuda.grid(1), h.shape[0], cuda.gridsize(1)):
        v = f16_bits_to_f32(h[i])
        if accumulate:
            out[i] += v
        else:
            out[i] = v


@cuda.jit
def _dec_bf16(h, out, accumulate):  # pragma: no cover - device
    for i in range(cuda.grid(1), h.shape[0], cuda.gridsize(1)):
        v = bf16_bits_to_f32(h[i])
        if accumulate:
            out[i] += v
        else:
            out[i] = v


@cuda.jit
def _sum2_f16(a, b, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        s = np.float32(np.float32(0) + f16_bits_to_f32(a[i]))  # from +0, as an accumulator sums
        out[i] = f32_to_f16_bits(np.float32(s + f16_bits_to_f32(b[i])))


@cuda.jit
def _sum2_bf16(a, b, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        s = np.float32(np.float32(0) + bf16_bits_to_f32(a[i]))  # from +0, as an accumulator sums
        out[i] = f32_to_bf16_bits(np.float32(s + bf16_bits_to_f32(b[i])))


def encode_f16(x, out):  # type: ignore[no-untyped-def]
    """out[i] = binary16 bits of float32(x[i]) (x float32 or float64, on the device)."""
    if x.shape[0]:
        _enc_f16[grid(x.shape[0])](x, device(out))


def encode_bf16(x, out):  # type: ignore[no-untyped-def]
    if x.shape[0]:
        _enc_bf16[grid(x.shape[0])](x, device(out))


def decode_f16(h, out, accumulate):  # type: ignore[no-untyped-def]
    """out[i] (+)= the float of binary16 bits h[i]; ``h`` may be host memory (copied once)."""
    if h.shape[0]:
        _dec_f16[grid(h.shape[0])](device(h), out, bool(accumulate))


def decode_bf16(h, out, accumulate):  # type: ignore[no-untyped-def]
    if h.shape[0]:
        _dec_bf16[grid(h.shape[0])](device(h), out, bool(accumulate))


def _nonfinite(out, infkey):  # type: ignore[no-untyped-def]
    from .sparse import count_nonfinite

    return count_nonfinite(device(out), np.uint16(0x7FFF), np.uint16(infkey)) if out.shape[0] else 0


def sum2_f16(a, b, out):  # type: ignore[no-untyped-def]
    """out[i] = binary16 bits of (0 + float32(a[i])) + float32(b[i]), rounded once (a, b may be host
    memory); the CPU backend's ``sum2_f16``. Returns how many results are infinite or NaN."""
    if a.shape[0]:
        _sum2_f16[grid(a.shape[0])](device(a), device(b), device(out))
    return _nonfinite(out, 0x7C00)


def sum2_bf16(a, b, out):  # type: ignore[no-untyped-def]
    if a.shape[0]:
        _sum2_bf16[grid(a.shape[0])](device(a), device(b), device(out))
    return _nonfinite(out, 0x7F80)
