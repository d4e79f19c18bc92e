"""Every codec, every dtype, every awkward shape: encode -> validate -> decode."""

from __future__ import annotations

import numpy as np
import pytest

import gcodec
from gcodec.arrays import BFLOAT16, DTYPES

from .conftest import SHAPES, make_array

CODECS = [
    ("fp16", {}),
    ("bf16", {}),
    ("uniform", {}),
    ("uniform", {"bits": 4, "group_size": 32}),
    ("uniform", {"bits": 2, "group_size": 7}),
    ("uniform", {"bits": 4, "group_size": 3}),
    ("uniform", {"bits": 8, "group_size": 1}),
]


def tolerance(codec: gcodec.Codec, x: np.ndarray) -> np.ndarray:
    """Per-element error bound implied by each codec's spec (plus float32 slack)."""
    xf = x.astype(np.float64).reshape(-1)
    if codec.codec_id == "fp16":
        return np.maximum(np.abs(xf) * 2.0**-11, 2.0**-25)  # half an ulp of binary16
    if codec.codec_id == "bf16":
        return np.abs(xf) * 2.0**-8
    p = codec.params
    qmax = 2 ** (p["bits"] - 1) - 1
    g = p["group_size"]
    n = xf.size
    pad = (-n) % g
    groups = np.abs(np.concatenate([xf, np.zeros(pad)])).reshape(-1, g).max(axis=1) if n else np.zeros(0)
    scale = np.repeat(groups / qmax, g)[:n]
    # half a step, plus float32 rounding of the scale and of q * scale (a few ulps of |x|)
    return scale / 2 * (1 + 1e-6) + np.abs(xf) * 2.0**-22 + 1e-30


@pytest.mark.parametrize("codec_id, params", CODECS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_roundtrip(codec_id, params, shape, dtype_name):
    codec = gcodec.get_codec(codec_id, **params)
    x = make_array(shape, dtype_name, seed=len(shape) + sum(shape))
    buf = codec.encode(x)
    info = gcodec.validate(buf)
    assert info.codec == codec_id and info.shape == shape and info.dtype == DTYPES[dtype_name]
    assert info.params == {**codec.params}
    y = gcodec.decode(buf)
    assert isinstance(y, np.ndarray) and y.shape == shape and y.dtype == DTYPES[dtype_name]
    # compare against the codec's float32 result rounded once into the output dtype
    y32 = np.empty(shape, np.float32)
    gcodec.decode(buf, out=y32)
    np.testing.assert_array_equal(y, y32.astype(DTYPES[dtype_name]))
    x32 = x.astype(np.float32)  # the codecs compute on the float32 rounding of the input
    err = np.abs(y32.astype(np.float64) - x32.astype(np.float64)).reshape(-1)
    assert (err <= tolerance(codec, x32)).all()
    # decoding again gives the same bits; encoding again gives the same bytes
    np.testing.assert_array_equal(gcodec.decode(buf, out=np.empty_like(y)), y)
    assert bytes(codec.encode(x)) == bytes(buf)


def test_fp16_exact_for_representable_values():
    x = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 2.0**-24, np.inf, -np.inf], np.float32)
    y = gcodec.decode(gcodec.get_codec("fp16").encode(x))
    np.testing.assert_array_equal(y.view(np.uint32), x.view(np.uint32))


def test_fp16_overflow_and_nan():
    x = np.array([65520.0, -1e6, np.nan], np.float32)
    y = gcodec.decode(gcodec.get_codec("fp16").encode(x))
    assert y[0] == np.inf and y[1] == -np.inf and np.isnan(y[2])


def test_bf16_matches_ml_dtypes_rounding():
    x = np.random.default_rng(3).standard_normal(10000).astype(np.float32) * 1e3
    y = gcodec.decode(gcodec.get_codec("bf16").encode(x))
    np.testing.assert_array_equal(y, x.astype(BFLOAT16).astype(np.float32))


def test_bfloat16_input_roundtrips_exactly_through_bf16():
    x = make_array((1000,), "bfloat16")
    y = gcodec.decode(gcodec.get_codec("bf16").encode(x))
    assert y.dtype == BFLOAT16
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))


def test_uniform_error_bound_and_symmetry():
    rng = np.random.default_rng(5)
    x = (rng.standard_t(2, 100_000) * 10).astype(np.float32)
    for bits in (8, 4, 2):
        c = gcodec.get_codec("uniform", bits=bits, group_size=64)
        y = gcodec.decode(c.encode(x))
        assert (np.abs(y - x) <= tolerance(c, x)).all()
        y_neg = gcodec.decode(c.encode(-x))
        np.testing.assert_array_equal(y_neg, -y)  # symmetric quantizer: q(-x) = -q(x)


def test_uniform_zero_group_and_nonfinite_input():
    c = gcodec.get_codec("uniform")
    x = np.zeros(200, np.float32)
    x[150] = 3.0
    y = gcodec.decode(c.encode(x))
    np.testing.assert_array_equal(y, x)
    for bad in (np.nan, np.inf):
        x[10] = bad
        with pytest.raises(gcodec.PayloadValueError, match="NaN or infinite"):
            c.encode(x)


def test_uniform_payload_size_formula():
    n = 1_000_003
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    for bits in (8, 4, 2):
        buf = gcodec.get_codec("uniform", bits=bits).encode(x)
        info_bytes = (bits * n + 32 * ((n + 63) // 64)) / 8
        assert info_bytes <= len(buf) <= info_bytes * 1.01 + 256


def test_bundle_roundtrip_and_overhead():
    rng = np.random.default_rng(0)
    tensors = {f"layer{i}.bias": rng.standard_normal(64).astype(np.float32) for i in range(50)}
    tensors["layer0.weight"] = rng.standard_normal((64, 64)).astype(np.float32)
    codecs = {k: ("fp16" if k.endswith("bias") else gcodec.get_codec("uniform", bits=4)) for k in tensors}
    buf = gcodec.encode_bundle(tensors, codecs)
    info = gcodec.validate(buf)
    assert info.is_bundle and [t.name for t in info.tensors] == list(tensors)
    out = gcodec.decode(buf)
    assert isinstance(out, dict) and list(out) == list(tensors)
    for k, v in tensors.items():
        assert out[k].shape == v.shape
    # per-tensor overhead: bytes beyond the sections themselves, per tensor
    data = sum(s[3] for t in info.tensors for s in t.sections)
    per_tensor = (len(buf) - data) / len(tensors)
    assert per_tensor < 110, per_tensor
    # one bundle is smaller than separate payloads
    separate = sum(len(gcodec.get_codec(codecs[k]).encode(v)) for k, v in tensors.items())
    assert len(buf) < separate


def test_decode_bundle_of_single_payload():
    x = np.ones(4, np.float32)
    d = gcodec.decode_bundle(gcodec.get_codec("fp16").encode(x))
    assert list(d) == [""]
    np.testing.assert_array_equal(d[""], x)


@pytest.mark.parametrize(
    "codec_id, bits_in, expect",
    [
        ("bf16", 0x7FA00000, 0x7FC0),  # signalling NaN with payload -> canonical quiet NaN
        ("bf16", 0xFFC12345, 0xFFC0),  # sign kept
        ("fp16", 0x7FA00000, 0x7E00),
        ("fp16", 0xFFC12345, 0xFE00),
    ],
)
def test_nan_encodes_canonically(codec_id, bits_in, expect):
    x = np.array([bits_in], np.uint32).view(np.float32)
    buf = gcodec.get_codec(codec_id).encode(x)
    p = gcodec.format.read_payload(buf)
    assert int(p.view(p.header.tensors[0].sections[0])[0]) == expect
