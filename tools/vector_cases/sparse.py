"""Golden vectors of the sparse and low-rank codecs: topk, threshold, randomk, powersgd, and hybrids.

Valid names start with the codec id; invalid names with the rule they break (``t2_``, ``th4_``,
``r1_``, ``p1_``, ``h1_``, or a format/codec rule such as ``c3_`` and ``u1_``). Rules are those of
specs/codecs/topk.md (T), threshold.md (TH), randomk.md (R), powersgd.md (P) and hybrid.md (H).

PowerSGD payloads that carry factors are built by hand with small dyadic (or integer) factors:
the encoder's floating-point products depend on the platform's summation order, but the decoder's
P Q^T of such factors is exact everywhere, so the committed outputs never drift.

The pure-Python :func:`pack_gaps` / :func:`unpack_gaps` are a second, independent implementation
of the delta index coding (specs/codecs/topk.md section 3); the tests compare them with the kernels.
"""

from __future__ import annotations

import functools
import math
import struct
from typing import Any

import numpy as np

from gcodec.arrays import BFLOAT16

from . import bits_array, edit, encode, header_of, relayout, section_blobs, uniform_values

F32, F16, F64 = np.float32, np.float16, np.float64
GAP_BLOCK = 64


# --------------------------------------------------------------------------------------------
# reference index coding (pure Python)


def pack_gaps(indices: list[int]) -> tuple[bytes, bytes]:
    """(widths, packed bytes) of strictly increasing ``indices``, exactly as the spec describes."""
    gaps = [i - (indices[j - 1] if j else -1) - 1 for j, i in enumerate(indices)]
    widths = bytearray()
    out = bytearray()
    for b in range(0, len(gaps), GAP_BLOCK):
        block = gaps[b : b + GAP_BLOCK]
        w = max(block).bit_length()
        widths.append(w)
        acc = 0
        for j, d in enumerate(block):
            acc |= d << (j * w)  # gap j of the block occupies bits j*w .. j*w+w-1, LSB first
        out += acc.to_bytes((len(block) * w + 7) // 8, "little")
    return bytes(widths), bytes(out)


def unpack_gaps(widths: bytes, packed: bytes, k: int) -> list[int]:
    """The indices a (widths, packed) pair encodes (no validation)."""
    out: list[int] = []
    pos = 0
    prev = -1
    for b, w in enumerate(widths):
        n = min(GAP_BLOCK, k - b * GAP_BLOCK)
        nbytes = (n * w + 7) // 8
        acc = int.from_bytes(packed[pos : pos + nbytes], "little")
        pos += nbytes
        for j in range(n):
            d = (acc >> (j * w)) & ((1 << w) - 1)
            prev = prev + 1 + d
            out.append(prev)
    return out


# --------------------------------------------------------------------------------------------
# inputs

#: The worked example of specs/codecs/topk.md: k=3 keeps -3 (index 1) and the first two of the
#: three 2.0 ties (indices 3 and 4); gaps 1, 1, 0 pack at width 1 into the byte 0x03.
TOPK_EXAMPLE = np.array([0.5, -3.0, 0.0, 2.0, -2.0, 1.0, 2.0, 0.25], F32)


def ties_input() -> np.ndarray:
    """300 values from {-2, -1, 0, 1, 2}: heavy ties at every magnitude."""
    u = uniform_values(300, 41, F32)
    return np.round(u * 2).astype(F32)


def heavy_input(n: int, seed: int, dtype: Any = F32) -> np.ndarray:
    """Heavy-tailed values: uniform values cubed (exact in float64, then one rounding)."""
    u = uniform_values(n, seed, F64)
    return (u * u * u * 8).astype(dtype)


def _enc(codec: str, x: Any, **kw: Any):
    return lambda: (encode(codec, x, **kw), x)


def _enc_step(codec: str, x: Any, step: int, **kw: Any):
    import gcodec

    return lambda: (bytes(gcodec.get_codec(codec, **kw).encode(x, step=step)), x)


# --------------------------------------------------------------------------------------------
# hand-built PowerSGD payloads (exact factors)


def _powersgd_payload(shape: tuple[int, ...], p: np.ndarray, q: np.ndarray, dtype: str = "float32") -> bytes:
    """A lowrank payload with raw float32 factors P (m x r), Q (n x r), laid out as a writer does."""
    from . import assemble

    r = p.shape[1]
    hdr = {
        "tensors": [
            {
                "codec": "powersgd",
                "version": 1,
                "dtype": dtype,
                "shape": list(shape),
                "params": {"mode": "lowrank", "p": None, "q": None, "rank": r},
                "sections": [["p", "f4", 0, 0], ["q", "f4", 0, 0]],
            }
        ],
        "data_length": 0,
    }
    blobs = [[p.astype("<f4").tobytes(), q.astype("<f4").tobytes()]]
    hdr, data = relayout(hdr, blobs)
    return assemble(hdr, data)


def _dyadic(rows: int, r: int, seed: int) -> np.ndarray:
    """Factors with values k/4, |k| <= 8: every product and every sum of up to 8 of them is exact."""
    u = uniform_values(rows * r, seed, F64)
    return (np.round(u * 8) / 4).reshape(rows, r).astype(F32)


@functools.cache
def psgd_rank2_base() -> bytes:
    return _powersgd_payload((6, 5), _dyadic(6, 2, 1), _dyadic(5, 2, 2))


def _psgd_rank2():
    return psgd_rank2_base(), None


def _psgd_rank3_3d():
    return _powersgd_payload((4, 3, 2), _dyadic(4, 3, 3), _dyadic(6, 3, 4)), None


def _psgd_rank1_f64():
    return _powersgd_payload((3, 7), _dyadic(3, 1, 5), _dyadic(7, 1, 6), "float64"), None


def _psgd_inexact(dtype: str):
    """Factors whose products and sums round (24-bit significands): the decoded bits depend on
    the order of specs/codecs/powersgd.md §6 (from +0, c = 0..r-1, each product rounded, no FMA)."""

    def make():
        p = uniform_values(8 * 6, 31, F32).reshape(8, 6)
        q = uniform_values(9 * 6, 32, F32).reshape(9, 6) * np.float32(3)
        return _powersgd_payload((8, 9), p, q, dtype), None

    return make


def _psgd_factors_fp16():
    """Nested fp16 factors (dyadic values are exact in binary16)."""
    from . import assemble

    p, q = _dyadic(5, 2, 7), _dyadic(4, 2, 8)
    nested = {"codec": "fp16", "params": {}, "version": 1}
    hdr = {
        "tensors": [
            {
                "codec": "powersgd",
                "version": 1,
                "dtype": "float32",
                "shape": [5, 4],
                "params": {"mode": "lowrank", "p": nested, "q": nested, "rank": 2},
                "sections": [["p.data", "u2", 0, 0], ["q.data", "u2", 0, 0]],
            }
        ],
        "data_length": 0,
    }
    blobs = [[p.astype("<f2").tobytes(), q.astype("<f2").tobytes()]]
    hdr, data = relayout(hdr, blobs)
    return assemble(hdr, data), None


def _psgd_factors_uniform8():
    """Nested uniform 8-bit factors whose group absmax is 127: scale 1, integer factors, exact P Q^T.

    The nested sections come from the uniform codec itself (its header fields are its own).
    """
    import gcodec
    from gcodec.codecs import compose
    from gcodec.codecs.base import EncodeContext
    from gcodec.format.container import PendingTensor, write_payload

    p = np.round(uniform_values(8 * 2, 9, F64) * 100)
    q = np.round(uniform_values(6 * 2, 10, F64) * 100)
    p[0], q[0] = 127, -127  # one group each (group_size 64 > 16 and 12 values)
    uni = gcodec.get_codec("uniform", bits=8, group_size=64)
    params: dict[str, Any] = {"mode": "lowrank", "rank": 2}
    sections = []
    fills = []
    for role, f in (("p", p), ("q", q)):
        wire, secs, fill = compose.plan_nested(role, uni, f.astype(F32), EncodeContext())
        params[role] = wire
        sections += secs
        fills.append(fill)

    def fill_all(views):
        for fn in fills:
            fn(views)

    pend = PendingTensor("powersgd", 1, "float32", (8, 6), params, sections, fill_all)
    return bytes(write_payload([pend])), None


# --------------------------------------------------------------------------------------------
# valid cases


def _randomk_max_seed():
    x = heavy_input(100, 12)
    return _enc_step("randomk", x, (1 << 64) - 1, k=7, seed=(1 << 64) - 1)()


VALID = [
    # topk
    ("topk_example", _enc("topk", TOPK_EXAMPLE, k=3)),
    ("topk_example_raw", _enc("topk", TOPK_EXAMPLE, k=3, index_coding="raw")),
    ("topk_f32_ratio", _enc("topk", heavy_input(1000, 1), ratio=0.05)),
    ("topk_f32_multiblock", _enc("topk", heavy_input(5000, 2), k=200)),
    ("topk_f64", _enc("topk", heavy_input(300, 3, F64), k=20)),
    ("topk_f16", _enc("topk", heavy_input(300, 4, F16), k=20)),
    ("topk_bf16", _enc("topk", heavy_input(300, 5, BFLOAT16), k=20)),
    ("topk_ties", _enc("topk", ties_input(), k=100)),
    ("topk_all_zeros", _enc("topk", np.zeros(50, F32), k=5)),
    ("topk_k0", _enc("topk", heavy_input(40, 6), k=0)),
    ("topk_kn", _enc("topk", heavy_input(40, 7), k=40)),
    ("topk_signed_zero_ties", _enc("topk", bits_array([0x80000000, 0x00000000, 0x80000000], F32), k=2)),
    ("topk_2d", _enc("topk", heavy_input(128, 8).reshape(16, 8), ratio=0.1)),
    ("topk_values_uniform8", _enc("topk", heavy_input(2000, 9), ratio=0.05, values={"id": "uniform", "bits": 8})),
    ("topk_values_fp16", _enc("topk", heavy_input(500, 10), k=30, values={"id": "fp16"})),
    # threshold
    ("threshold_example", _enc("threshold", TOPK_EXAMPLE, threshold=2.0)),
    ("threshold_f32", _enc("threshold", heavy_input(3000, 11), threshold=4.0)),
    ("threshold_zero_keeps_all", _enc("threshold", heavy_input(20, 13), threshold=0.0)),
    ("threshold_none_kept", _enc("threshold", heavy_input(20, 14), threshold=100.0)),
    ("threshold_raw", _enc("threshold", heavy_input(200, 15), threshold=2.0, index_coding="raw")),
    ("threshold_bf16", _enc("threshold", heavy_input(200, 16, BFLOAT16), threshold=1.0)),
    ("threshold_between_floats", _enc("threshold", np.array([0.1, -0.1, 0.2, 0.05], F32), threshold=0.1)),
    ("threshold_values_bf16", _enc("threshold", heavy_input(500, 17), threshold=3.0, values={"id": "bf16"})),
    # randomk
    ("randomk_example", _enc_step("randomk", TOPK_EXAMPLE, 0, k=3, seed=1)),
    ("randomk_f32", _enc_step("randomk", heavy_input(1000, 18), 5, ratio=0.05, seed=42)),
    ("randomk_f64", _enc_step("randomk", heavy_input(300, 19, F64), 1, k=30, seed=7)),
    ("randomk_f16", _enc_step("randomk", heavy_input(300, 20, F16), 2, k=30, seed=7)),
    ("randomk_k0", _enc_step("randomk", heavy_input(30, 21), 0, k=0)),
    ("randomk_kn", _enc_step("randomk", heavy_input(30, 22), 3, k=30)),
    ("randomk_max_seed_stream", _randomk_max_seed),
    ("randomk_values_fp16", _enc_step("randomk", heavy_input(400, 23), 9, k=40, seed=3, values={"id": "fp16"})),
    # powersgd
    ("powersgd_rank2", _psgd_rank2),
    ("powersgd_rank3_3d", _psgd_rank3_3d),
    ("powersgd_rank1_f64", _psgd_rank1_f64),
    ("powersgd_inexact_rank6", _psgd_inexact("float32")),
    ("powersgd_inexact_rank6_f16", _psgd_inexact("float16")),
    ("powersgd_inexact_rank6_f64", _psgd_inexact("float64")),
    ("powersgd_factors_fp16", _psgd_factors_fp16),
    ("powersgd_factors_uniform8", _psgd_factors_uniform8),
    ("powersgd_passthrough_fp32", _enc("powersgd", heavy_input(10, 24), rank=2)),
    ("powersgd_passthrough_fp16", _enc("powersgd", heavy_input(12, 25).reshape(3, 4), rank=2, passthrough="fp16")),
    ("powersgd_passthrough_scalar", _enc("powersgd", np.array(1.5, F32))),
]


# --------------------------------------------------------------------------------------------
# invalid cases: helpers


@functools.cache
def topk_base() -> bytes:
    return encode("topk", TOPK_EXAMPLE, k=3)


@functools.cache
def topk_raw_base() -> bytes:
    return encode("topk", TOPK_EXAMPLE, k=3, index_coding="raw")


@functools.cache
def topk_multi_base() -> bytes:
    """k=70 of 1000: two index blocks (64 + 6 gaps)."""
    return encode("topk", heavy_input(1000, 30), k=70)


@functools.cache
def topk_uniform_base() -> bytes:
    return encode("topk", heavy_input(200, 31), k=20, values={"id": "uniform", "bits": 8})


@functools.cache
def threshold_base() -> bytes:
    return encode("threshold", TOPK_EXAMPLE, threshold=2.0)


@functools.cache
def randomk_base() -> bytes:
    import gcodec

    return bytes(gcodec.get_codec("randomk", k=3, seed=1).encode(TOPK_EXAMPLE, step=0))


@functools.cache
def psgd_fp32_base() -> bytes:
    return encode("powersgd", heavy_input(10, 24), rank=2)


def _relayout(base, fn_header=None, fn_blobs=None):
    """Edit the header and/or section bytes of ``base()``, lay the sections out again, recompute CRCs."""

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


def _set_section(name: str, data: bytes):
    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        blobs[names.index(name)] = data

    return f


def _drop(base, name: str):
    def make():
        p = base()
        h = header_of(p)
        blobs = section_blobs(p)
        names = [s[0] for s in h["tensors"][0]["sections"]]
        i = names.index(name)
        del h["tensors"][0]["sections"][i]
        del blobs[0][i]
        h, data = relayout(h, blobs)
        return edit(p, header=h, data=data)

    return make


def _indices(base, new_indices: list[int], *, width_of_block0: int | None = None):
    """Replace a delta-coded payload's indices (same k), re-packing widths and bytes."""

    def make():
        p = base()
        h = header_of(p)
        t = h["tensors"][0]
        blobs = section_blobs(p)
        widths, packed = pack_gaps(new_indices)
        if width_of_block0 is not None:  # re-pack block 0 at a wider, non-minimal width
            k0 = min(GAP_BLOCK, len(new_indices))
            gaps = [i - (new_indices[j - 1] if j else -1) - 1 for j, i in enumerate(new_indices[:k0])]
            acc = sum(d << (j * width_of_block0) for j, d in enumerate(gaps))
            first = acc.to_bytes((k0 * width_of_block0 + 7) // 8, "little")
            rest = pack_gaps(new_indices)[1][(k0 * widths[0] + 7) // 8 :]
            widths = bytes([width_of_block0]) + widths[1:]
            packed = first + rest
        names = [s[0] for s in t["sections"]]
        blobs[0][names.index("index_widths")] = widths
        blobs[0][names.index("indices")] = packed
        t["params"]["index_bytes"] = len(packed)
        h, data = relayout(h, blobs)
        return edit(p, header=h, data=data)

    return make


def _topk_indices() -> list[int]:
    h = header_of(topk_multi_base())
    blobs = section_blobs(topk_multi_base())[0]
    return unpack_gaps(blobs[0], blobs[1], h["tensors"][0]["params"]["k"])


def _multi_out_of_range():
    idx = _topk_indices()
    idx[-1] = 1000  # numel is 1000
    return _indices(topk_multi_base, idx)()


def _multi_not_minimal():
    return _indices(topk_multi_base, _topk_indices(), width_of_block0=12)()


def _pad_bits():
    """k=3 at width 1 uses 3 bits of the one index byte: set bit 7."""

    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        i = names.index("indices")
        blobs[i] = bytes([blobs[i][0] | 0x80])

    return _relayout(topk_base, fn_blobs=f)()


def _width_too_large():
    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        blobs[names.index("index_widths")] = bytes([9])  # numel 8 needs at most 3 bits
        blobs[names.index("indices")] = bytes(math.ceil(3 * 9 / 8))
        t["params"]["index_bytes"] = math.ceil(3 * 9 / 8)

    return _relayout(topk_base, fn_blobs=f)()


def _index_bytes_mismatch():
    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        blobs[names.index("indices")] += b"\x00"
        t["params"]["index_bytes"] += 1

    return _relayout(topk_base, fn_blobs=f)()


def _raw_indices(values: list[int]):
    return _relayout(topk_raw_base, fn_blobs=_set_section("indices", struct.pack("<3I", *values)))


def _nan_value():
    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        i = names.index("values")
        v = bytearray(blobs[i])
        v[0:4] = struct.pack("<I", 0x7FC00000)
        blobs[i] = bytes(v)

    return _relayout(topk_base, fn_blobs=f)()


def _nested(**changes):
    def f(t):
        t["params"]["values"].update(changes)

    return _relayout(topk_uniform_base, fn_header=f)


def _nested_params(**changes):
    def f(t):
        t["params"]["values"]["params"].update(changes)

    return _relayout(topk_uniform_base, fn_header=f)


def _nested_extra_key():
    def f(t):
        t["params"]["values"]["x_more"] = 1

    return _relayout(topk_uniform_base, fn_header=f)()


def _nested_nan_scale():
    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        blobs[names.index("values.scales")] = struct.pack("<I", 0x7FC00000)

    return _relayout(topk_uniform_base, fn_blobs=f)()


def _threshold_value_below():
    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        i = names.index("values")
        v = bytearray(blobs[i])
        v[0:4] = struct.pack("<f", 1.5)  # below the threshold 2.0
        blobs[i] = bytes(v)

    return _relayout(threshold_base, fn_blobs=f)()


def _randomk_nan_value():
    def f(blobs, t):
        v = bytearray(blobs[0])
        v[4:8] = struct.pack("<I", 0x7FC00000)
        blobs[0] = bytes(v)

    return _relayout(randomk_base, fn_blobs=f)()


def _psgd_set(**changes):
    def f(t):
        t["params"].update(changes)

    return _relayout(psgd_rank2_base, fn_header=f)


def _psgd_section_size(name: str, delta_floats: int):
    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        i = names.index(name)
        blobs[i] = (
            blobs[i][: len(blobs[i]) + 4 * delta_floats] if delta_floats < 0 else blobs[i] + bytes(4 * delta_floats)
        )

    return _relayout(psgd_rank2_base, fn_blobs=f)


def _psgd_nan():
    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        i = names.index("q")
        v = bytearray(blobs[i])
        v[4:8] = struct.pack("<I", 0x7F800000)  # +inf
        blobs[i] = bytes(v)

    return _relayout(psgd_rank2_base, fn_blobs=f)()


def _psgd_shape(shape: list[int]):
    def f(t):
        t["shape"] = shape

    return _relayout(psgd_rank2_base, fn_header=f)


def _psgd_factor_product_overflow():
    """Finite factors of 1e30: rank * max|P| * max|Q| = 2e60 > 2**127 (P Q^T would be infinite)."""

    def f(blobs, t):
        names = [s[0] for s in t["sections"]]
        for role in ("p", "q"):
            i = names.index(role)
            blobs[i] = np.full(len(blobs[i]) // 4, 1e30, "<f4").tobytes()

    return _relayout(psgd_rank2_base, fn_blobs=f)()


def _psgd_passthrough_nan():
    def f(blobs, t):
        v = bytearray(blobs[0])
        v[8:12] = struct.pack("<I", 0x7FC00000)
        blobs[0] = bytes(v)

    return _relayout(psgd_fp32_base, fn_blobs=f)()


INVALID = [
    # topk header rules
    ("t1_topk_k_exceeds_numel", _relayout(topk_base, _params(k=9)), "HeaderError", "T1"),
    ("t1_topk_raw_index_bytes", _relayout(topk_raw_base, _params(index_bytes=8)), "HeaderError", "T1"),
    ("c1_topk_missing_k", _relayout(topk_base, lambda t: t["params"].pop("k")), "HeaderError", "C1"),
    ("c1_topk_bad_index_coding", _relayout(topk_base, _params(index_coding="elias")), "HeaderError", "C1"),
    (
        "c3_topk_values_short",
        _relayout(topk_base, fn_blobs=_set_section("values", bytes(8))),
        "SizeMismatchError",
        "C3",
    ),
    (
        "c3_topk_widths_long",
        _relayout(topk_base, fn_blobs=_set_section("index_widths", bytes(2))),
        "SizeMismatchError",
        "C3",
    ),
    (
        "c3_topk_indices_vs_index_bytes",
        _relayout(topk_base, fn_blobs=_set_section("indices", bytes(2))),
        "SizeMismatchError",
        "C3",
    ),
    ("c2_topk_values_missing", _drop(topk_base, "values"), "SizeMismatchError", "C2"),
    # topk value rules
    ("t2_topk_width_not_minimal", _multi_not_minimal, "PayloadValueError", "T2"),
    ("t2_topk_width_too_large", _width_too_large, "PayloadValueError", "T2"),
    ("t2_topk_index_bytes_vs_widths", _index_bytes_mismatch, "PayloadValueError", "T2"),
    ("t2_topk_pad_bits", _pad_bits, "PayloadValueError", "T2"),
    ("t3_topk_index_out_of_range", _multi_out_of_range, "PayloadValueError", "T3"),
    ("t3_topk_raw_not_increasing", _raw_indices([3, 1, 4]), "PayloadValueError", "T3"),
    ("t3_topk_raw_duplicate", _raw_indices([1, 3, 3]), "PayloadValueError", "T3"),
    ("t3_topk_raw_out_of_range", _raw_indices([1, 3, 8]), "PayloadValueError", "T3"),
    ("t4_topk_nan_value", _nan_value, "PayloadValueError", "T4"),
    # hybrid declarations
    ("h1_topk_values_extra_key", _nested_extra_key, "HeaderError", "H1"),
    ("h1_topk_values_unknown_codec", _nested(codec="nope"), "UnknownCodecError", "H1"),
    ("h1_topk_values_composite", _nested(codec="topk"), "HeaderError", "H1"),
    ("h1_topk_values_bad_params", _nested_params(bits=3), "HeaderError", "H1"),
    ("h1_topk_values_not_a_map", _relayout(topk_base, _params(values="uniform")), "HeaderError", "H1"),
    ("c0_topk_values_version", _nested(version=2), "UnsupportedVersionError", "C0"),
    ("u1_topk_values_nan_scale", _nested_nan_scale, "PayloadValueError", "U1"),
    # threshold
    ("th1_threshold_k_exceeds_numel", _relayout(threshold_base, _params(k=9)), "HeaderError", "TH1"),
    ("c1_threshold_negative", _relayout(threshold_base, _params(threshold=-1.0)), "HeaderError", "C1"),
    ("th4_threshold_value_below", _threshold_value_below, "PayloadValueError", "TH4"),
    # randomk
    ("r1_randomk_k_exceeds_numel", _relayout(randomk_base, _params(k=9)), "HeaderError", "R1"),
    ("c1_randomk_stream_missing", _relayout(randomk_base, lambda t: t["params"].pop("stream")), "HeaderError", "C1"),
    (
        "c3_randomk_values_size",
        _relayout(randomk_base, fn_blobs=_set_section("values", bytes(16))),
        "SizeMismatchError",
        "C3",
    ),
    # powersgd
    ("p1_powersgd_rank_exceeds_min_dim", _psgd_set(rank=6), "HeaderError", "P1"),
    ("p1_powersgd_rank_zero", _psgd_set(rank=0), "HeaderError", "P1"),
    ("p1_powersgd_lowrank_1d", _psgd_shape([30]), "HeaderError", "P1"),
    ("p2_powersgd_passthrough_with_rank", _relayout(psgd_fp32_base, _params(rank=2)), "HeaderError", "P2"),
    ("c1_powersgd_bad_mode", _psgd_set(mode="bf16"), "HeaderError", "C1"),
    ("c3_powersgd_p_short", _psgd_section_size("p", -1), "SizeMismatchError", "C3"),
    ("c3_powersgd_q_long", _psgd_section_size("q", 2), "SizeMismatchError", "C3"),
    ("c3_powersgd_shape_vs_factors", _psgd_shape([5, 6]), "SizeMismatchError", "C3"),
    ("p3_powersgd_infinite_factor", _psgd_nan, "PayloadValueError", "P3"),
    ("p3_powersgd_passthrough_nan", _psgd_passthrough_nan, "PayloadValueError", "P3"),
    ("p4_powersgd_factor_product_overflow", _psgd_factor_product_overflow, "PayloadValueError", "P4"),
]
