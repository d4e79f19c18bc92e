"""float32 <-> binary16 / bfloat16 on the device (specs/codecs/fp16.md, bf16.md).

The scalar conversions are :mod:`gcodec.kernels.scalar`'s, the CPU backend's too, compiled as CUDA
device functions: integer steps plus one float addition that rounds to nearest even at the
binary16 ulp (no multiply, so nothing for the compiler to contract; subnormals are kept: Numba
compiles without flush-to-zero unless ``fastmath``). Sums follow the NaN rule of specs/format.md §10
(``launch.pos_nan``), as the CPU's. One thread per element, grid-stride.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import scalar
from .launch import device, grid, host, pos_nan, upload

__all__ = [
    "decode_bf16",
    "decode_f16",
    "encode_bf16",
    "encode_bf16_feedback",
    "encode_f16",
    "encode_f16_feedback",
    "f16_bits_to_f32",
    "f32_to_f16_bits",
    "sum2_bf16",
    "sum2_f16",
    "sum2_widen_bf16",
    "sum2_widen_f16",
]


# gcodec.kernels.scalar's conversions, compiled as device functions
f32_to_f16_bits = cuda.jit(device=True)(scalar.f32_to_f16_bits)
f16_bits_to_f32 = cuda.jit(device=True)(scalar.f16_bits_to_f32)
f32_to_bf16_bits = cuda.jit(device=True)(scalar.f32_to_bf16_bits)
bf16_bits_to_f32 = cuda.jit(device=True)(scalar.bf16_bits_to_f32)


@cuda.jit
def _enc_f16(x, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] = f32_to_f16_bits(np.float32(x[i]))


@cuda.jit
def _enc_bf16(x, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] = f32_to_bf16_bits(np.float32(x[i]))


@cuda.jit
def _fb_f16(x, e, has_e, out, enew, bad):  # pragma: no cover - device
    c = np.int64(0)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = pos_nan(np.float32(x[i] + e[i])) if has_e else np.float32(x[i])
        h = f32_to_f16_bits(v)
        out[i] = h
        r = np.float32(v - f16_bits_to_f32(h))
        enew[i] = r
        if not (abs(r) <= np.float32(3.4028234663852886e38)):
            c += 1
    if c:
        cuda.atomic.add(bad, 0, c)


@cuda.jit
def _fb_bf16(x, e, has_e, out, enew, bad):  # pragma: no cover - device
    c = np.int64(0)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = pos_nan(np.float32(x[i] + e[i])) if has_e else np.float32(x[i])
        h = f32_to_bf16_bits(v)
        out[i] = h
        r = np.float32(v - bf16_bits_to_f32(h))
        enew[i] = r
        if not (abs(r) <= np.float32(3.4028234663852886e38)):
            c += 1
    if c:
        cuda.atomic.add(bad, 0, c)


@cuda.jit
def _dec_f16(h, out, accumulate):  # pragma: no cover - device
    for i in range(cuda.grid(1), h.shape[0], cuda.gridsize(1)):
        v = f16_bits_to_f32(h[i])
        if accumulate:
            out[i] = pos_nan(out[i] + v)
        else:
            out[i] = v


@cuda.jit
def _dec_bf16(h, out, accumulate):  # pragma: no cover - device
    for i in range(cuda.grid(1), h.shape[0], cuda.gridsize(1)):
        v = bf16_bits_to_f32(h[i])
        if accumulate:
            out[i] = pos_nan(out[i] + v)
        else:
            out[i] = v


@cuda.jit
def _sum2_f16(a, b, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        s = np.float32(np.float32(0) + f16_bits_to_f32(a[i]))  # from +0, as an accumulator sums
        out[i] = f32_to_f16_bits(pos_nan(np.float32(s + f16_bits_to_f32(b[i]))))


@cuda.jit
def _sum2_bf16(a, b, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        s = np.float32(np.float32(0) + bf16_bits_to_f32(a[i]))  # from +0, as an accumulator sums
        out[i] = f32_to_bf16_bits(pos_nan(np.float32(s + bf16_bits_to_f32(b[i]))))


@cuda.jit
def _sum2w_f16(a, b, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        s = np.float32(np.float32(0) + f16_bits_to_f32(a[i]))
        out[i] = f16_bits_to_f32(f32_to_f16_bits(pos_nan(np.float32(s + f16_bits_to_f32(b[i])))))


@cuda.jit
def _sum2w_bf16(a, b, out):  # pragma: no cover - device
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        s = np.float32(np.float32(0) + bf16_bits_to_f32(a[i]))
        out[i] = bf16_bits_to_f32(f32_to_bf16_bits(pos_nan(np.float32(s + bf16_bits_to_f32(b[i])))))


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


def _nonfinite_values(out):  # type: ignore[no-untyped-def]
    from .sparse import count_nonfinite_values

    return int(count_nonfinite_values(out)) if out.shape[0] else 0


def sum2_widen_f16(a, b, out):  # type: ignore[no-untyped-def]
    """out[i] = the float32 of what :func:`sum2_f16` writes (out a float32 device array); returns
    how many sums are infinite or NaN (the float32 of a binary16 infinity or NaN is one too)."""
    if a.shape[0]:
        _sum2w_f16[grid(a.shape[0])](device(a), device(b), out)
    return _nonfinite_values(out)


def sum2_widen_bf16(a, b, out):  # type: ignore[no-untyped-def]
    if a.shape[0]:
        _sum2w_bf16[grid(a.shape[0])](device(a), device(b), out)
    return _nonfinite_values(out)


def _feedback(kernel, x, e, out, enew):  # type: ignore[no-untyped-def]
    bad = upload(np.zeros(1, np.int64))
    if x.shape[0]:
        kernel[grid(x.shape[0])](x, x if e is None else e, e is not None, device(out), enew, bad)
    return int(host(bad)[0])


def encode_f16_feedback(x, e, out, enew):  # type: ignore[no-untyped-def]
    """Error feedback fused into the binary16 encode, as the CPU backend's ``encode_f16_feedback``
    (flat float32 device arrays; ``e`` None without a residual): c = x (+ e), out = its bits,
    enew = c - float32(out). Returns how many residuals are infinite or NaN (one number comes back)."""
    return _feedback(_fb_f16, x, e, out, enew)


def encode_bf16_feedback(x, e, out, enew):  # type: ignore[no-untyped-def]
    return _feedback(_fb_bf16, x, e, out, enew)
