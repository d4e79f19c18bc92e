"""1-bit sign compression on the device (specs/codecs/sign.md).

Scales are ``float32(mean |v|)`` per group, the float64 lane sum of qsgd.md §3 (``quant.group_scales``
with the mean-|x| rule); bits are ``v < 0``, least significant bit first, one thread per output
byte. Decoding writes ``-s`` or ``+s``, one thread per element.

Error feedback is fused (:func:`encode_feedback`): ``c = x + e`` is written once into the new
residual's buffer, the scales are taken from it, and one kernel packs the bits of ``c`` and
replaces ``c`` by ``c - (+-s)``, the decoded value the payload will give. Three passes over the
gradient's size instead of the generic path's six (copy, add, scales, bits, decode, subtract),
and no decode of the payload. The same IEEE operations as the CPU's fused kernel and as the
generic path, so the bits are the same on every path. Unlike the CPU's, it has no sub-block limit:
any group size fuses.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from ...layout.quant import RULE_MEANABS
from .launch import device, grid, host, mul32, pos_nan
from .quant import group_scales

__all__ = ["encode", "encode_feedback", "fuses_feedback", "sign_decode"]


@cuda.jit
def _pack(x, bits):  # pragma: no cover - device
    n = x.shape[0]
    for o in range(cuda.grid(1), bits.shape[0], cuda.gridsize(1)):
        b = np.uint32(0)
        for t in range(8):
            i = 8 * o + t
            if i < n and np.float32(x[i]) < np.float32(0.0):
                b |= np.uint32(1) << np.uint32(t)
        bits[o] = np.uint8(b)


def encode(flat: Any, bits: Any, scales: Any, group_size: int) -> int:
    """Scales and sign bits of device ``flat``; returns the number of non-finite groups."""
    n = int(flat.shape[0])
    if n == 0:
        return 0
    G = group_size if group_size > 0 else n
    nbad = group_scales(flat, scales, cuda.device_array(1, np.uint16)[:0], G, RULE_MEANABS, 1, 0.0)
    _pack[grid(int(bits.shape[0]))](flat, bits)
    return int(host(nbad)[0])


@cuda.jit
def _decode(bits, scales, out, G, accumulate):  # pragma: no cover - device
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        neg = (np.uint32(bits[i >> 3]) >> np.uint32(i & 7)) & np.uint32(1)
        v = mul32(np.float32(-1.0) if neg else np.float32(1.0), scales[i // G])
        if accumulate:  # a NaN sum made positive (format.md §10)
            out[i] = pos_nan(out[i] + v)
        else:
            out[i] = v


def sign_decode(codes: Any, scales: Any, out: Any, G: int, accumulate: bool) -> None:
    """out[i] (+)= -s or +s; sections may be host arrays (copied once)."""
    if int(out.shape[0]):
        _decode[grid(int(out.shape[0]))](device(codes), device(scales), out, G, bool(accumulate))


def fuses_feedback(n: int, group_size: int) -> bool:
    """Whether :func:`encode_feedback` applies: always on the device (no sub-block to fit)."""
    return True


@cuda.jit
def _corrected(x, e, has_e, c):  # pragma: no cover - device
    """c = float32(x) + e (one IEEE addition, a NaN sum made positive: format.md §10), or float32(x)
    without a residual."""
    for i in range(cuda.grid(1), c.shape[0], cuda.gridsize(1)):
        if has_e:
            c[i] = pos_nan(np.float32(x[i]) + e[i])
        else:
            c[i] = np.float32(x[i])


@cuda.jit
def _pack_residual(c, scales, G, bits, bad):  # pragma: no cover - device
    """Thread per output byte: the sign bits of c[8o .. 8o+7], and each c replaced by
    ``c - (-s if c < 0 else s)`` (sign.md §3's decoded value); counts the non-finite results."""
    n = c.shape[0]
    cnt = np.int64(0)
    for o in range(cuda.grid(1), bits.shape[0], cuda.gridsize(1)):
        b = np.uint32(0)
        for t in range(8):
            i = 8 * o + t
            if i < n:
                v = c[i]
                s = scales[i // G]
                neg = v < np.float32(0.0)
                if neg:
                    b |= np.uint32(1) << np.uint32(t)
                r = v - (-s if neg else s)
                c[i] = r
                if not (abs(r) <= np.float32(3.4028234663852886e38)):
                    cnt += 1
        bits[o] = np.uint8(b)
    if cnt:
        cuda.atomic.add(bad, 0, cnt)


def encode_feedback(flat: Any, e: Any, has_e: bool, new_e: Any, bits: Any, scales: Any, group_size: int) -> int:
    """Sign-encode ``flat + e`` (device float32) and write the new residual into ``new_e``; returns
    the number of non-finite groups plus non-finite residuals (one number comes to the host), as the
    CPU's :func:`gcodec.kernels.cpu.sign.encode_feedback`."""
    n = int(flat.shape[0])
    if n == 0:
        return 0
    G = group_size if group_size > 0 else n
    _corrected[grid(n)](flat, e if has_e else new_e, bool(has_e), new_e)
    nbad = group_scales(new_e, scales, cuda.device_array(1, np.uint16)[:0], G, RULE_MEANABS, 1, 0.0)
    _pack_residual[grid(int(bits.shape[0]))](new_e, scales, G, bits, nbad)
    return int(host(nbad)[0])
