"""Golden vectors of format v1 (rules F1-F15, C0-C3) and the codecs fp16, bf16 and uniform (U1-U3).

Valid names start with the codec id (``fp16_``, ``bf16_``, ``uniform_``) or with ``bundle_`` /
``format_``; invalid names start with the rule they break (``f07_``, ``c3_``, ``u2_``).
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import msgpack
import numpy as np

from gcodec.arrays import BFLOAT16
from gcodec.format.header import pack_canonical
from gcodec.limits import MAX_NESTING_CAP

from . import assemble, bits_array, bundle, edit, encode, header_of, relayout, section_blobs, split, uniform_values

F32, F16, F64 = np.float32, np.float16, np.float64
DTYPES = {"f32": F32, "f16": F16, "bf16": BFLOAT16, "f64": F64}


# --------------------------------------------------------------------------------------------
# inputs

#: The worked example of specs/format.md and specs/codecs/fp16.md.
EXAMPLE = np.array([1.0, -2.5, 0.1], dtype=F32)

#: float32 bit patterns that exercise binary16 rounding: signed zeros, the largest finite value
#: and the overflow threshold, subnormals and ties, infinities and NaNs.
FP16_SPECIAL_BITS = [
    0x00000000,  # +0
    0x80000000,  # -0
    0x3F800000,  # 1
    0xBF800000,  # -1
    0x477FE000,  # 65504, the largest binary16
    0x477FEFFF,  # 65519.996: rounds down to 65504
    0x477FF000,  # 65520: halfway to 2**16, rounds to +inf
    0xC97423F0,  # -999999: -inf
    0x38800000,  # 2**-14: smallest normal binary16 (0x0400)
    0x33800000,  # 2**-24: smallest subnormal (0x0001)
    0x33000000,  # 2**-25: tie between 0 and 2**-24: even, +0
    0x33C00000,  # 3 * 2**-25: tie between 1 and 2 units of 2**-24: even, 0x0002
    0x32800000,  # 2**-26: +0
    0x387FC000,  # 2**-14 - 2**-24: the largest subnormal (0x03FF)
    0x387FE000,  # 2**-14 - 2**-25: tie, rounds up to the smallest normal (0x0400)
    0x3F801000,  # 1 + 2**-11: tie, even, 1.0
    0x3F803000,  # 1 + 3 * 2**-11: tie, even, 1 + 2**-9
    0x3DCCCCCD,  # 0.1
    0x3EAAAAAB,  # 1/3
    0x7F800000,  # +inf
    0xFF800000,  # -inf
    0x7FC00000,  # NaN: 0x7E00
    0xFFC00000,  # -NaN: 0xFE00
    0x7F800001,  # signalling NaN: quiet 0x7E00
]

#: float32 bit patterns that exercise bfloat16 rounding.
BF16_SPECIAL_BITS = [
    0x00000000,  # +0
    0x80000000,  # -0
    0x3F800000,  # 1
    0xBF800000,  # -1
    0x7F7F0000,  # the largest bfloat16
    0x7F7F7FFF,  # rounds down to it
    0x7F7F8000,  # tie: even, +inf
    0x7F7FFFFF,  # the largest float32: +inf
    0x00000001,  # the smallest float32 subnormal: +0
    0x00008000,  # tie: even, +0
    0x00018000,  # tie: even, 0x0002
    0x007FFFFF,  # the largest float32 subnormal: rounds up to 0x0080
    0x3F808000,  # 1 + 2**-8: tie, even, 1.0
    0x3F818000,  # 1 + 3 * 2**-8: tie, even, 1 + 2**-6
    0x3DCCCCCD,  # 0.1
    0x3EAAAAAB,  # 1/3
    0x7F800000,  # +inf
    0xFF800000,  # -inf
    0x7FC00000,  # NaN: 0x7FC0
    0xFFC00000,  # -NaN: 0xFFC0
    0x7F800001,  # signalling NaN: quiet 0x7FC0
]

#: float64 inputs are rounded to float32 first: 1 + 2**-11 + 2**-40 becomes 1 + 2**-11 and then
#: (a binary16 tie) 1.0, although it lies above the tie in float64. Likewise for bfloat16 with
#: 1 + 2**-8 + 2**-40. Values beyond float32's range become infinities, tiny ones zeros.
F64_EXTRA = [1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-8 + 2.0**-40, 1e39, -1e39, 1e-50, 0.1, float("nan")]


def specials(bits: list[int]) -> np.ndarray:
    return bits_array(bits, F32)


def cast_inputs(dt: str, n: int, seed: int) -> np.ndarray:
    x = uniform_values(n, seed, DTYPES[dt], scale_exp=2)
    if dt == "f64":
        x = np.concatenate([x, np.array(F64_EXTRA, F64)])
    return x


def tie_input() -> np.ndarray:
    """Group 0 has scale exactly 1 (absmax 127 with 8 bits), so its quotients are the values: ties to even."""
    g0 = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]
    g1 = [3.0, -1.0, 0.75, -0.25, 2.0, 0.0, -3.0, 1.0]
    return np.array(g0 + g1, dtype=F32)


def zero_groups_input() -> np.ndarray:
    """An all-zero group (scale 0), a group of -0.0, and a group whose scale underflows to 0."""
    tiny = float(bits_array([0x00000001], F32)[0])  # 2**-149
    return np.array([0.0] * 4 + [-0.0] * 4 + [tiny, -tiny, 0.0, tiny] + [1.0, -0.5, 0.25, 0.0], dtype=F32)


def subnormal_scales_input() -> np.ndarray:
    """Subnormal scales: 190 * 2**-149 / 127 rounds to 2**-149, the quotient 190 is clamped to 127."""
    u = float(bits_array([0x00000001], F32)[0])
    return np.array([190 * u, -50 * u, u, 0.0, 3e-39, -1e-39, 2e-39, 0.0], dtype=F32)


def outlier_input() -> np.ndarray:
    x = uniform_values(130, 21, F32, scale_exp=-4)
    x[70] = 1000.0  # coarsens group 1 only
    return x


# --------------------------------------------------------------------------------------------
# valid cases


def _enc(codec: str, x: np.ndarray, **kw: Any):
    return lambda: (encode(codec, x, **kw), x)


def _cast_cases(cid: str, special_bits: list[int]) -> list[tuple[str, Any]]:
    return [
        (f"{cid}_f32_example", _enc(cid, EXAMPLE)),
        (f"{cid}_f32_specials", _enc(cid, specials(special_bits))),
        (f"{cid}_f32_odd", _enc(cid, cast_inputs("f32", 7, 1))),
        (f"{cid}_f16_input", _enc(cid, cast_inputs("f16", 9, 2))),
        (f"{cid}_bf16_input", _enc(cid, cast_inputs("bf16", 9, 3))),
        (f"{cid}_f64_input", _enc(cid, cast_inputs("f64", 5, 4))),
        (f"{cid}_scalar", _enc(cid, np.array(-3.25, F32))),
        (f"{cid}_scalar_f64", _enc(cid, np.array(1 / 3, F64))),
        (f"{cid}_empty", _enc(cid, np.zeros(0, F32))),
        (f"{cid}_empty_2d_bf16", _enc(cid, np.zeros((2, 0), BFLOAT16))),
        (f"{cid}_3x5", _enc(cid, cast_inputs("f32", 15, 5).reshape(3, 5))),
        (f"{cid}_2x3x2_f16", _enc(cid, cast_inputs("f16", 12, 6).reshape(2, 3, 2))),
    ]


def _u(name: str, x: np.ndarray, bits: int, group_size: int, **kw: Any) -> tuple[str, Any]:
    return (name, _enc("uniform", x, bits=bits, group_size=group_size, rounding="nearest", **kw))


UNIFORM_VALID = [
    _u("uniform_b4_g4_example", np.array([0.5, -1.0, 0.25, 0.0, 3.0, -0.75], F32), 4, 4),
    _u("uniform_b8_g64_n100", uniform_values(100, 11, F32), 8, 64),
    _u("uniform_b4_g64_n100", uniform_values(100, 12, F32), 4, 64),
    _u("uniform_b2_g64_n100", uniform_values(100, 13, F32), 2, 64),
    _u("uniform_b8_g64_n64", uniform_values(64, 14, F32), 8, 64),
    _u("uniform_b4_g3_n10", uniform_values(10, 15, F32), 4, 3),  # groups start mid-byte
    _u("uniform_b2_g5_n11", uniform_values(11, 16, F32), 2, 5),  # 22 bits: 2 unused bits
    _u("uniform_b2_g2_n7", uniform_values(7, 17, F32), 2, 2),
    _u("uniform_b4_g1_n5", uniform_values(5, 18, F32), 4, 1),
    _u("uniform_b8_g8_ties", tie_input(), 8, 8),
    _u("uniform_b4_g4_zero_groups", zero_groups_input(), 4, 4),
    _u("uniform_b8_g64_outlier", outlier_input(), 8, 64),
    _u("uniform_b8_g4_subnormal_scales", subnormal_scales_input(), 8, 4),
    _u("uniform_b8_g16_f16_input", uniform_values(40, 19, F16), 8, 16),
    _u("uniform_b4_g16_bf16_input", uniform_values(40, 20, BFLOAT16), 4, 16),
    _u("uniform_b8_g16_f64_input", uniform_values(40, 22, F64), 8, 16),
    _u("uniform_b2_g8_f64_input", uniform_values(21, 23, F64), 2, 8),
    _u("uniform_b8_scalar", np.array(-0.3, F32), 8, 64),
    _u("uniform_b4_scalar_bf16", np.array(1.5, BFLOAT16), 4, 64),
    _u("uniform_b8_empty", np.zeros(0, F32), 8, 64),
    _u("uniform_b2_empty_3d_f64", np.zeros((0, 3, 4), F64), 2, 64),
    _u("uniform_b4_g8_4x6", uniform_values(24, 24, F32).reshape(4, 6), 4, 8),
]


def bundle_inputs() -> dict[str, np.ndarray]:
    return {
        "layer1.weight": uniform_values(10, 31, F32, scale_exp=-3).reshape(2, 5),
        "layer1.bias": uniform_values(3, 32, F32, scale_exp=-6),
        "scale": np.array(0.7, F64),
    }


BUNDLE_CODECS = {"layer1.weight": {"id": "uniform", "bits": 4, "group_size": 4}, "layer1.bias": "fp16", "scale": "bf16"}


def _bundle_mixed():
    x = bundle_inputs()
    return bundle(x, BUNDLE_CODECS), x


def _bundle_example():
    """The worked bundle example of specs/format.md."""
    x = {"w": np.array([1.0, -2.0], F32), "b": np.array([0.5], F32)}
    return bundle(x, {"w": "fp16", "b": "bf16"}), x


def _bundle_single():
    x = {"grad": cast_inputs("f32", 4, 33)}
    return bundle(x, {"grad": "bf16"}), x


def _bundle_empty_members():
    x = {"a": np.zeros(0, F32), "b": np.array(2.0, F16), "c": np.zeros((3, 0), BFLOAT16)}
    return bundle(x, {"a": "fp16", "b": {"id": "uniform", "bits": 2, "group_size": 64}, "c": "bf16"}), x


def _no_checksum():
    x = cast_inputs("f32", 5, 41)
    return encode("fp16", x, checksum=False), x


def _uniform_no_checksum():
    x = uniform_values(9, 42, F32)
    return encode("uniform", x, checksum=False, bits=4, group_size=4, rounding="nearest"), x


META = {"rank": "3", "step": "1200", "Zone": "eu", "ünï": "✓"}


def _meta():
    x = uniform_values(6, 43, F32)
    return encode("uniform", x, meta=META, bits=8, group_size=64, rounding="nearest"), x


def _bundle_meta_no_checksum():
    x = {"w": uniform_values(3, 44, F32)}
    return bundle(x, {"w": "fp16"}, meta={"job": "vectors"}, checksum=False), x


def _minor1(h: dict[str, Any]) -> None:
    h["x_future"] = {"hint": [1, 2, 3]}  # an unknown optional top-level key
    h["tensors"][0]["x_note"] = "unknown per-tensor key"


def _format_minor1():
    """A format 1.1 payload with unknown optional keys: a 1.0 reader ignores them and decodes."""
    p, x = _enc("fp16", EXAMPLE)()
    return edit(p, header=_minor1, minor=1), x


def _uniform_minor1_nearest_with_stream():
    """A nearest uniform payload with a ``stream`` key under minor 1: an unknown parameter there
    (uniform.md §9.1), ignored by a 1.0 reader. Edited by hand, so no input is stored."""
    p, _ = _enc("uniform", EXAMPLE, bits=4, group_size=4, rounding="nearest")()

    def f(h: dict[str, Any]) -> None:
        h["tensors"][0]["params"]["stream"] = 0

    return edit(p, header=f, minor=1), None


def _format_minor7_noncanonical():
    """Minor 7 (newer): the canonical-form check F11 does not apply, so unsorted keys are fine."""
    p, x = _enc("fp16", EXAMPLE)()
    h = header_of(p)
    pairs = [("tensors", h["tensors"]), ("data_length", h["data_length"]), ("x_later", True)]
    return edit(p, header=pack_pairs(pairs), minor=7), x


VALID = [
    *_cast_cases("fp16", FP16_SPECIAL_BITS),
    *_cast_cases("bf16", BF16_SPECIAL_BITS),
    *UNIFORM_VALID,
    ("bundle_example", _bundle_example),
    ("bundle_mixed", _bundle_mixed),
    ("bundle_single", _bundle_single),
    ("bundle_empty_members", _bundle_empty_members),
    ("bundle_meta_no_checksum", _bundle_meta_no_checksum),
    ("format_no_checksum", _no_checksum),
    ("format_uniform_no_checksum", _uniform_no_checksum),
    ("format_meta", _meta),
    ("format_minor1_unknown_keys", _format_minor1),
    ("format_minor7_noncanonical", _format_minor7_noncanonical),
    ("uniform_minor1_nearest_with_stream", _uniform_minor1_nearest_with_stream),
]


# --------------------------------------------------------------------------------------------
# invalid cases: helpers


def pack_pairs(pairs: list[tuple[Any, Any]]) -> bytes:
    """A msgpack map with exactly these pairs in this order (values packed canonically)."""
    n = len(pairs)
    out = bytearray(bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n))
    for k, v in pairs:
        out += msgpack.packb(k, use_bin_type=True) if not isinstance(k, bytes) else k
        out += v if isinstance(v, (bytes, bytearray)) else pack_canonical(v)
    return bytes(out)


@functools.cache
def fp16_base() -> bytes:
    """fp16 of EXAMPLE: a 95-byte header, 1 byte of header padding, 6 data bytes and 2 of padding."""
    return encode("fp16", EXAMPLE)


@functools.cache
def fp16_nocrc() -> bytes:
    return encode("fp16", EXAMPLE, checksum=False)


@functools.cache
def u4_base() -> bytes:
    """uniform bits=4 group_size=3 of 5 values: scales (8 bytes) and codes (3 bytes, 4 unused bits)."""
    return encode("uniform", np.array([0.5, -1.0, 0.25, 2.0, -0.5], F32), bits=4, group_size=3)


@functools.cache
def u4_one_group() -> bytes:
    """uniform bits=4 group_size=5 of 5 values: scales (4 bytes), 4 padding bytes, codes (3 bytes)."""
    return encode("uniform", np.array([0.5, -1.0, 0.25, 2.0, -0.5], F32), bits=4, group_size=5)


@functools.cache
def u8_base() -> bytes:
    return encode("uniform", np.array([0.5, -1.0, 0.25, 2.0], F32), bits=8, group_size=2)


@functools.cache
def u2_base() -> bytes:
    """uniform bits=2: 7 codes in 2 bytes, the last byte uses 6 bits."""
    return encode("uniform", np.array([0.5, -1.0, 0.25, 2.0, -2.0, 1.0, 0.0], F32), bits=2, group_size=4)


@functools.cache
def bundle_base() -> bytes:
    return _bundle_mixed()[0]


def _hdr(base, fn, **kw):
    """Edit the header of ``base()`` with ``fn`` (in place), recompute CRCs."""
    return lambda: edit(base(), header=fn, **kw)


def _t0(fn):
    """A header editor that applies ``fn`` to the first tensor record."""

    def f(h):
        fn(h["tensors"][0])

    return f


def _set(key, value):
    def f(d):
        d[key] = value

    return f


def _del(key):
    def f(d):
        del d[key]

    return f


def _relayout(base, fn_header=None, fn_blobs=None, **kw):
    """Edit the header and/or section bytes of ``base()``, lay the sections out again, recompute CRCs."""

    def make():
        p = base()
        h = header_of(p)
        blobs = section_blobs(p)
        if fn_header:
            fn_header(h)
        if fn_blobs:
            fn_blobs(blobs)
        h, data = relayout(h, blobs)
        return edit(p, header=h, data=data, **kw)

    return make


def _raw_header(base, make_bytes, **kw):
    """Replace the header of ``base()`` by raw bytes built from its parsed header."""
    return lambda: edit(base(), header=make_bytes(header_of(base())), **kw)


def _replace_in_header(base, old: bytes, new: bytes, **kw):
    def make():
        hb = split(base()).header
        assert hb.count(old) == 1, (old, hb)
        return edit(base(), header=hb.replace(old, new), **kw)

    return make


def _data(base, fn, **kw):
    return lambda: edit(base(), data=fn, **kw)


def _byte(pos: int, value: int):
    def f(d: bytearray) -> None:
        d[pos] = value

    return f


def _xor_at(pos: int, mask: int = 0x01):
    """Flip bits of one payload byte, no CRC recomputed."""

    def f(p: bytes) -> bytes:
        b = bytearray(p)
        b[pos if pos >= 0 else len(b) + pos] ^= mask
        return bytes(b)

    return f


def _bytes(base, fn):
    return lambda: fn(base())


def _nested(depth: int) -> Any:
    v: Any = "x"
    for _ in range(depth):
        v = [v]
    return v


# -------- F1-F8: preamble and msgpack


def _dup_top(h):
    return pack_pairs([("data_length", h["data_length"]), ("data_length", h["data_length"]), ("tensors", h["tensors"])])


def _dup_tensor(h):
    t = h["tensors"][0]
    pairs = [("codec", t["codec"]), ("codec", t["codec"])] + [(k, t[k]) for k in sorted(t) if k != "codec"]
    return pack_pairs([("data_length", h["data_length"]), ("tensors", b"\x91" + pack_pairs(pairs))])


def _with_meta_raw(raw_value: bytes):
    """A header whose meta map holds one value given as raw msgpack bytes."""

    def f(h):
        return pack_pairs(
            [("data_length", h["data_length"]), ("meta", pack_pairs([("k", raw_value)])), ("tensors", h["tensors"])]
        )

    return f


def _header_byte_changed() -> bytes:
    """The codec id changed from fp16 to fp17 in the header, the header CRC left as it was."""
    p = fp16_base()
    hb = split(p).header
    return edit(p, header=hb.replace(b"\xa4fp16", b"\xa4fp17"), header_crc=split(p).header_crc)


F1_F8 = [
    ("f01_empty", lambda: b"", "FormatError", "F1"),
    ("f01_short", _bytes(fp16_base, lambda p: p[:15]), "FormatError", "F1"),
    ("f02_bad_magic", lambda: edit(fp16_base(), magic=b"GCDX"), "FormatError", "F2"),
    ("f02_lowercase_magic", lambda: edit(fp16_base(), magic=b"gcdc"), "FormatError", "F2"),
    ("f03_major_2", lambda: edit(fp16_base(), major=2), "UnsupportedVersionError", "F3"),
    ("f03_major_0", lambda: edit(fp16_base(), major=0), "UnsupportedVersionError", "F3"),
    (
        "f03_major_2_garbage_after",
        lambda: edit(fp16_base(), major=2)[:16] + b"\xff" * 40,
        "UnsupportedVersionError",
        "F3",
    ),
    ("f04_unknown_flag_bit1", lambda: edit(fp16_base(), flags=0x0003), "UnsupportedFeatureError", "F4"),
    ("f04_unknown_flag_bit15", lambda: edit(fp16_nocrc(), flags=0x8000), "UnsupportedFeatureError", "F4"),
    ("f05_header_length_zero", lambda: edit(fp16_base(), header_length=0), "HeaderError", "F5"),
    (
        "f05_header_length_over_limit",
        lambda: edit(fp16_base(), header_length=(1 << 20) + 1),
        "LimitExceededError",
        "F5",
    ),
    ("f06_header_past_end", lambda: edit(fp16_base(), header_length=4096), "LayoutError", "F6"),
    ("f06_header_one_past_end", lambda: edit(fp16_nocrc(), header_length=len(fp16_nocrc()) - 15), "LayoutError", "F6"),
    (
        "f07_header_crc_flipped",
        lambda: edit(fp16_base(), header_crc=split(fp16_base()).header_crc ^ 1),
        "ChecksumError",
        "F7",
    ),
    ("f07_header_byte_changed", _header_byte_changed, "ChecksumError", "F7"),
    ("f07_minor_changed", _bytes(fp16_base, _xor_at(5)), "ChecksumError", "F7"),
    ("f08_not_msgpack", _hdr(fp16_base, lambda h: b"\xc1"), "HeaderError", "F8"),
    ("f08_header_truncated_msgpack", _raw_header(fp16_base, lambda h: pack_canonical(h)[:-1]), "HeaderError", "F8"),
    ("f08_two_objects", _raw_header(fp16_base, lambda h: pack_canonical(h) + b"\xc0"), "HeaderError", "F8"),
    ("f08_duplicate_top_key", _raw_header(fp16_base, _dup_top), "HeaderError", "F8"),
    ("f08_duplicate_tensor_key", _raw_header(fp16_base, _dup_tensor), "HeaderError", "F8"),
    ("f08_bin_value", _raw_header(fp16_base, _with_meta_raw(b"\xc4\x01v")), "HeaderError", "F8"),
    ("f08_ext_value", _raw_header(fp16_base, _with_meta_raw(b"\xd4\x01\x00")), "HeaderError", "F8"),
    ("f08_bad_utf8", _raw_header(fp16_base, _with_meta_raw(b"\xa2\xc3\x28")), "HeaderError", "F8"),
    (
        "f08_int_key",
        _raw_header(
            fp16_base,
            lambda h: pack_pairs([("data_length", h["data_length"]), (b"\x07", 1), ("tensors", h["tensors"])]),
        ),
        "HeaderError",
        "F8",
    ),
    ("f08_nesting_too_deep", _hdr(fp16_base, _set("meta", {"k": _nested(10)})), "LimitExceededError", "F8"),
    # At max_nesting's cap (1000): the string at depth 1001 (map, meta, "k"'s 999 arrays) is one
    # level too deep; f09_meta_nested_1000 is one level shallower and parses.
    (
        "f08_nesting_1001",
        _hdr(fp16_base, _set("meta", {"k": _nested(999)})),
        "LimitExceededError",
        "F8",
        {"max_nesting": MAX_NESTING_CAP},
    ),
]


# -------- F9: the header schema


def _unname(i):
    def f(h):
        del h["tensors"][i]["name"]

    return f


def _unname_all(h):
    for t in h["tensors"]:
        del t["name"]


def _rename(i, name):
    def f(h):
        h["tensors"][i]["name"] = name

    return f


def _section(i, j, k, value):
    def f(h):
        h["tensors"][i]["sections"][j][k] = value

    return f


F9 = [
    ("f09_header_not_map", _hdr(fp16_base, lambda h: [h["data_length"], h["tensors"]]), "HeaderError", "F9"),
    ("f09_no_tensors", _hdr(fp16_base, _del("tensors")), "HeaderError", "F9"),
    ("f09_no_data_length", _hdr(fp16_base, _del("data_length")), "HeaderError", "F9"),
    ("f09_tensors_empty", _hdr(fp16_base, _set("tensors", [])), "HeaderError", "F9"),
    ("f09_unknown_top_key", _hdr(fp16_base, _set("x_future", 1)), "HeaderError", "F9"),
    ("f09_unknown_tensor_key", _hdr(fp16_base, _t0(_set("x_future", 1))), "HeaderError", "F9"),
    ("f09_data_length_negative", _hdr(fp16_base, _set("data_length", -8)), "HeaderError", "F9"),
    ("f09_data_length_string", _hdr(fp16_base, _set("data_length", "8")), "HeaderError", "F9"),
    ("f09_features_empty", _hdr(fp16_base, _set("features", [])), "HeaderError", "F9"),
    ("f09_features_not_strings", _hdr(fp16_base, _set("features", [1])), "HeaderError", "F9"),
    ("f09_meta_empty", _hdr(fp16_base, _set("meta", {})), "HeaderError", "F9"),
    ("f09_meta_value_int", _hdr(fp16_base, _set("meta", {"step": 3})), "HeaderError", "F9"),
    # The deepest header F8 admits under max_nesting's cap (a string at depth 1000: map, meta,
    # "k"'s 998 arrays) parses; its meta value is not a string (F9 f). A reader must get this far
    # without running out of stack.
    (
        "f09_meta_nested_1000",
        _hdr(fp16_base, _set("meta", {"k": _nested(998)})),
        "HeaderError",
        "F9",
        {"max_nesting": MAX_NESTING_CAP},
    ),
    ("f09_tensor_not_map", _hdr(fp16_base, _set("tensors", [["fp16"]])), "HeaderError", "F9"),
    ("f09_no_codec", _hdr(fp16_base, _t0(_del("codec"))), "HeaderError", "F9"),
    ("f09_no_sections", _hdr(fp16_base, _t0(_del("sections"))), "HeaderError", "F9"),
    ("f09_codec_empty", _hdr(fp16_base, _t0(_set("codec", ""))), "HeaderError", "F9"),
    ("f09_version_string", _hdr(fp16_base, _t0(_set("version", "1"))), "HeaderError", "F9"),
    ("f09_dtype_int8", _hdr(fp16_base, _t0(_set("dtype", "int8"))), "HeaderError", "F9"),
    ("f09_dtype_numpy_code", _hdr(fp16_base, _t0(_set("dtype", "<f4"))), "HeaderError", "F9"),
    ("f09_shape_not_list", _hdr(fp16_base, _t0(_set("shape", 3))), "HeaderError", "F9"),
    ("f09_shape_negative", _hdr(fp16_base, _t0(_set("shape", [-3]))), "HeaderError", "F9"),
    ("f09_shape_bool", _hdr(fp16_base, _t0(_set("shape", [True]))), "HeaderError", "F9"),
    ("f09_params_not_map", _hdr(fp16_base, _t0(_set("params", []))), "HeaderError", "F9"),
    ("f09_name_not_string", _hdr(fp16_base, _t0(_set("name", 5))), "HeaderError", "F9"),
    # minor 1, so that F11 (which a nil key also breaks under minor 0) does not apply: only §7.2 item 7
    ("f09_name_nil_minor1", _hdr(fp16_base, _t0(_set("name", None)), minor=1), "HeaderError", "F9"),
    ("f09_section_not_list", _hdr(fp16_base, _t0(_set("sections", [{"name": "data"}]))), "HeaderError", "F9"),
    ("f09_section_three_fields", _hdr(fp16_base, _t0(_set("sections", [["data", "u2", 0]]))), "HeaderError", "F9"),
    ("f09_section_name_empty", _hdr(fp16_base, _section(0, 0, 0, "")), "HeaderError", "F9"),
    ("f09_section_type_unknown", _hdr(fp16_base, _section(0, 0, 1, "bf16")), "HeaderError", "F9"),
    ("f09_section_type_big_endian", _hdr(fp16_base, _section(0, 0, 1, ">u2")), "HeaderError", "F9"),
    # found by tools/fuzz.py: an unhashable element type once escaped as a TypeError
    ("f09_section_type_list", _hdr(fp16_base, _section(0, 0, 1, ["u2"])), "HeaderError", "F9"),
    ("f09_section_type_map", _hdr(fp16_base, _section(0, 0, 1, {"u2": 1})), "HeaderError", "F9"),
    ("f09_section_offset_negative", _hdr(fp16_base, _section(0, 0, 2, -1)), "HeaderError", "F9"),
    ("f09_duplicate_section_name", _hdr(u4_base, _section(0, 1, 0, "scales")), "HeaderError", "F9"),
    ("f09_bundle_one_unnamed", _hdr(bundle_base, _unname(1)), "HeaderError", "F9"),
    ("f09_several_unnamed", _hdr(bundle_base, _unname_all), "HeaderError", "F9"),
    ("f09_duplicate_names", _hdr(bundle_base, _rename(2, "layer1.bias")), "HeaderError", "F9"),
    # size limits of F9 (gcodec.Limits defaults), checked before anything is allocated
    ("f09_huge_dimension", _hdr(fp16_base, _t0(_set("shape", [1 << 40]))), "LimitExceededError", "F9"),
    ("f09_huge_element_count", _hdr(fp16_base, _t0(_set("shape", [1 << 20, 1 << 20]))), "LimitExceededError", "F9"),
    (
        "f09_huge_output_bytes",
        _hdr(fp16_base, lambda h: h["tensors"][0].update(shape=[1 << 34], dtype="float64")),
        "LimitExceededError",
        "F9",
    ),
    ("f09_too_many_dims", _hdr(fp16_base, _t0(_set("shape", [1] * 33))), "LimitExceededError", "F9"),
    ("f09_data_length_over_limit", _hdr(fp16_base, _set("data_length", (1 << 37) + 8)), "LimitExceededError", "F9"),
    # F12's element-size rule is checked while each section entry is read
    (
        "f12_section_length_not_multiple",
        _relayout(u4_base, fn_blobs=lambda b: b[0].__setitem__(0, b[0][0][:6])),
        "LayoutError",
        "F12",
    ),
]


# -------- F10-F15


def _first_at_8(h):
    """fp16_base's data section moved from offset 0 to 8 (8 zero bytes before it)."""
    h["tensors"][0]["sections"][0][2] = 8
    h["data_length"] = 16


def _gap(h):
    """Codes of u4_base moved from offset 8 to 16 (8 zero bytes in between)."""
    h["tensors"][0]["sections"][1][2] = 16
    h["data_length"] = 24


F10_F15 = [
    ("f10_unknown_feature", _hdr(fp16_base, _set("features", ["zstd"])), "UnsupportedFeatureError", "F10"),
    (
        "f10_unknown_feature_minor1",
        _hdr(fp16_base, _set("features", ["zstd"]), minor=1),
        "UnsupportedFeatureError",
        "F10",
    ),
    (
        "f11_top_keys_unsorted",
        _raw_header(fp16_base, lambda h: pack_pairs([("tensors", h["tensors"]), ("data_length", h["data_length"])])),
        "HeaderError",
        "F11",
    ),
    (
        "f11_tensor_keys_unsorted",
        _raw_header(
            fp16_base,
            lambda h: pack_pairs(
                [
                    ("data_length", h["data_length"]),
                    ("tensors", b"\x91" + pack_pairs(list(reversed(sorted(h["tensors"][0].items()))))),
                ]
            ),
        ),
        "HeaderError",
        "F11",
    ),
    (
        "f11_int_not_shortest",
        _replace_in_header(fp16_base, b"\xabdata_length\x08", b"\xabdata_length\xce\x00\x00\x00\x08"),
        "HeaderError",
        "F11",
    ),
    ("f11_str8_not_fixstr", _replace_in_header(fp16_base, b"\xa4fp16", b"\xd9\x04fp16"), "HeaderError", "F11"),
    ("f11_map16_not_fixmap", _replace_in_header(fp16_base, b"\x82\xab", b"\xde\x00\x02\xab"), "HeaderError", "F11"),
    ("f11_array16_not_fixarray", _replace_in_header(fp16_base, b"\x91\x03", b"\xdc\x00\x01\x03"), "HeaderError", "F11"),
    ("f12_overlap", _hdr(u4_base, _section(0, 1, 2, 0)), "LayoutError", "F12"),
    ("f12_overlap_bundle", _hdr(bundle_base, _section(1, 0, 2, 8)), "LayoutError", "F12"),
    (
        "f12_gap",
        lambda: edit(u4_base(), header=_gap, data=split(u4_base()).data[:8] + bytes(8) + split(u4_base()).data[8:]),
        "LayoutError",
        "F12",
    ),
    ("f12_unaligned_offset", _hdr(u4_one_group, _section(0, 1, 2, 4)), "LayoutError", "F12"),
    (
        "f12_first_offset_not_zero",
        lambda: edit(fp16_base(), header=_first_at_8, data=bytes(8) + split(fp16_base()).data),
        "LayoutError",
        "F12",
    ),
    (
        "f12_data_length_too_long",
        lambda: edit(fp16_base(), header=_set("data_length", 16), data=split(fp16_base()).data + bytes(8)),
        "LayoutError",
        "F12",
    ),
    (
        "f12_data_length_unpadded",
        lambda: edit(fp16_base(), header=_set("data_length", 6), data=split(fp16_base()).data[:6]),
        "LayoutError",
        "F12",
    ),
    ("f13_truncated_crc", _bytes(fp16_base, lambda p: p[:-1]), "LayoutError", "F13"),
    ("f13_truncated_data", _bytes(fp16_base, lambda p: p[:-7]), "LayoutError", "F13"),
    ("f13_truncated_at_data_start", _bytes(fp16_nocrc, lambda p: p[:112]), "LayoutError", "F13"),
    ("f13_trailing_byte", _bytes(fp16_base, lambda p: p + b"\x00"), "LayoutError", "F13"),
    ("f13_crc_but_flag_clear", lambda: fp16_nocrc() + b"\x00\x00\x00\x00", "LayoutError", "F13"),
    ("f14_data_byte_flipped", _bytes(fp16_base, _xor_at(112)), "ChecksumError", "F14"),
    ("f14_crc_flipped", _bytes(fp16_base, _xor_at(-1, 0x80)), "ChecksumError", "F14"),
    ("f14_header_padding_flipped", _bytes(fp16_base, _xor_at(111)), "ChecksumError", "F14"),
    ("f14_bundle_data_flipped", _bytes(bundle_base, _xor_at(-6, 0x10)), "ChecksumError", "F14"),
    ("f15_data_padding", _data(fp16_base, _byte(7, 0x01)), "LayoutError", "F15"),
    ("f15_header_padding", lambda: edit(fp16_base(), header_pad=b"\x20"), "LayoutError", "F15"),
    ("f15_padding_between_sections", _data(u4_one_group, _byte(5, 0x80)), "LayoutError", "F15"),
    ("f15_padding_no_crc", _data(fp16_nocrc, _byte(6, 0xFF)), "LayoutError", "F15"),
]


# -------- C0-C3: the codec record


def _params(fn):
    return _t0(lambda t: fn(t["params"]))


C0_C3 = [
    ("c0_unknown_codec", _hdr(fp16_base, _t0(_set("codec", "sz3"))), "UnknownCodecError", "C0"),
    (
        "c0_unknown_codec_in_bundle",
        _hdr(bundle_base, lambda h: h["tensors"][2].update(codec="zfp")),
        "UnknownCodecError",
        "C0",
    ),
    ("c0_codec_version_2", _hdr(fp16_base, _t0(_set("version", 2))), "UnsupportedVersionError", "C0"),
    ("c0_codec_version_0", _hdr(u4_base, _t0(_set("version", 0))), "UnsupportedVersionError", "C0"),
    ("c1_fp16_unknown_param", _hdr(fp16_base, _params(_set("scale", 1))), "HeaderError", "C1"),
    ("c1_uniform_missing_rounding", _hdr(u4_base, _params(_del("rounding"))), "HeaderError", "C1"),
    ("c1_uniform_missing_bits", _hdr(u4_base, _params(_del("bits"))), "HeaderError", "C1"),
    ("c1_uniform_bits_3", _hdr(u4_base, _params(_set("bits", 3))), "HeaderError", "C1"),
    ("c1_uniform_bits_16", _hdr(u8_base, _params(_set("bits", 16))), "HeaderError", "C1"),
    ("c1_uniform_bits_string", _hdr(u8_base, _params(_set("bits", "8"))), "HeaderError", "C1"),
    ("c1_uniform_bits_bool", _hdr(u8_base, _params(_set("bits", True))), "HeaderError", "C1"),
    ("c1_uniform_group_size_0", _hdr(u4_base, _params(_set("group_size", 0))), "HeaderError", "C1"),
    ("c1_uniform_group_size_too_big", _hdr(u4_base, _params(_set("group_size", (1 << 24) + 1))), "HeaderError", "C1"),
    ("c1_uniform_rounding_unknown", _hdr(u4_base, _params(_set("rounding", "up"))), "HeaderError", "C1"),
    ("c1_uniform_unknown_param", _hdr(u4_base, _params(_set("zero_point", 0))), "HeaderError", "C1"),
    ("c2_fp16_section_renamed", _hdr(fp16_base, _section(0, 0, 0, "values")), "SizeMismatchError", "C2"),
    ("c2_fp16_section_type_i2", _hdr(fp16_base, _section(0, 0, 1, "i2")), "SizeMismatchError", "C2"),
    (
        "c2_fp16_extra_section",
        _relayout(
            fp16_base,
            lambda h: h["tensors"][0]["sections"].append(["extra", "u1", 0, 0]),
            lambda b: b[0].append(b"\x00"),
        ),
        "SizeMismatchError",
        "C2",
    ),
    (
        "c2_uniform_missing_codes",
        _relayout(u4_base, lambda h: h["tensors"][0]["sections"].pop(), lambda b: b[0].pop()),
        "SizeMismatchError",
        "C2",
    ),
    (
        "c2_uniform_sections_swapped",
        _relayout(u4_base, lambda h: h["tensors"][0]["sections"].reverse(), lambda b: b[0].reverse()),
        "SizeMismatchError",
        "C2",
    ),
    ("c2_uniform_scales_f8", _relayout(u4_base, _section(0, 0, 1, "f8")), "SizeMismatchError", "C2"),
    (
        "c3_fp16_data_too_long",
        _relayout(fp16_base, fn_blobs=lambda b: b[0].__setitem__(0, b[0][0] + b"\x00\x3c")),
        "SizeMismatchError",
        "C3",
    ),
    ("c3_fp16_shape_mismatch", _hdr(fp16_base, _t0(_set("shape", [4]))), "SizeMismatchError", "C3"),
    (
        "c3_fp16_scalar_two_values",
        _relayout(fp16_base, _t0(_set("shape", [])), lambda b: b[0].__setitem__(0, b[0][0][:4])),
        "SizeMismatchError",
        "C3",
    ),
    (
        "c3_uniform_scales_short",
        _relayout(u4_base, fn_blobs=lambda b: b[0].__setitem__(0, b[0][0][:4])),
        "SizeMismatchError",
        "C3",
    ),
    (
        "c3_uniform_codes_long",
        _relayout(u4_base, fn_blobs=lambda b: b[0].__setitem__(1, b[0][1] + b"\x00")),
        "SizeMismatchError",
        "C3",
    ),
    ("c3_uniform_group_size_changed", _hdr(u4_base, _params(_set("group_size", 5))), "SizeMismatchError", "C3"),
    (
        "c3_bundle_member",
        _relayout(bundle_base, fn_blobs=lambda b: b[1].__setitem__(0, b[1][0][:4])),
        "SizeMismatchError",
        "C3",
    ),
]


# -------- U1-U3: uniform's values


def _scale(i: int, bits: int):
    """Set scale ``i`` of the data area (scales come first, at offset 0) to a float32 bit pattern."""

    def f(d: bytearray) -> None:
        d[4 * i : 4 * i + 4] = struct.pack("<I", bits)

    return f


def _codes_byte(base, byte_index: int, value: int):
    """Set one byte of the codes section of ``base()``."""

    def make():
        p = base()
        off = header_of(p)["tensors"][0]["sections"][1][2]
        return edit(p, data=_byte(off + byte_index, value))

    return make


U1_U3 = [
    ("u1_nan_scale", _data(u4_base, _scale(1, 0x7FC00000)), "PayloadValueError", "U1"),
    ("u1_inf_scale", _data(u4_base, _scale(0, 0x7F800000)), "PayloadValueError", "U1"),
    ("u1_negative_scale", _data(u8_base, _scale(1, 0xBF800000)), "PayloadValueError", "U1"),
    ("u1_negative_zero_scale", _data(u8_base, _scale(0, 0x80000000)), "PayloadValueError", "U1"),
    ("u2_b8_code_minus_128", _codes_byte(u8_base, 2, 0x80), "PayloadValueError", "U2"),
    ("u2_b4_code_minus_8", _codes_byte(u4_base, 1, 0x81), "PayloadValueError", "U2"),
    ("u2_b2_code_minus_2", _codes_byte(u2_base, 1, 0b00100001), "PayloadValueError", "U2"),
    ("u3_b4_unused_high_nibble", _codes_byte(u4_base, 2, 0x17), "PayloadValueError", "U3"),
    ("u3_b2_unused_bits", _codes_byte(u2_base, 1, 0b01000001), "PayloadValueError", "U3"),
]

INVALID = F1_F8 + F9 + F10_F15 + C0_C3 + U1_U3

# silence "imported but unused" for helpers other modules may want from here
_ = assemble
