"""Group-wise symmetric integer quantization (specs/codecs/uniform.md), fused in one pass per group.

Encoding a group reads its values twice while they sit in L1 (absmax, then scale-round-clamp-pack)
and writes the packed codes and the group's scale. Decoding unpacks, rescales and writes (or adds
into) the output in one pass. Work is split into chunks of whole groups over ``prange``; the
result does not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_TARGET_CHUNK = 1 << 16  # elements per parallel task
_FMAX = np.float32(3.4028234663852886e38)


def chunk_groups(group_size: int) -> int:
    """Groups per parallel task: about 64 Ki elements, and at least one group."""
    return max(1, _TARGET_CHUNK // group_size)


@njit(cache=True, inline="always")
def _absmax(x, lo, hi):  # pragma: no cover - jitted
    """max |x[lo:hi]| as float32, and whether a value was NaN or infinite."""
    m = np.float32(0.0)
    bad = False
    for i in range(lo, hi):
        a = np.float32(abs(np.float32(x[i])))
        m = a if a > m else m
        bad |= not (a <= _FMAX)
    return m, bad


@njit(cache=True, inline="always")
def _quant(v, s, qmax):  # pragma: no cover - jitted
    """clamp(rint(v / s), -qmax, qmax) as int32; 0 when the scale is 0."""
    if s == np.float32(0.0):
        return np.int32(0)
    q = np.rint(np.float32(v) / s)
    q = q if q < qmax else qmax
    q = q if q > -qmax else -qmax
    return np.int32(q)


@njit(cache=True, parallel=True)
def uniform_scales(x, scales, group_size, bits, cgroups):  # pragma: no cover - jitted
    """scale_g = absmax_g / qmax for every group; returns the number of non-finite groups."""
    n = x.shape[0]
    ngroups = scales.shape[0]
    qmax = np.float32((1 << (bits - 1)) - 1)
    nchunks = (ngroups + cgroups - 1) // cgroups
    nbad = 0
    for c in prange(nchunks):
        for g in range(c * cgroups, min(c * cgroups + cgroups, ngroups)):
            lo = g * group_size
            m, bad = _absmax(x, lo, min(lo + group_size, n))
            scales[g] = m / qmax
            if bad:
                nbad += 1
    return nbad


@njit(cache=True, parallel=True)
def uniform_encode(x, codes, scales, group_size, bits, cgroups):  # pragma: no cover - jitted
    """Quantize flat ``x`` into packed ``codes`` (uint8) and per-group ``scales`` (float32).

    Requires ``bits == 8`` or ``group_size % (8 // bits) == 0`` (groups start on byte boundaries);
    :func:`uniform_pack_unaligned` handles the rest. Returns the number of non-finite groups.
    """
    n = x.shape[0]
    ngroups = scales.shape[0]
    qmax = np.float32((1 << (bits - 1)) - 1)
    per_byte = 8 // bits
    mask = np.uint32((1 << bits) - 1)
    nchunks = (ngroups + cgroups - 1) // cgroups
    nbad = 0
    for c in prange(nchunks):
        for g in range(c * cgroups, min(c * cgroups + cgroups, ngroups)):
            lo = g * group_size
            hi = min(lo + group_size, n)
            m, bad = _absmax(x, lo, hi)
            if bad:
                nbad += 1
            s = m / qmax
            scales[g] = s
            if bits == 8:
                for i in range(lo, hi):
                    codes[i] = np.uint8(_quant(x[i], s, qmax) & 0xFF)
            else:
                for j in range(lo // per_byte, (hi + per_byte - 1) // per_byte):
                    byte = np.uint32(0)
                    for k in range(per_byte):
                        i = j * per_byte + k
                        if i < hi:
                            byte |= (np.uint32(_quant(x[i], s, qmax)) & mask) << np.uint32(k * bits)
                    codes[j] = np.uint8(byte)
    return nbad


@njit(cache=True)
def uniform_pack_unaligned(x, codes, scales, group_size, bits):  # pragma: no cover - jitted
    """Pack codes element by element when groups do not start on byte boundaries (serial)."""
    n = x.shape[0]
    qmax = np.float32((1 << (bits - 1)) - 1)
    mask = np.uint32((1 << bits) - 1)
    per_byte = 8 // bits
    for j in range(codes.shape[0]):
        codes[j] = 0
    for i in range(n):
        q = _quant(x[i], scales[i // group_size], qmax)
        j = i // per_byte
        k = i - j * per_byte
        codes[j] = np.uint8(np.uint32(codes[j]) | ((np.uint32(q) & mask) << np.uint32(k * bits)))


@njit(cache=True, parallel=True)
def uniform_decode(codes, scales, out, group_size, bits, accumulate, cgroups):  # pragma: no cover - jitted
    """out[i] (+)= float32(q_i) * scale[i // group_size]; returns the count of forbidden codes."""
    n = out.shape[0]
    ngroups = scales.shape[0]
    shift = 3 if bits == 1 else (2 if bits == 2 else (1 if bits == 4 else 0))
    lowmask = (1 << shift) - 1
    mask = np.uint32((1 << bits) - 1)
    half = np.uint32(1 << (bits - 1))
    nchunks = (ngroups + cgroups - 1) // cgroups
    nbad = 0
    for c in prange(nchunks):
        bad = 0
        for g in range(c * cgroups, min(c * cgroups + cgroups, ngroups)):
            lo = g * group_size
            hi = min(lo + group_size, n)
            s = scales[g]
            if bits == 8:
                for i in range(lo, hi):
                    u = np.int32(codes[i])
                    bad += u == 128
                    v = np.float32(u - ((u & 128) << 1)) * s
                    if accumulate:
                        out[i] += v
                    else:
                        out[i] = v
            else:
                for i in range(lo, hi):
                    u = (np.uint32(codes[i >> shift]) >> np.uint32((i & lowmask) * bits)) & mask
                    bad += u == half
                    v = np.float32(np.int32(u) - np.int32((u & half) << np.uint32(1))) * s
                    if accumulate:
                        out[i] += v
                    else:
                        out[i] = v
        nbad += bad
    return nbad


@njit(cache=True)
def count_forbidden(codes, bits, n):  # pragma: no cover - jitted
    """How many of the first ``n`` packed codes equal -2**(bits-1) (which encoders never write)."""
    per_byte = 8 // bits
    mask = np.uint32((1 << bits) - 1)
    half = np.uint32(1 << (bits - 1))
    bad = 0
    for i in range(n):
        j = i // per_byte
        u = (np.uint32(codes[j]) >> np.uint32((i - j * per_byte) * bits)) & mask
        bad += u == half
    return bad
