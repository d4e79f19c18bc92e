"""Golden vectors of the low-precision float codecs: ``fp8`` (fp8.md, rules E1-E2), ``mx`` (mx.md,
MX1-MX3) and ``nvfp4`` (nvfp4.md, NV1-NV4), with C1-C3 for each.

Valid names start with the codec id; invalid ones with the rule they break. Stochastic payloads pass
an explicit ``step``, so every byte is fixed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from gcodec.arrays import BFLOAT16

from . import bits_array, edit, header_of, relayout, section_blobs, splitmix64, uniform_values

F32, F64 = np.float32, np.float64

#: The worked examples' input (as uniform.md §8.1).
EXAMPLE = np.array([0.5, -1.0, 0.25, 0.0, 3.0, -0.75], F32)

#: Every E2M1 midpoint (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5), both signs, in a block led by 6 (scale 1).
E2M1_TIES = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5], F32)


def _enc(codec: str, x: np.ndarray, step: int | None = None, **params: Any) -> Callable[[], tuple[bytes, Any]]:
    def make() -> tuple[bytes, Any]:
        import gcodec

        return bytes(gcodec.get_codec(codec, **params).encode(x, step=step)), x

    return make


def _minor1_stream(codec: str, x: np.ndarray, stream: Any, **params: Any) -> Callable[[], tuple[bytes, Any]]:
    """A nearest-rounding payload given a ``stream`` key under minor 1: an unknown parameter there,
    which a 1.0 reader ignores whatever its value (fp8.md §1, mx.md §1, nvfp4.md §1). Edited by hand,
    so no input is stored."""

    def make() -> tuple[bytes, Any]:
        p, _ = _enc(codec, x, **params)()

        def f(h: dict) -> None:
            h["tensors"][0]["params"]["stream"] = stream

        return edit(p, header=f, minor=1), None

    return make


def _wide(n: int, seed: int) -> np.ndarray:
    """n values whose magnitudes spread over 2^-20 .. 2^20 (exact: an integer times a power of two)."""
    u = splitmix64(seed, n)
    mant = (u >> np.uint64(40)).astype(np.int64) - (1 << 23)  # 24 signed bits
    exp = ((u >> np.uint64(8)) & np.uint64(0x1F)).astype(np.int64) - 16 - 23
    return np.ldexp(mant.astype(F64), exp).astype(F32)


def _saturating_block() -> np.ndarray:
    """E4M3 blocks whose maxima lie between 448 and 512 times the scale: they saturate."""
    base = uniform_values(64, 31, F32, scale_exp=8)  # |v| < 256
    base[0], base[33] = F32(500.0), F32(-470.0)
    return base


def _zero_and_tiny_blocks() -> np.ndarray:
    x = np.zeros(96, F32)
    x[32:64] = -0.0
    x[64:96] = bits_array([0x00000001 + 37 * i for i in range(32)], F32)  # binary32 subnormals
    return x


def _huge() -> np.ndarray:
    x = uniform_values(40, 32, F32)
    x[3] = F32(3.0e38)
    x[35] = F32(-3.4028235e38)
    return x


def _subnormal_scales() -> np.ndarray:
    """Groups of 4: one whose scale m / 448 is a binary32 subnormal, one that underflows to +0."""
    return np.array([1e-36, -3e-37, 2e-37, 0, 1e-45, 0, 0, 0, 1.0, -0.5, 0.25, 0.125], F32)


def _small_blocks() -> np.ndarray:
    x = uniform_values(64, 33, F32)
    x[0] = F32(1000.0)
    x[16:32] *= F32(0.02)  # an E4M3 block scale in the subnormal range
    x[32:48] *= F32(1e-9)  # r rounds to 0: the block decodes to zeros
    return x


VALID: list[tuple[str, Callable[[], tuple[bytes, Any]]]] = [
    # ---- fp8
    ("fp8_e4m3_g4_example", _enc("fp8", EXAMPLE, group_size=4)),
    ("fp8_e5m2_g4_example", _enc("fp8", EXAMPLE, element="e5m2", group_size=4)),
    ("fp8_e4m3_g128_n300", _enc("fp8", _wide(300, 1))),
    ("fp8_e5m2_g7_n50", _enc("fp8", _wide(50, 2), element="e5m2", group_size=7)),
    ("fp8_e4m3_e8m0_g32_n100", _enc("fp8", _wide(100, 3), group_size=32, scale_dtype="e8m0")),
    ("fp8_e5m2_e8m0_g5_n23", _enc("fp8", _wide(23, 4), element="e5m2", group_size=5, scale_dtype="e8m0")),
    ("fp8_e4m3_subnormal_scales", _enc("fp8", _subnormal_scales(), group_size=4)),
    ("fp8_e4m3_zero_groups", _enc("fp8", np.array([0, 0, 0, -0.0, -0.0, -0.0, 1, -2], F32), group_size=3)),
    ("fp8_sto_e4m3_g16_n50", _enc("fp8", _wide(50, 5), 3, group_size=16, rounding="stochastic", seed=1)),
    (
        "fp8_sto_e5m2_e8m0_g8_n30",
        _enc("fp8", _wide(30, 6), 4, element="e5m2", group_size=8, scale_dtype="e8m0", rounding="stochastic", seed=2),
    ),
    ("fp8_e4m3_f64_input", _enc("fp8", uniform_values(40, 7, F64), group_size=16)),
    ("fp8_empty", _enc("fp8", np.zeros(0, F32))),
    ("fp8_minor1_nearest_with_stream", _minor1_stream("fp8", EXAMPLE, 7, group_size=4)),
    # ---- mx
    ("mx_e2m1_example", _enc("mx", EXAMPLE)),
    *[
        (f"mx_{el}_n100", _enc("mx", _wide(100, 10 + i), element=el))
        for i, el in enumerate(("e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8"))
    ],
    ("mx_e4m3_saturate", _enc("mx", _saturating_block(), element="e4m3")),
    ("mx_e2m1_ties", _enc("mx", E2M1_TIES)),
    ("mx_e3m2_n37_f64_input", _enc("mx", uniform_values(37, 20, F64), element="e3m2")),
    ("mx_e2m3_bf16_input", _enc("mx", uniform_values(40, 21, BFLOAT16), element="e2m3")),
    ("mx_e2m1_zero_and_tiny_blocks", _enc("mx", _zero_and_tiny_blocks())),
    ("mx_e5m2_huge", _enc("mx", _huge(), element="e5m2")),
    ("mx_int8_n64", _enc("mx", uniform_values(64, 22, F32), element="int8")),
    ("mx_sto_e2m1_n70", _enc("mx", _wide(70, 23), 5, rounding="stochastic", seed=3)),
    ("mx_sto_e4m3_n40", _enc("mx", _wide(40, 24), 2**64 - 1, element="e4m3", rounding="stochastic", seed=2**64 - 1)),
    ("mx_empty", _enc("mx", np.zeros((0, 3), F32))),
    ("mx_scalar", _enc("mx", np.array(-2.5, F32), element="e3m2")),
    ("mx_minor1_nearest_with_stream", _minor1_stream("mx", EXAMPLE, -1)),  # not even a valid stream
    # ---- nvfp4
    ("nvfp4_example", _enc("nvfp4", EXAMPLE)),
    ("nvfp4_n100", _enc("nvfp4", _wide(100, 30))),
    ("nvfp4_n33_odd", _enc("nvfp4", uniform_values(33, 31, F32))),
    (
        "nvfp4_gaussian_n256",
        _enc(
            "nvfp4",
            (uniform_values(256, 32, F64) + uniform_values(256, 33, F64) + uniform_values(256, 34, F64)).astype(F32),
        ),
    ),
    ("nvfp4_small_blocks", _enc("nvfp4", _small_blocks())),
    ("nvfp4_zeros", _enc("nvfp4", np.zeros(20, F32))),
    ("nvfp4_bf16_input", _enc("nvfp4", uniform_values(40, 35, BFLOAT16))),
    ("nvfp4_sto_n50", _enc("nvfp4", _wide(50, 36), 7, rounding="stochastic", seed=9)),
    ("nvfp4_empty", _enc("nvfp4", np.zeros(0, F32))),
    ("nvfp4_minor1_nearest_with_stream", _minor1_stream("nvfp4", EXAMPLE, "s")),  # not even an integer
]


# --------------------------------------------------------------------------------------------
# invalid: edits of real payloads (all CRCs recomputed so the named rule is the first to fire)


@functools.cache
def _base(name: str) -> bytes:
    import gcodec

    def enc(codec: str, x: np.ndarray, step: int | None = None, **params: Any) -> bytes:
        return bytes(gcodec.get_codec(codec, **params).encode(x, step=step))

    x = uniform_values(45, 90, F32)
    return {
        "fp8": lambda: enc("fp8", x, group_size=8),
        "fp8_e5m2": lambda: enc("fp8", x, element="e5m2", group_size=8),
        "fp8_e8m0": lambda: enc("fp8", x, group_size=8, scale_dtype="e8m0"),
        "fp8_sto": lambda: enc("fp8", x, 1, group_size=8, rounding="stochastic"),
        "mx_e2m1": lambda: enc("mx", x),  # 45 elements: the last byte's high nibble is unused
        "mx_e3m2": lambda: enc("mx", x, element="e3m2"),  # 270 bits: 2 unused bits
        "mx_e4m3": lambda: enc("mx", x, element="e4m3"),
        "mx_e5m2": lambda: enc("mx", x, element="e5m2"),
        "mx_int8": lambda: enc("mx", x, element="int8"),
        "mx_sto": lambda: enc("mx", x, 2, rounding="stochastic"),
        "nvfp4": lambda: enc("nvfp4", x),
        "nvfp4_sto": lambda: enc("nvfp4", x, 3, rounding="stochastic"),
        "nvfp4_empty": lambda: enc("nvfp4", np.zeros(0, F32)),
    }[name]()


def _section(payload: bytes, name: str) -> tuple[int, int]:
    for s in header_of(payload)["tensors"][0]["sections"]:
        if s[0] == name:
            return s[2], s[3]
    raise KeyError(name)


def _put(base: str, section: str, pos: int, raw: bytes) -> Callable[[], bytes]:
    """Overwrite bytes of a section (pos < 0 counts from its end)."""

    def make() -> bytes:
        p = _base(base)
        off, nb = _section(p, section)
        at = off + (pos if pos >= 0 else nb + pos)

        def f(d: bytearray) -> None:
            d[at : at + len(raw)] = raw

        return edit(p, data=f)

    return make


def _or(base: str, section: str, pos: int, mask: int) -> Callable[[], bytes]:
    def make() -> bytes:
        p = _base(base)
        off, nb = _section(p, section)
        at = off + (pos if pos >= 0 else nb + pos)

        def f(d: bytearray) -> None:
            d[at] |= mask

        return edit(p, data=f)

    return make


def _param(base: str, key: str, value: Any, minor: int | None = None) -> Callable[[], bytes]:
    """Set (or, for value None, delete) a header param; ``minor`` also sets the payload's minor version."""

    def make() -> bytes:
        def f(h: dict) -> None:
            params = h["tensors"][0]["params"]
            if value is None:
                del params[key]
            else:
                params[key] = value

        return edit(_base(base), header=f, **({} if minor is None else {"minor": minor}))

    return make


def _sec_entry(base: str, idx: int, field: int, value: Any) -> Callable[[], bytes]:
    def make() -> bytes:
        def f(h: dict) -> None:
            h["tensors"][0]["sections"][idx][field] = value

        return edit(_base(base), header=f)

    return make


def _resized(base: str, idx: int, nbytes: int) -> Callable[[], bytes]:
    """Section ``idx`` given ``nbytes`` bytes (zeros, or its first bytes), laid out as a writer would."""

    def make() -> bytes:
        p = _base(base)
        h = header_of(p)
        blobs = section_blobs(p)
        b = blobs[0][idx]
        blobs[0][idx] = (b + bytes(nbytes))[:nbytes]
        h, data = relayout(h, blobs)
        return edit(p, header=h, data=data)

    return make


def _f32(v: float) -> bytes:
    return np.array([v], "<f4").tobytes()


INVALID = [
    # fp8
    ("e1_nan_scale", _put("fp8", "scales", 4, _f32(float("nan"))), "PayloadValueError", "E1"),
    ("e1_inf_scale", _put("fp8", "scales", 0, _f32(float("inf"))), "PayloadValueError", "E1"),
    ("e1_negative_scale", _put("fp8", "scales", 8, _f32(-0.01)), "PayloadValueError", "E1"),
    ("e1_negative_zero_scale", _put("fp8", "scales", 0, _f32(-0.0)), "PayloadValueError", "E1"),
    # finite, but 448 * 1e36 overflows binary32: the largest element would decode to infinity
    ("e1_scale_times_448_overflows", _put("fp8", "scales", 4, _f32(1e36)), "PayloadValueError", "E1"),
    ("e1_e8m0_nan_scale", _put("fp8_e8m0", "scales", 1, b"\xff"), "PayloadValueError", "E1"),
    ("e1_e8m0_scale_above_246", _put("fp8_e8m0", "scales", 0, b"\xf7"), "PayloadValueError", "E1"),
    ("e2_e4m3_nan", _put("fp8", "elements", 3, b"\x7f"), "PayloadValueError", "E2"),
    ("e2_e4m3_negative_nan", _put("fp8_sto", "elements", 44, b"\xff"), "PayloadValueError", "E2"),
    ("e2_e5m2_inf", _put("fp8_e5m2", "elements", 0, b"\x7c"), "PayloadValueError", "E2"),
    ("e2_e5m2_nan", _put("fp8_e5m2", "elements", 9, b"\xfe"), "PayloadValueError", "E2"),
    ("c1_fp8_element_e3m4", _param("fp8", "element", "e3m4"), "HeaderError", "C1"),
    ("c1_fp8_scale_dtype_e4m3", _param("fp8", "scale_dtype", "e4m3"), "HeaderError", "C1"),
    ("c1_fp8_group_size_zero", _param("fp8", "group_size", 0), "HeaderError", "C1"),
    ("c1_fp8_stochastic_without_stream", _param("fp8_sto", "stream", None), "HeaderError", "C1"),
    ("c1_fp8_nearest_with_stream", _param("fp8", "stream", 0), "HeaderError", "C1"),
    # a missing parameter is refused under every minor version (§8 relaxes unknown keys only)
    ("c1_fp8_stochastic_without_stream_minor1", _param("fp8_sto", "stream", None, 1), "HeaderError", "C1"),
    ("c2_fp8_e8m0_with_f4_scales", _param("fp8", "scale_dtype", "e8m0"), "SizeMismatchError", "C2"),
    ("c2_fp8_elements_as_i1", _sec_entry("fp8", 1, 1, "i1"), "SizeMismatchError", "C2"),
    ("c3_fp8_group_size_changed", _param("fp8", "group_size", 16), "SizeMismatchError", "C3"),
    # mx
    ("mx1_nan_scale", _put("mx_e2m1", "scales", 1, b"\xff"), "PayloadValueError", "MX1"),
    ("mx1_e2m1_scale_253", _put("mx_e2m1", "scales", 0, b"\xfd"), "PayloadValueError", "MX1"),
    ("mx1_e4m3_scale_247", _put("mx_e4m3", "scales", 1, b"\xf7"), "PayloadValueError", "MX1"),
    ("mx1_int8_nan_scale", _put("mx_int8", "scales", 0, b"\xff"), "PayloadValueError", "MX1"),
    ("mx2_e2m1_unused_nibble", _or("mx_e2m1", "elements", -1, 0x10), "PayloadValueError", "MX2"),
    ("mx2_e3m2_unused_bits", _or("mx_e3m2", "elements", -1, 0x80), "PayloadValueError", "MX2"),
    ("mx2_sto_unused_nibble", _or("mx_sto", "elements", -1, 0x80), "PayloadValueError", "MX2"),
    ("mx3_e4m3_nan", _put("mx_e4m3", "elements", 40, b"\xff"), "PayloadValueError", "MX3"),
    ("mx3_e5m2_inf", _put("mx_e5m2", "elements", 2, b"\xfc"), "PayloadValueError", "MX3"),
    ("mx3_e5m2_nan", _put("mx_e5m2", "elements", 7, b"\x7d"), "PayloadValueError", "MX3"),
    ("mx3_int8_minus_128", _put("mx_int8", "elements", 5, b"\x80"), "PayloadValueError", "MX3"),
    ("c1_mx_element_fp4", _param("mx_e2m1", "element", "fp4"), "HeaderError", "C1"),
    ("c1_mx_block_size", _param("mx_e2m1", "block_size", 32), "HeaderError", "C1"),
    ("c1_mx_stream_missing", _param("mx_sto", "stream", None), "HeaderError", "C1"),
    ("c1_mx_stream_missing_minor1", _param("mx_sto", "stream", None, 1), "HeaderError", "C1"),
    ("c1_mx_nearest_with_stream", _param("mx_e2m1", "stream", 0), "HeaderError", "C1"),
    ("c1_mx_rounding_bool", _param("mx_e2m1", "rounding", True), "HeaderError", "C1"),
    ("c2_mx_scales_as_i1", _sec_entry("mx_e2m1", 0, 1, "i1"), "SizeMismatchError", "C2"),
    ("c3_mx_element_width_changed", _param("mx_e2m1", "element", "e4m3"), "SizeMismatchError", "C3"),
    ("c3_mx_e3m2_declared_e2m1", _param("mx_e3m2", "element", "e2m1"), "SizeMismatchError", "C3"),
    # nvfp4
    ("nv1_nan_tensor_scale", _put("nvfp4", "tensor_scale", 0, _f32(float("nan"))), "PayloadValueError", "NV1"),
    ("nv1_negative_tensor_scale", _put("nvfp4", "tensor_scale", 0, _f32(-1e-3)), "PayloadValueError", "NV1"),
    ("nv1_inf_tensor_scale", _put("nvfp4", "tensor_scale", 0, _f32(float("inf"))), "PayloadValueError", "NV1"),
    ("nv2_block_scale_nan", _put("nvfp4", "scales", 1, b"\x7f"), "PayloadValueError", "NV2"),
    ("nv2_block_scale_negative", _or("nvfp4", "scales", 0, 0x80), "PayloadValueError", "NV2"),
    # 448 * 3e35 * 6 overflows binary32
    ("nv2_block_scale_overflow", _put("nvfp4", "tensor_scale", 0, _f32(3e35)), "PayloadValueError", "NV2"),
    ("nv3_unused_nibble", _or("nvfp4", "elements", -1, 0x20), "PayloadValueError", "NV3"),
    # 0 elements: the tensor scale must be +0 (NV4); -0 breaks NV1 first, as for any n
    ("nv4_empty_tensor_scale_one", _put("nvfp4_empty", "tensor_scale", 0, _f32(1.0)), "PayloadValueError", "NV4"),
    (
        "nv4_empty_tensor_scale_subnormal",
        _put("nvfp4_empty", "tensor_scale", 0, b"\x01\x00\x00\x00"),
        "PayloadValueError",
        "NV4",
    ),
    (
        "nv1_empty_negative_zero_tensor_scale",
        _put("nvfp4_empty", "tensor_scale", 0, _f32(-0.0)),
        "PayloadValueError",
        "NV1",
    ),
    ("c1_nvfp4_unknown_param", _param("nvfp4", "element", "e2m1"), "HeaderError", "C1"),
    ("c1_nvfp4_seed_missing", _param("nvfp4", "seed", None), "HeaderError", "C1"),
    ("c1_nvfp4_nearest_with_stream", _param("nvfp4", "stream", 0), "HeaderError", "C1"),
    ("c1_nvfp4_stochastic_without_stream", _param("nvfp4_sto", "stream", None), "HeaderError", "C1"),
    ("c1_nvfp4_stochastic_without_stream_minor1", _param("nvfp4_sto", "stream", None, 1), "HeaderError", "C1"),
    ("c3_nvfp4_tensor_scale_f8_bytes", _resized("nvfp4", 0, 8), "SizeMismatchError", "C3"),
    ("c3_nvfp4_scales_short", _resized("nvfp4", 1, 2), "SizeMismatchError", "C3"),
]
