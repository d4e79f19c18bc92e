"""Bit packing of w-bit two's-complement codes (2..8 bits) in a little-endian bit stream.

Element ``i`` occupies bits ``[i*w, (i+1)*w)`` (specs/codecs/uniform.md §6). 3/5/6/7-bit codes are
joined eight at a time in one uint64 (SWAR) and stored as one unaligned 8-byte word that the next
octet's store overlaps.

The byte offset of element ``b0`` (a multiple of 8) is ``b0 // 8 * w``. Callers pick the function
for their width (``_pack_bytes`` / ``_unpack_bytes`` for 4 and 2 bits, the octet forms for 3, 5, 6
and 7), so that a kernel compiles only its own width's code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .simd import load_u64, store_u64


@njit(cache=True)
def _pack_bytes(cb, m, w, codes, o0):  # pragma: no cover - jitted
    """4- or 2-bit codes, ``w`` a literal: 8/w codes per byte, the first in the low bits."""
    if w == 4:  # two codes per 16-bit lane (little-endian: the first is the low byte)
        nb = (m + 1) // 2
        c16 = cb[: 2 * nb].view(np.uint16)
        for j in range(nb):
            v = c16[np.uint64(j)]
            codes[o0 + np.uint64(j)] = np.uint8((v & np.uint16(0x0F)) | ((v >> np.uint16(4)) & np.uint16(0xF0)))
        return
    per = 8 // w
    mask = np.uint8((1 << w) - 1)
    for j in range((m * w + 7) // 8):
        k = np.uint64(per * j)
        b = np.uint8(0)
        for t in range(per):
            b |= (cb[k + np.uint64(t)] & mask) << np.uint8(w * t)
        codes[o0 + np.uint64(j)] = b


@njit(cache=True)
def _swar_masks(w):  # pragma: no cover - jitted
    """Masks of the ``w``-bit fields of a uint64 cut into 8-, 16- and 32-bit lanes (``w`` a literal)."""
    f = (1 << w) - 1
    m1 = np.uint64(0x0001000100010001 * f)
    m2 = np.uint64(0x0000000100000001 * ((1 << (2 * w)) - 1))
    m3 = np.uint64((1 << (4 * w)) - 1)
    return np.uint64(0x0101010101010101 * f), m1, m2, m3


@njit(cache=True)
def _join_octet(v, w):  # pragma: no cover - jitted
    """Eight byte-sized codes (byte t of ``v`` is code t) -> their low ``w`` bits as one 8w-bit field.

    Joins neighbours as in a tree, SWAR in one uint64: pairs into 2w-bit fields, then 4w, then 8w.
    """
    m0, m1, m2, m3 = _swar_masks(w)
    v &= m0
    v = (v & m1) | ((v >> np.uint64(8 - w)) & (m1 << np.uint64(w)))
    v = (v & m2) | ((v >> np.uint64(16 - 2 * w)) & (m2 << np.uint64(2 * w)))
    return (v & m3) | ((v >> np.uint64(32 - 4 * w)) & (m3 << np.uint64(4 * w)))


@njit(cache=True)
def _split_octet(v, w):  # pragma: no cover - jitted
    """The inverse of :func:`_join_octet` (``v`` holds 8w bits): eight sign-extended byte codes."""
    _, m1, m2, m3 = _swar_masks(w)
    v = (v & m3) | ((v << np.uint64(32 - 4 * w)) & (m3 << np.uint64(32)))
    v = (v & m2) | ((v << np.uint64(16 - 2 * w)) & (m2 << np.uint64(16)))
    v = (v & m1) | ((v << np.uint64(8 - w)) & (m1 << np.uint64(8)))
    neg = (v >> np.uint64(w - 1)) & np.uint64(0x0101010101010101)  # 1 in each byte whose code is < 0
    return v | (neg * np.uint64(0xFF ^ ((1 << w) - 1)))


@njit(cache=True)
def _pack_octets(cb, m, w, codes, o0):  # pragma: no cover - jitted
    """Eight ``w``-bit codes make ``w`` bytes (``w`` in 3, 5, 6, 7; the masks are set up once per call).

    Each octet is read from ``cb`` as one uint64, joined (:func:`_join_octet`) and stored as one
    unaligned 8-byte word whose 8 - w high (zero) bytes the next octet's store overwrites. Octets
    whose word would reach past the last byte of [b0, b0 + m) go byte by byte, so nothing outside
    the range is written (another thread may own it). ``cb`` must hold zeros from ``m`` up to a
    multiple of 8.
    """
    n8 = (m + 7) // 8
    nbytes = (m * w + 7) // 8
    fast = min(n8, max(0, (nbytes - 8) // w + 1))  # octets k with k * w + 8 <= nbytes
    for k in range(fast):
        store_u64(codes, o0 + np.uint64(k * w), _join_octet(load_u64(cb, 8 * k), w))
    for k in range(fast, n8):
        o = o0 + np.uint64(k * w)
        v = _join_octet(load_u64(cb, 8 * k), w)
        for t in range(min(w, nbytes - k * w)):
            codes[o + np.uint64(t)] = np.uint8((v >> np.uint64(8 * t)) & np.uint64(0xFF))


@njit(cache=True)
def _field(u, t, w):  # pragma: no cover - jitted
    """Code ``t`` (sign-extended) of the byte ``u`` (int32) holding 8 / w codes of ``w`` bits."""
    mask = np.int32((1 << w) - 1)
    half = np.int32(1 << (w - 1))
    return ((u >> np.int32(w * t)) & mask ^ half) - half


@njit(cache=True)
def _unpack_bytes(codes, o0, m, w, qb):  # pragma: no cover - jitted
    """qb[0 : roundup(m, 8 / w)] = the sign-extended 4- or 2-bit codes from byte ``o0``."""
    per = 8 // w
    for j in range((m + per - 1) // per):
        u = np.int32(codes[o0 + np.uint64(j)])
        k = np.uint64(per * j)
        for t in range(per):
            qb[k + np.uint64(t)] = np.int8(_field(u, t, w))


@njit(cache=True)
def _unpack_octets(codes, o0, m, w, qb):  # pragma: no cover - jitted
    """``w`` bytes hold eight codes (``w`` in 3, 5, 6, 7). Writes qb[0 : roundup(m, 8)].

    Octets whose 8-byte word lies within the range's bytes are read as one unaligned uint64 and
    split (:func:`_split_octet`); the last ones byte by byte, so nothing past the range is read.
    """
    n8 = (m + 7) // 8
    nbytes = (m * w + 7) // 8
    fast = min(n8, max(0, (nbytes - 8) // w + 1))
    field = np.uint64((1 << (8 * w)) - 1)
    for k in range(fast):
        v = load_u64(codes, o0 + np.uint64(k * w)) & field
        store_u64(qb, 8 * k, _split_octet(v, w))
    for k in range(fast, n8):
        o = o0 + np.uint64(k * w)
        v = np.uint64(0)
        for t in range(min(w, nbytes - k * w)):
            v |= np.uint64(codes[o + np.uint64(t)]) << np.uint64(8 * t)
        store_u64(qb, 8 * k, _split_octet(v, w))
