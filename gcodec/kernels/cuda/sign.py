"""1-bit sign compression on the device (specs/codecs/sign.md).

Scales are ``float32(mean |v|)`` per group, the float64 lane sum of qsgd.md §3 (``quant.group_scales``
with the mean-|x| rule); bits are ``v < 0``, least significant bit first, one thread per output
byte. Decoding writes ``-s`` or ``+s``, one thread per element. Error feedback is not fused here
(:func:`fuses_feedback` is False).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from ...layout.quant import RULE_MEANABS
from .launch import device, grid, host, mul32
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
        if accumulate:
            out[i] = out[i] + v
        else:
            out[i] = v


def sign_decode(codes: Any, scales: Any, out: Any, G: int, accumulate: bool) -> None:
    """out[i] (+)= -s or +s; sections may be host arrays (copied once)."""
    if int(out.shape[0]):
        _decode[grid(int(out.shape[0]))](device(codes), device(scales), out, G, bool(accumulate))


def fuses_feedback(n: int, group_size: int) -> bool:
    return False


def encode_feedback(
    flat: Any, e: Any, has_e: bool, new_e: Any, bits: Any, scales: Any, group_size: int
) -> int:  # pragma: no cover - never called: fuses_feedback is False here
    raise NotImplementedError("the CUDA backend has no fused sign + feedback kernel (fuses_feedback is False)")
