"""Golden vectors of ``chunktopk`` (specs/codecs/chunktopk.md).

Valid names start with the codec id; invalid names with the rule they break (``ck1_`` … ``ck4_``,
or a container/codec rule such as ``c1_``, ``c3_``, ``h1_``).

The pure-Python :func:`select`, :func:`pack_gap`, :func:`unpack_gap`, :func:`pack_packed` and
:func:`unpack_packed` are a second, independent implementation of the selection (§2) and the two
in-chunk index codings (§3, §4); the tests compare them with the kernels.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import numpy as np

from gcodec.arrays import BFLOAT16

from . import bits_array, edit, encode, header_of, relayout, section_blobs
from .sparse import heavy_input, ties_input

F32, F16, F64 = np.float32, np.float16, np.float64


# --------------------------------------------------------------------------------------------
# reference selection and index codings (pure Python)


def chunk_lengths(n: int, chunk: int) -> list[int]:
    return [min(chunk, n - s) for s in range(0, n, chunk)]


def select(x: np.ndarray, chunk: int, k: int) -> list[list[int]]:
    """Each chunk's kept in-chunk indices, increasing: the top min(k, L) magnitudes, ties to the lowest index."""
    flat = np.asarray(x).reshape(-1)
    mags = [abs(float(v)) for v in flat.astype(np.float64)]
    out = []
    for s in range(0, len(mags), chunk):
        seg = mags[s : s + chunk]
        order = sorted(range(len(seg)), key=lambda i: (-seg[i], i))
        out.append(sorted(order[: min(k, len(seg))]))
    return out


def pack_gap(kept: list[list[int]]) -> tuple[bytes, bytes]:
    """(index_widths, indices) of the gap coding: per chunk, its gaps LSB first at the bit length of
    its largest gap, from a byte boundary."""
    widths = bytearray()
    out = bytearray()
    for idx in kept:
        gaps = [i - (idx[j - 1] if j else -1) - 1 for j, i in enumerate(idx)]
        w = max(gaps).bit_length() if gaps else 0
        widths.append(w)
        acc = sum(d << (j * w) for j, d in enumerate(gaps))
        out += acc.to_bytes((len(gaps) * w + 7) // 8, "little")
    return bytes(widths), bytes(out)


def unpack_gap(widths: bytes, packed: bytes, n: int, chunk: int, k: int) -> list[list[int]]:
    out = []
    pos = 0
    for c, L in enumerate(chunk_lengths(n, chunk)):
        kc, w = min(k, L), widths[c]
        nb = (kc * w + 7) // 8
        acc = int.from_bytes(packed[pos : pos + nb], "little")
        pos += nb
        prev, idx = -1, []
        for j in range(kc):
            prev = prev + 1 + ((acc >> (j * w)) & ((1 << w) - 1))
            idx.append(prev)
        out.append(idx)
    return out


def pack_packed(kept: list[list[int]], chunk: int) -> bytes:
    """The packed coding: every in-chunk index in bitlength(chunk - 1) bits, one LSB-first stream."""
    w = (chunk - 1).bit_length()
    flat = [i for idx in kept for i in idx]
    acc = sum(i << (j * w) for j, i in enumerate(flat))
    return acc.to_bytes((len(flat) * w + 7) // 8, "little")


def unpack_packed(packed: bytes, n: int, chunk: int, k: int) -> list[list[int]]:
    w = (chunk - 1).bit_length()
    acc = int.from_bytes(packed, "little")
    out, j = [], 0
    for L in chunk_lengths(n, chunk):
        idx = []
        for _ in range(min(k, L)):
            idx.append((acc >> (j * w)) & ((1 << w) - 1))
            j += 1
        out.append(idx)
    return out


# --------------------------------------------------------------------------------------------
# valid cases

#: The worked example of specs/codecs/chunktopk.md: chunks of 4, k = 2. Chunk 0 keeps -3 and 2
#: (in-chunk 1, 3), chunk 1 the first two of its three magnitude-2 ties (0, 1), the short chunk 2
#: both of its elements (0, 1).
EXAMPLE = np.array([0.5, -3.0, 0.0, 2.0, -2.0, 2.0, 2.0, 0.25, 1.5, -1.0], F32)


def _enc(x: Any, **kw: Any):
    return lambda: (encode("chunktopk", x, **kw), x)


U2 = {"id": "uniform", "bits": 2, "group_size": 64}

VALID = [
    ("chunktopk_example", _enc(EXAMPLE, chunk=4, k=2)),
    ("chunktopk_example_packed", _enc(EXAMPLE, chunk=4, k=2, index_coding="packed")),
    ("chunktopk_f32", _enc(heavy_input(5000, 61), chunk=256, k=8)),
    ("chunktopk_f32_packed", _enc(heavy_input(5000, 61), chunk=256, k=8, index_coding="packed")),
    ("chunktopk_c4096_k64_u2", _enc(heavy_input(8892, 62), chunk=4096, k=64, values=U2)),
    ("chunktopk_c4096_k64_u2_packed", _enc(heavy_input(8892, 62), chunk=4096, k=64, values=U2, index_coding="packed")),
    ("chunktopk_f64", _enc(heavy_input(300, 63, F64), chunk=50, k=5)),
    ("chunktopk_f16", _enc(heavy_input(300, 64, F16), chunk=50, k=5)),
    ("chunktopk_bf16", _enc(heavy_input(300, 65, BFLOAT16), chunk=50, k=5, index_coding="packed")),
    ("chunktopk_ties", _enc(ties_input(), chunk=30, k=7)),
    ("chunktopk_signed_zero_ties", _enc(bits_array([0x80000000, 0x00000000, 0x80000000], F32), chunk=3, k=2)),
    ("chunktopk_keeps_all", _enc(heavy_input(40, 66), chunk=8, k=8)),
    ("chunktopk_chunk1", _enc(heavy_input(5, 67), chunk=1, k=1, index_coding="packed")),
    ("chunktopk_empty", _enc(np.zeros(0, F32), chunk=16, k=4)),
    ("chunktopk_2d", _enc(heavy_input(128, 68).reshape(16, 8), chunk=24, k=3)),
    ("chunktopk_values_sign", _enc(heavy_input(600, 69), chunk=100, k=10, values={"id": "sign", "group_size": 10})),
    ("chunktopk_values_fp16", _enc(heavy_input(500, 70), chunk=64, k=6, values={"id": "fp16"})),
]


# --------------------------------------------------------------------------------------------
# invalid cases


@functools.cache
def gap_base() -> bytes:
    return encode("chunktopk", EXAMPLE, chunk=4, k=2)


@functools.cache
def packed_base() -> bytes:
    return encode("chunktopk", EXAMPLE, chunk=4, k=2, index_coding="packed")


@functools.cache
def multi_base() -> bytes:
    """1000 elements, chunks of 100, k = 9: ten chunks, widths of several bits."""
    return encode("chunktopk", heavy_input(1000, 71), chunk=100, k=9)


@functools.cache
def uniform_base() -> bytes:
    return encode("chunktopk", heavy_input(200, 72), chunk=50, k=4, values={"id": "uniform", "bits": 8})


def _relayout(base, fn_header=None, fn_blobs=None):
    def make():
        p = base()
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


def _section(t: dict, name: str) -> int:
    return [s[0] for s in t["sections"]].index(name)


def _set_section(name: str, data: bytes):
    def f(blobs, t):
        blobs[_section(t, name)] = data

    return f


def _drop(base, name: str):
    def make():
        p = base()
        h = header_of(p)
        blobs = section_blobs(p)
        i = _section(h["tensors"][0], name)
        del h["tensors"][0]["sections"][i]
        del blobs[0][i]
        h, data = relayout(h, blobs)
        return edit(p, header=h, data=data)

    return make


def _gap_indices(base, kept: list[list[int]], *, widen_chunk: int | None = None):
    """Replace a gap-coded payload's indices (same counts), re-packing widths and bytes; with
    ``widen_chunk``, that chunk is packed one bit wider than it needs (not minimal)."""

    def make():
        p = base()
        h = header_of(p)
        t = h["tensors"][0]
        blobs = section_blobs(p)
        widths, packed = pack_gap(kept)
        if widen_chunk is not None:
            widths = bytearray(widths)
            out = bytearray()
            for c, idx in enumerate(kept):
                gaps = [i - (idx[j - 1] if j else -1) - 1 for j, i in enumerate(idx)]
                w = widths[c] + (c == widen_chunk)
                widths[c] = w
                out += sum(d << (j * w) for j, d in enumerate(gaps)).to_bytes((len(gaps) * w + 7) // 8, "little")
            widths, packed = bytes(widths), bytes(out)
        blobs[0][_section(t, "index_widths")] = widths
        blobs[0][_section(t, "indices")] = packed
        t["params"]["index_bytes"] = len(packed)
        h, data = relayout(h, blobs)
        return edit(p, header=h, data=data)

    return make


def _multi_kept() -> list[list[int]]:
    p = multi_base()
    blobs = section_blobs(p)[0]
    return unpack_gap(blobs[0], blobs[1], 1000, 100, 9)


def _out_of_range():
    kept = _multi_kept()
    kept[-1][-1] = 100  # the chunk holds 100 elements
    return _gap_indices(multi_base, kept)()


def _not_minimal():
    return _gap_indices(multi_base, _multi_kept(), widen_chunk=3)()


def _width_too_large():
    """Chunk 1 of the example at width 3: a chunk of 4 elements needs at most bitlength(3) = 2 bits."""

    def f(blobs, t):
        blobs[_section(t, "index_widths")] = bytes([1, 3, 0])
        blobs[_section(t, "indices")] = bytes([0x03, 0x00])
        t["params"]["index_bytes"] = 2

    return _relayout(gap_base, fn_blobs=f)()


def _index_bytes_mismatch():
    def f(blobs, t):
        blobs[_section(t, "indices")] += b"\x00"
        t["params"]["index_bytes"] += 1

    return _relayout(gap_base, fn_blobs=f)()


def _gap_pad_bits():
    """Chunk 0 of the example uses 2 bits of its byte (gaps 1, 1 at width 1): set bit 7."""
    return _relayout(gap_base, fn_blobs=_set_section("indices", bytes([0x83])))()


def _packed_pad_bits():
    """Six 2-bit indices use 12 bits of the 2 bytes 4d 04: set bit 15."""
    return _relayout(packed_base, fn_blobs=_set_section("indices", bytes([0x4D, 0x84])))()


def _packed(kept: list[list[int]]):
    return _relayout(packed_base, fn_blobs=_set_section("indices", pack_packed(kept, 4)))


def _nan_value():
    def f(blobs, t):
        i = _section(t, "values")
        v = bytearray(blobs[i])
        v[4:8] = struct.pack("<I", 0x7FC00000)
        blobs[i] = bytes(v)

    return _relayout(gap_base, fn_blobs=f)()


def _nested(**changes):
    def f(t):
        t["params"]["values"].update(changes)

    return _relayout(uniform_base, fn_header=f)


INVALID = [
    # header rules
    ("ck1_chunktopk_k_exceeds_chunk", _relayout(gap_base, _params(k=5)), "HeaderError", "CK1"),
    ("ck1_chunktopk_packed_index_bytes", _relayout(packed_base, _params(index_bytes=3)), "HeaderError", "CK1"),
    ("ck1_chunktopk_gap_index_bytes", _relayout(gap_base, _params(index_bytes=4)), "HeaderError", "CK1"),
    ("c1_chunktopk_missing_chunk", _relayout(gap_base, lambda t: t["params"].pop("chunk")), "HeaderError", "C1"),
    ("c1_chunktopk_chunk_zero", _relayout(gap_base, _params(chunk=0)), "HeaderError", "C1"),
    ("c1_chunktopk_k_zero", _relayout(gap_base, _params(k=0)), "HeaderError", "C1"),
    ("c1_chunktopk_bad_index_coding", _relayout(gap_base, _params(index_coding="delta")), "HeaderError", "C1"),
    (
        "c3_chunktopk_widths_long",
        _relayout(gap_base, fn_blobs=_set_section("index_widths", bytes(4))),
        "SizeMismatchError",
        "C3",
    ),
    (
        "c3_chunktopk_values_short",
        _relayout(gap_base, fn_blobs=_set_section("values", bytes(20))),
        "SizeMismatchError",
        "C3",
    ),
    ("c2_chunktopk_values_missing", _drop(gap_base, "values"), "SizeMismatchError", "C2"),
    (
        "c2_chunktopk_packed_with_widths",
        _relayout(gap_base, _params(index_coding="packed", index_bytes=2)),
        "SizeMismatchError",
        "C2",
    ),
    # index rules
    ("ck2_chunktopk_width_not_minimal", _not_minimal, "PayloadValueError", "CK2"),
    ("ck2_chunktopk_width_too_large", _width_too_large, "PayloadValueError", "CK2"),
    ("ck2_chunktopk_index_bytes_vs_widths", _index_bytes_mismatch, "PayloadValueError", "CK2"),
    ("ck2_chunktopk_pad_bits", _gap_pad_bits, "PayloadValueError", "CK2"),
    ("ck2_chunktopk_packed_pad_bits", _packed_pad_bits, "PayloadValueError", "CK2"),
    ("ck3_chunktopk_index_out_of_range", _out_of_range, "PayloadValueError", "CK3"),
    ("ck3_chunktopk_packed_short_chunk", _packed([[1, 3], [0, 1], [0, 2]]), "PayloadValueError", "CK3"),
    ("ck3_chunktopk_packed_not_increasing", _packed([[3, 1], [0, 1], [0, 1]]), "PayloadValueError", "CK3"),
    ("ck3_chunktopk_packed_duplicate", _packed([[1, 3], [1, 1], [0, 1]]), "PayloadValueError", "CK3"),
    ("ck4_chunktopk_nan_value", _nan_value, "PayloadValueError", "CK4"),
    # hybrid declarations
    ("h1_chunktopk_values_composite", _nested(codec="chunktopk"), "HeaderError", "H1"),
    ("c0_chunktopk_values_version", _nested(version=2), "UnsupportedVersionError", "C0"),
]
