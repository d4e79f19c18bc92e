"""Golden vectors of the quantization family: stochastic and float16-scaled ``uniform`` (uniform.md §9),
``qsgd``, ``terngrad`` and ``sign`` (rules U1-U3, Q1-Q3, T1-T3, S1-S2, and C1-C3 for these codecs).

Valid names start with the codec id (``uniform_sto_``, ``uniform_f16s_``, ``qsgd_``, ``terngrad_``,
``sign_``); invalid ones with the rule they break. Stochastic payloads pass an explicit ``step``, so
the Philox stream, and therefore every byte, is fixed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from gcodec.arrays import BFLOAT16

from . import edit, encode, header_of, uniform_values

F32, F16, F64 = np.float32, np.float16, np.float64

#: The input of the worked examples (the same as uniform.md §8.1, plus a few values).
EXAMPLE = np.array([0.5, -1.0, 0.25, 0.0, 3.0, -0.75], F32)
EXAMPLE10 = np.array([0.5, -1.0, 0.25, 0.0, 3.0, -0.75, 2.0, -0.125, 1.5, 0.0], F32)
SIGN_EXAMPLE = np.array([-1.0, 2.0, 0.0, -0.0, -3.0, 4.0, -5.0, 6.0, -7.0, 0.5], F32)


def _enc(codec: str, x: np.ndarray, step: int | None = None, **params: Any) -> Callable[[], tuple[bytes, Any]]:
    def make() -> tuple[bytes, Any]:
        import gcodec

        c = gcodec.get_codec(codec, **params)
        return bytes(c.encode(x, step=step)), x

    return make


def _ramp_steps(n: int) -> np.ndarray:
    """k + f for a spread of fractions f: every rounding probability from 1/n to (n-1)/n shows up."""
    return (np.arange(n, dtype=F64) * (1 + 1 / n) - n / 2).astype(F32)


VALID: list[tuple[str, Callable[[], tuple[bytes, Any]]]] = [
    # ---- uniform, stochastic rounding and float16 scales (uniform.md §9)
    ("uniform_sto_b4_g4_example", _enc("uniform", EXAMPLE, 0, bits=4, group_size=4, rounding="stochastic", seed=1)),
    ("uniform_sto_b8_g64_n100", _enc("uniform", uniform_values(100, 51, F32), 5, rounding="stochastic", seed=2)),
    (
        "uniform_sto_b4_g8_ramp",
        _enc("uniform", _ramp_steps(64), 3, bits=4, group_size=8, rounding="stochastic", seed=3),
    ),
    (
        "uniform_sto_b2_g5_n11",
        _enc("uniform", uniform_values(11, 52, F32), 7, bits=2, group_size=5, rounding="stochastic", seed=4),
    ),
    (
        "uniform_sto_b8_g16_f64_input",
        _enc("uniform", uniform_values(40, 53, F64), 1, group_size=16, rounding="stochastic", seed=5),
    ),
    (
        "uniform_sto_b4_g16_bf16_input",
        _enc("uniform", uniform_values(40, 54, BFLOAT16), 2, bits=4, group_size=16, rounding="stochastic", seed=6),
    ),
    (
        "uniform_sto_b8_max_seed_stream",
        _enc("uniform", uniform_values(24, 55, F32), 2**64 - 1, group_size=8, rounding="stochastic", seed=2**64 - 1),
    ),
    (
        "uniform_sto_b8_large_stream",
        _enc("uniform", uniform_values(24, 55, F32), 2**32 + 1, group_size=8, rounding="stochastic", seed=2**32 + 7),
    ),
    ("uniform_f16s_b4_g4_example", _enc("uniform", EXAMPLE, None, bits=4, group_size=4, scale_dtype="float16")),
    (
        "uniform_f16s_b8_g8_n40",
        _enc("uniform", uniform_values(40, 56, F32, scale_exp=3), None, group_size=8, scale_dtype="float16"),
    ),
    (
        "uniform_f16s_b8_g4_tiny_scales",
        _enc(
            "uniform",
            np.array([1e-7, -3e-8, 0, 0, 2e-9, 0, 0, 0, 0, 0, 0, 0], F32),
            None,
            group_size=4,
            scale_dtype="float16",
        ),
    ),
    (
        "uniform_f16s_sto_b2_g16_n50",
        _enc(
            "uniform",
            uniform_values(50, 57, F32),
            9,
            bits=2,
            group_size=16,
            rounding="stochastic",
            scale_dtype="float16",
            seed=8,
        ),
    ),
    ("uniform_sto_empty", _enc("uniform", np.zeros(0, F32), 0, rounding="stochastic")),
    # ---- qsgd
    ("qsgd_s3_b8_example", _enc("qsgd", EXAMPLE10, 0, levels=3, bucket_size=8, seed=1)),
    ("qsgd_s15_b512_n1000", _enc("qsgd", uniform_values(1000, 61, F32), 4, seed=2)),
    ("qsgd_s1_whole_tensor_n100", _enc("qsgd", uniform_values(100, 62, F32), 1, levels=1, bucket_size=0, seed=3)),
    ("qsgd_s127_b64_n200", _enc("qsgd", uniform_values(200, 63, F32), 2, levels=127, bucket_size=64, seed=4)),
    ("qsgd_s7_b3_n11", _enc("qsgd", uniform_values(11, 64, F32), 3, levels=7, bucket_size=3, seed=5)),
    ("qsgd_s2_b16_n37", _enc("qsgd", uniform_values(37, 65, F32), 6, levels=2, bucket_size=16, seed=6)),
    ("qsgd_s31_b32_n70", _enc("qsgd", uniform_values(70, 66, F32), 7, levels=31, bucket_size=32, seed=7)),
    ("qsgd_s63_b8_f16_input", _enc("qsgd", uniform_values(30, 67, F16), 8, levels=63, bucket_size=8, seed=8)),
    ("qsgd_s15_b4_zero_bucket", _enc("qsgd", np.array([0, 0, 0, 0, 1, -2, 0, 0.5, 0, -0.0, 0], F32), 0, bucket_size=4)),
    ("qsgd_s5_b8_f64_input", _enc("qsgd", uniform_values(20, 68, F64), 9, levels=5, bucket_size=8, seed=9)),
    # ---- terngrad
    ("terngrad_tensor_example", _enc("terngrad", EXAMPLE10, 0, seed=1)),
    ("terngrad_g4_clip_example", _enc("terngrad", EXAMPLE10, 0, group_size=4, clip=1.0, seed=1)),
    ("terngrad_tensor_n1000", _enc("terngrad", uniform_values(1000, 71, F32), 3, seed=2)),
    (
        "terngrad_clip25_n1000",
        _enc("terngrad", np.concatenate([uniform_values(999, 72, F32), [F32(40.0)]]), 4, clip=2.5, seed=3),
    ),
    ("terngrad_g64_n300", _enc("terngrad", uniform_values(300, 73, F32), 5, group_size=64, seed=4)),
    ("terngrad_g5_n13_bf16_input", _enc("terngrad", uniform_values(13, 74, BFLOAT16), 6, group_size=5, seed=5)),
    ("terngrad_constant_clip", _enc("terngrad", np.full(9, 0.75, F32), 0, clip=2.5)),
    # ---- sign
    ("sign_example", _enc("sign", SIGN_EXAMPLE, group_size=0)),
    ("sign_g4_example", _enc("sign", SIGN_EXAMPLE, group_size=4)),
    ("sign_g256_n1000", _enc("sign", uniform_values(1000, 81, F32))),
    ("sign_g7_n20", _enc("sign", uniform_values(20, 82, F32), group_size=7)),
    ("sign_g64_f64_input", _enc("sign", uniform_values(100, 83, F64), group_size=64)),
    ("sign_zero_group", _enc("sign", np.array([0, -0.0, 0, 0, 1, -1, 0, 0], F32), group_size=4)),
    ("sign_scalar", _enc("sign", np.array(-2.5, F32))),
]


# --------------------------------------------------------------------------------------------
# invalid: edits of real payloads (all CRCs recomputed so the named rule is the first to fire)


@functools.cache
def _base(codec: str) -> bytes:
    if codec == "uniform_f16":
        return encode("uniform", uniform_values(16, 91, F32), bits=4, group_size=4, scale_dtype="float16")
    if codec == "uniform_sto":
        # 13 4-bit codes: 52 bits, so the last byte has 4 unused bits
        return bytes(_enc("uniform", uniform_values(13, 92, F32), 3, bits=4, group_size=4, rounding="stochastic")()[0])
    if codec == "qsgd":  # levels=5: 4-bit codes, codes 6, 7 and the pattern 8 (-8) are out of range
        return bytes(_enc("qsgd", uniform_values(13, 93, F32), 1, levels=5, bucket_size=8)()[0])
    if codec == "qsgd15":  # 5-bit codes: 13 codes fill 65 bits, 3 unused bits in the last byte
        return bytes(_enc("qsgd", uniform_values(13, 94, F32), 1, levels=15, bucket_size=8)()[0])
    if codec == "terngrad":
        return bytes(_enc("terngrad", uniform_values(11, 95, F32), 2, group_size=4)()[0])
    if codec == "sign":
        return encode("sign", uniform_values(11, 96, F32), group_size=4)
    raise KeyError(codec)


def _section(payload: bytes, name: str) -> tuple[int, int]:
    for s in header_of(payload)["tensors"][0]["sections"]:
        if s[0] == name:
            return s[2], s[3]
    raise KeyError(name)


def _put(codec: str, section: str, pos: int, raw: bytes) -> Callable[[], bytes]:
    """Overwrite bytes of a section (pos < 0 counts from its end)."""

    def make() -> bytes:
        p = _base(codec)
        off, nb = _section(p, section)
        at = off + (pos if pos >= 0 else nb + pos)

        def f(d: bytearray) -> None:
            d[at : at + len(raw)] = raw

        return edit(p, data=f)

    return make


def _or(codec: str, section: str, pos: int, mask: int) -> Callable[[], bytes]:
    def make() -> bytes:
        p = _base(codec)
        off, nb = _section(p, section)
        at = off + (pos if pos >= 0 else nb + pos)

        def f(d: bytearray) -> None:
            d[at] |= mask

        return edit(p, data=f)

    return make


def _param(codec: str, key: str, value: Any) -> Callable[[], bytes]:
    """Set (or, for value None, delete) a header param."""

    def make() -> bytes:
        def f(h: dict) -> None:
            params = h["tensors"][0]["params"]
            if value is None:
                del params[key]
            else:
                params[key] = value

        return edit(_base(codec), header=f)

    return make


def _sec_entry(codec: str, idx: int, field: int, value: Any) -> Callable[[], bytes]:
    def make() -> bytes:
        def f(h: dict) -> None:
            h["tensors"][0]["sections"][idx][field] = value

        return edit(_base(codec), header=f)

    return make


def _f32(v: float) -> bytes:
    return np.array([v], "<f4").tobytes()


def _f16bits(v: int) -> bytes:
    return int(v).to_bytes(2, "little")


INVALID = [
    # uniform with float16 scales / stochastic rounding
    ("u1_f16_scale_inf", _put("uniform_f16", "scales", 2, _f16bits(0x7C00)), "PayloadValueError", "U1"),
    ("u1_f16_scale_nan", _put("uniform_f16", "scales", 0, _f16bits(0x7E00)), "PayloadValueError", "U1"),
    ("u1_f16_scale_negative", _put("uniform_f16", "scales", 4, _f16bits(0xBC00)), "PayloadValueError", "U1"),
    ("u1_f16_scale_negative_zero", _put("uniform_f16", "scales", 2, _f16bits(0x8000)), "PayloadValueError", "U1"),
    ("u2_sto_b4_code_minus_8", _put("uniform_sto", "codes", 1, b"\x80"), "PayloadValueError", "U2"),
    ("u3_sto_unused_bits", _or("uniform_sto", "codes", -1, 0x80), "PayloadValueError", "U3"),
    ("c1_uniform_stochastic_without_stream", _param("uniform_sto", "stream", None), "HeaderError", "C1"),
    ("c1_uniform_nearest_with_stream", _param("uniform_f16", "stream", 0), "HeaderError", "C1"),
    ("c1_uniform_stream_negative", _param("uniform_sto", "stream", -1), "HeaderError", "C1"),
    ("c1_uniform_stream_float", _param("uniform_sto", "stream", 3.0), "HeaderError", "C1"),
    ("c1_uniform_seed_negative", _param("uniform_sto", "seed", -5), "HeaderError", "C1"),
    ("c1_uniform_scale_dtype_bf16", _param("uniform_f16", "scale_dtype", "bfloat16"), "HeaderError", "C1"),
    ("c2_uniform_f16_scales_declared_f4", _sec_entry("uniform_f16", 0, 1, "f4"), "SizeMismatchError", "C2"),
    (
        "c2_uniform_scale_dtype_float32_with_f2_section",
        _param("uniform_f16", "scale_dtype", "float32"),
        "SizeMismatchError",
        "C2",
    ),
    # qsgd
    ("q1_nan_scale", _put("qsgd", "scales", 4, _f32(float("nan"))), "PayloadValueError", "Q1"),
    ("q1_negative_scale", _put("qsgd", "scales", 0, _f32(-0.5)), "PayloadValueError", "Q1"),
    ("q1_negative_zero_scale", _put("qsgd", "scales", 4, _f32(-0.0)), "PayloadValueError", "Q1"),
    ("q1_inf_scale", _put("qsgd", "scales", 0, _f32(float("inf"))), "PayloadValueError", "Q1"),
    # finite, but 5 * 3e38 overflows float32: code 5 would decode to infinity
    ("q1_step_times_levels_overflow", _put("qsgd", "scales", 0, _f32(3e38)), "PayloadValueError", "Q1"),
    ("q2_code_above_levels", _put("qsgd", "codes", 2, b"\x06"), "PayloadValueError", "Q2"),
    ("q2_code_below_minus_levels", _put("qsgd", "codes", 0, b"\x90"), "PayloadValueError", "Q2"),
    ("q2_code_minus_8", _put("qsgd", "codes", 3, b"\x08"), "PayloadValueError", "Q2"),
    ("q3_unused_bits", _or("qsgd15", "codes", -1, 0x80), "PayloadValueError", "Q3"),
    ("c1_qsgd_levels_zero", _param("qsgd", "levels", 0), "HeaderError", "C1"),
    ("c1_qsgd_levels_128", _param("qsgd", "levels", 128), "HeaderError", "C1"),
    ("c1_qsgd_stream_missing", _param("qsgd", "stream", None), "HeaderError", "C1"),
    ("c1_qsgd_bucket_size_negative", _param("qsgd", "bucket_size", -1), "HeaderError", "C1"),
    ("c1_qsgd_unknown_param", _param("qsgd", "norm", "l2"), "HeaderError", "C1"),
    ("c3_qsgd_levels_changed_width", _param("qsgd", "levels", 15), "SizeMismatchError", "C3"),
    ("c3_qsgd_bucket_size_changed", _param("qsgd", "bucket_size", 4), "SizeMismatchError", "C3"),
    # terngrad
    ("tg1_nan_scale", _put("terngrad", "scales", 4, _f32(float("nan"))), "PayloadValueError", "TG1"),
    ("tg1_negative_scale", _put("terngrad", "scales", 0, _f32(-1.0)), "PayloadValueError", "TG1"),
    ("tg2_pattern_10", _put("terngrad", "codes", 1, b"\x08"), "PayloadValueError", "TG2"),
    ("tg3_unused_bits", _or("terngrad", "codes", -1, 0xC0), "PayloadValueError", "TG3"),
    ("c1_terngrad_clip_negative", _param("terngrad", "clip", -1.0), "HeaderError", "C1"),
    ("c1_terngrad_clip_string", _param("terngrad", "clip", "2.5"), "HeaderError", "C1"),
    ("c1_terngrad_seed_missing", _param("terngrad", "seed", None), "HeaderError", "C1"),
    ("c3_terngrad_group_size_changed", _param("terngrad", "group_size", 0), "SizeMismatchError", "C3"),
    # sign
    ("s1_nan_scale", _put("sign", "scales", 4, _f32(float("nan"))), "PayloadValueError", "S1"),
    ("s1_negative_scale", _put("sign", "scales", 8, _f32(-2.0)), "PayloadValueError", "S1"),
    ("s1_negative_zero_scale", _put("sign", "scales", 0, _f32(-0.0)), "PayloadValueError", "S1"),
    ("s2_unused_bits", _or("sign", "bits", -1, 0x10), "PayloadValueError", "S2"),
    ("c1_sign_group_size_negative", _param("sign", "group_size", -4), "HeaderError", "C1"),
    ("c1_sign_seed_unknown", _param("sign", "seed", 0), "HeaderError", "C1"),
    ("c3_sign_group_size_changed", _param("sign", "group_size", 2), "SizeMismatchError", "C3"),
    ("c2_sign_bits_as_u2", _sec_entry("sign", 1, 1, "u2"), "SizeMismatchError", "C2"),
]
