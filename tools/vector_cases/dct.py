"""Golden vectors of ``dct`` (specs/codecs/dct.md).

Valid names start with the codec id; invalid names with the rule they break (``dc1_`` … ``dc5_``, or
``c1_``, ``c3_``). :func:`basis_exact` is a second derivation of the basis table (50-digit
arithmetic, rounded once to binary32); the tests compare it with ``gcodec.layout.dct``.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from gcodec.arrays import BFLOAT16

from . import edit, encode, header_of, relayout, section_blobs
from .sparse import heavy_input

F32, F16 = np.float32, np.float16

EXAMPLE = np.array([1, 1, 1, 1, 2, -2], F32)


def basis_exact(chunk: int, digits: int = 50) -> tuple[np.ndarray, float]:
    """(the table of spec §3 rounded once from ``digits``-digit values, the smallest distance of an
    entry from a binary32 rounding midpoint, relative to the entry)."""
    import mpmath

    mpmath.mp.dps = digits
    out = np.empty((chunk, chunk), F32)
    worst = 1.0
    for u in range(chunk):
        a = mpmath.sqrt(mpmath.mpf(1 if u == 0 else 2) / chunk)
        for i in range(chunk):
            v = a * mpmath.cos(mpmath.pi * (2 * i + 1) * u / (2 * chunk))
            f = F32(float(v))  # binary64 first: exact enough, checked against the midpoints below
            # the two midpoints around f, exactly (binary32 neighbours are exact in mpmath)
            up = np.nextafter(f, F32(np.inf))
            dn = np.nextafter(f, F32(-np.inf))
            mids = [(mpmath.mpf(float(f)) + mpmath.mpf(float(g))) / 2 for g in (up, dn)]
            d = min(abs(v - m) for m in mids) / abs(v)
            # correct rounding: v lies between the two midpoints around f
            assert min(mids) < v < max(mids), (chunk, u, i)
            worst = min(worst, float(d))
            out[u, i] = f
    return out, worst


def _enc(x, **kw):
    return lambda: (encode("dct", x, **kw), x)


VALID = [
    ("dct_example", _enc(EXAMPLE, chunk=4, k=1)),
    ("dct_f32", _enc(heavy_input(1000, 81), chunk=64, k=6)),
    ("dct_f32_packed", _enc(heavy_input(1000, 81), chunk=64, k=6, index_coding="packed")),
    ("dct_keeps_all", _enc(heavy_input(40, 82), chunk=8, k=8)),
    ("dct_chunk1", _enc(heavy_input(7, 83), chunk=1, k=1)),
    ("dct_f16", _enc(heavy_input(300, 84, F16), chunk=32, k=4)),
    ("dct_bf16", _enc(heavy_input(300, 85, BFLOAT16), chunk=32, k=4)),
    (
        "dct_f64",
        _enc(heavy_input(300, 89, np.float64), chunk=32, k=4, values={"id": "uniform", "bits": 4, "group_size": 4}),
    ),
    ("dct_empty", _enc(np.zeros(0, F32), chunk=16, k=2)),
    ("dct_2d", _enc(heavy_input(96, 86).reshape(8, 12), chunk=16, k=3)),
    ("dct_values_sign", _enc(heavy_input(512, 87), chunk=64, k=8, values={"id": "sign", "group_size": 8})),
    ("dct_tiles_4x4", _enc(heavy_input(130, 90).reshape(10, 13), chunk=16, k=3, dims=2)),
    ("dct_tiles_8x8_3d", _enc(heavy_input(360, 91).reshape(9, 5, 8), chunk=64, k=6, dims=2, index_coding="packed")),
    (
        "dct_tiles_64x64_u2",
        _enc(
            heavy_input(70 * 90, 92).reshape(70, 90),
            chunk=4096,
            k=32,
            dims=2,
            values={"id": "uniform", "bits": 2, "group_size": 32},
        ),
    ),
    ("dct_tiles_vector", _enc(heavy_input(37, 93), chunk=4, k=2, dims=2)),
    # empty tensors tiled (spec §1, "Empty tensors"): R = 0 rows of Q = 5, R = 5 rows of Q = 0, and
    # a 1-d [0] as one row of 0, nested values included: no tiles, every index section 0 bytes
    ("dct_tiles_empty_rows", _enc(np.zeros((0, 5), F32), chunk=16, k=2, dims=2)),
    ("dct_tiles_empty_cols", _enc(np.zeros((5, 0), BFLOAT16), chunk=64, k=3, dims=2, index_coding="packed")),
    (
        "dct_tiles_empty_vector_u2",
        _enc(np.zeros(0, np.float64), chunk=4, k=1, dims=2, values={"id": "uniform", "bits": 2, "group_size": 8}),
    ),
    (
        "dct_values_uniform2",
        _enc(heavy_input(512, 88), chunk=64, k=8, values={"id": "uniform", "bits": 2, "group_size": 8}),
    ),
]


@functools.cache
def base() -> bytes:
    return encode("dct", EXAMPLE, chunk=4, k=1)


@functools.cache
def packed_base() -> bytes:
    return encode("dct", EXAMPLE, chunk=4, k=1, index_coding="packed")


@functools.cache
def packed2_base() -> bytes:
    """k = 2: two 2-bit fields per chunk."""
    return encode("dct", EXAMPLE, chunk=4, k=2, index_coding="packed")


def _duplicate_index(blobs, t):
    """Chunk 0's second field made equal to its first: not increasing (DC3)."""
    j = _section(t, "indices")
    b = bytearray(blobs[j])
    e0 = b[0] & 3
    b[0] = (b[0] & ~0x0C) | (e0 << 2)
    blobs[j] = bytes(b)


def _relayout(mk, fn_header=None, fn_blobs=None):
    def make():
        p = mk()
        h = header_of(p)
        blobs = section_blobs(p)
        if fn_header:
            fn_header(h["tensors"][0])
        if fn_blobs:
            fn_blobs(blobs[0], h["tensors"][0])
        h, data = relayout(h, blobs)
        return edit(p, header=h, data=data)

    return make


def _params(**changes):
    def f(t):
        t["params"].update(changes)

    return f


def _section(t, name):
    return [s[0] for s in t["sections"]].index(name)


def _set(name, data):
    def f(blobs, t):
        blobs[_section(t, name)] = data

    return f


def _value(i: int, bits: int):
    def f(blobs, t):
        j = _section(t, "values")
        v = bytearray(blobs[j])
        v[4 * i : 4 * i + 4] = struct.pack("<I", bits)
        blobs[j] = bytes(v)

    return f


INVALID = [
    ("dc1_dct_k_exceeds_chunk", _relayout(base, _params(k=5)), "HeaderError", "DC1"),
    ("dc1_dct_packed_index_bytes", _relayout(packed_base, _params(index_bytes=2)), "HeaderError", "DC1"),
    ("c1_dct_chunk_not_power_of_two", _relayout(base, _params(chunk=6)), "HeaderError", "C1"),
    ("c1_dct_chunk_too_large", _relayout(base, _params(chunk=512)), "HeaderError", "C1"),
    ("c1_dct_tile_not_square", _relayout(base, _params(dims=2, chunk=8)), "HeaderError", "C1"),
    ("c1_dct_bad_dims", _relayout(base, _params(dims=3)), "HeaderError", "C1"),
    ("c3_dct_values_short", _relayout(base, fn_blobs=_set("values", bytes(4))), "SizeMismatchError", "C3"),
    ("dc2_dct_pad_bits", _relayout(base, fn_blobs=_set("indices", b"\x06")), "PayloadValueError", "DC2"),
    (
        "dc2_dct_width_too_large",
        _relayout(base, fn_blobs=_set("index_widths", b"\x00\x03")),
        "PayloadValueError",
        "DC2",
    ),
    ("dc3_dct_packed_duplicate", _relayout(packed2_base, fn_blobs=_duplicate_index), "PayloadValueError", "DC3"),
    ("dc4_dct_nan_value", _relayout(base, fn_blobs=_value(1, 0x7FC00000)), "PayloadValueError", "DC4"),
    ("dc5_dct_huge_value", _relayout(base, fn_blobs=_value(0, 0x7B000000)), "PayloadValueError", "DC5"),
]
