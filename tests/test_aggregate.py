"""gcodec.aggregate: the summable values of a payload, and resealing its CRC after changing them."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import gcodec
from gcodec.aggregate import (
    add_values,
    count_nonfinite,
    reseal,
    round_values,
    sum_pair,
    summable_values,
    values_dtype,
)
from gcodec.arrays import BFLOAT16
from tests.procs import own_env, run

X = np.linspace(-3, 3, 1000, dtype=np.float32)


@pytest.mark.parametrize(
    ("cfg", "dtype"),
    [
        ({"id": "fp16"}, np.float16),
        ({"id": "bf16"}, BFLOAT16),
        ({"id": "randomk", "ratio": 0.1}, np.float32),
        ({"id": "randomk", "ratio": 0.1, "values": {"id": "fp16"}}, np.float16),
        ({"id": "randomk", "ratio": 0.1, "values": {"id": "bf16"}}, BFLOAT16),
    ],
)
def test_values_are_a_writable_view_and_adding_them_adds_the_decodes(cfg: dict, dtype: type) -> None:
    codec = gcodec.get_codec(cfg)
    a, b = codec.encode(X, step=3), codec.encode(2 * X, step=3)
    va, vb = summable_values(a), summable_values(b)
    assert va.dtype == np.dtype(dtype) and values_dtype(a) == np.dtype(dtype)
    va[...] = (va.astype(np.float32) + vb.astype(np.float32)).astype(va.dtype)
    with pytest.raises(gcodec.ChecksumError):  # the data changed under the CRC
        gcodec.validate(a)
    reseal(a)
    gcodec.validate(a)
    want = gcodec.decode(codec.encode(X, step=3)) + gcodec.decode(b)
    np.testing.assert_allclose(gcodec.decode(a), want, rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("cid", ["uniform", "topk", "sign", "powersgd"])
def test_gather_codecs_are_refused(cid: str) -> None:
    with pytest.raises(gcodec.ConfigError, match="not summable"):
        summable_values(gcodec.get_codec(cid).encode(X.reshape(20, 50)))


def test_randomk_with_a_scaled_value_codec_is_refused() -> None:
    buf = gcodec.get_codec("randomk", ratio=0.1, values={"id": "uniform"}).encode(X)
    with pytest.raises(gcodec.ConfigError):
        summable_values(buf)


def test_reseal_leaves_a_payload_without_crc_alone() -> None:
    buf = gcodec.get_codec("fp16").encode(X, checksum=False)
    before = bytes(buf)
    reseal(buf)
    assert bytes(buf) == before


def test_bundles_and_read_only_buffers_are_refused() -> None:
    bundle = gcodec.encode_bundle({"a": X, "b": X}, "fp16")
    with pytest.raises(gcodec.FormatError):
        summable_values(bundle)
    with pytest.raises(gcodec.ConfigError, match="writable"):
        summable_values(bytes(gcodec.get_codec("fp16").encode(X)))


def test_import_gcodec_imports_neither_torch_nor_mpi4py() -> None:
    code = "import sys, gcodec, gcodec.transports; print('torch' in sys.modules, 'mpi4py' in sys.modules)"
    out = run([sys.executable, "-c", code], 120, cwd=os.getcwd(), env=own_env(), check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32])
def test_add_and_round_values_match_numpy_widening_and_one_rounding(dtype: type) -> None:
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(70001).astype(dtype) for _ in range(3)]
    acc = np.zeros(70001, np.float32)
    for v in parts:
        add_values(v, acc)
    want = sum(v.astype(np.float32) for v in parts)
    np.testing.assert_array_equal(acc, want)
    out = np.empty(70001, dtype)
    round_values(acc, out)
    np.testing.assert_array_equal(out.view(np.uint8), want.astype(dtype).view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32, np.float64])
def test_count_nonfinite_finds_nan_and_both_infinities(dtype: type) -> None:
    v = np.linspace(-5, 5, 101).astype(dtype)
    assert count_nonfinite(v) == 0
    v[3], v[50], v[99] = np.nan, np.inf, -np.inf
    assert count_nonfinite(v) == 3


def test_round_values_overflows_to_infinity_like_the_codec() -> None:
    out = np.empty(2, np.float16)
    round_values(np.array([70000.0, -1.0], np.float32), out)
    assert np.isinf(out[0]) and out[1] == -1


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32, np.float64])
def test_sum_pair_is_the_accumulator_sum_bit_for_bit(dtype: type) -> None:
    """The fused pair sum of the summable transport equals zeros + a + b rounded once, for every
    16-bit pattern (signed zeros: -0 + -0 is +0 there), and for wide types with zeros, subnormals,
    infinities, NaN and overflow; NaN is NaN."""
    dt = np.dtype(dtype)
    if dt.itemsize == 2:
        a = np.arange(1 << 16, dtype=np.uint16).view(dt)
    else:
        vals = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, np.finfo(dt).max, np.finfo(dt).tiny / 4, 3.5e-3]
        a = np.array(vals * 50, dt)
    b = np.random.default_rng(3).permutation(a)
    acc = np.zeros(a.shape, np.float64 if dt == np.float64 else np.float32)
    add_values(a, acc)
    add_values(b, acc)
    want = np.empty_like(a)
    round_values(acc, want)
    got = np.empty_like(a)
    bad = sum_pair(a, b, got)
    assert bad == count_nonfinite(got) > 0  # the pass counts what it rounds to infinity or NaN
    # NaN results (refused by the transport anyway) may differ in sign and payload: which operand's
    # NaN an addition returns is the compiler's and the FPU's choice
    nan = np.isnan(want.astype(np.float32))
    assert np.isnan(got[nan].astype(np.float32)).all()
    u = f"u{dt.itemsize}"
    assert got[~nan].view(u).tolist() == want[~nan].view(u).tolist()
    neg0 = np.array([-0.0], dt)
    sum_pair(neg0, neg0.copy(), neg0)  # in place into the first operand
    assert not np.signbit(neg0[0].astype(np.float32))


@pytest.mark.parametrize(
    "values",
    [5, "fp16", [[["fp16"]]], {"codec": ["fp16"]}, {"codec": "fp16", "params": {}, "version": 1}],
    ids=["int", "string", "deep list", "codec a list", "fp16 without its sections"],
)
def test_summable_values_of_a_damaged_randomk_header_is_a_gcodec_error(values) -> None:
    """summable_values checks the container only (F1-F15), so a randomk record's ``values`` can be any
    msgpack value there: it must give a GcodecError, not AttributeError, TypeError or KeyError."""
    from tests.codec_kit import parse_payload, rebuild

    b = bytes(gcodec.get_codec("randomk", k=2).encode(np.ones(8, np.float32)))
    h, data = parse_payload(b)
    h["tensors"][0]["params"]["values"] = values  # the sections stay those of raw values
    with pytest.raises(gcodec.GcodecError):
        summable_values(bytearray(rebuild(h, data)))
