"""``sign``: specs/codecs/sign.md."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases import edit

import gcodec

from . import quant_model as M


@pytest.mark.parametrize("group", [0, 1, 7, 64, 256, 2047, 3000, 70000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_payload_matches_the_spec_model(group, dtype):
    rng = np.random.default_rng(group)
    for n in (1, 9, 1000, 10007, 140001 if group >= 64 or group == 0 else 3001):
        x = rng.standard_t(3, n).astype(dtype)
        x[::13] = 0.0
        x[::17] = -0.0
        buf = gcodec.get_codec("sign", group_size=group).encode(x)
        params, sec = M.payload_sections(buf)
        assert params == {"group_size": group}
        sc, bits = M.sign_sections(x, group)
        assert sec["scales"].tobytes() == sc
        assert sec["bits"].tobytes() == bits
        g = group if group else n
        s = np.repeat(np.frombuffer(sc, np.float32), g)[:n]
        np.testing.assert_array_equal(gcodec.decode(buf, out=np.empty(n, np.float32)), np.where(M.as_f32(x) < 0, -s, s))


def test_bit_order_and_zeros():
    """Bit i of the stream (byte i // 8, bit i % 8 from the least significant) is 1 iff x_i < 0.
    +0.0 and -0.0 are sent as bit 0 and decode to +s."""
    x = np.array([-1.0, 2.0, 0.0, -0.0, -3.0, 4.0, -5.0, 6.0, -7.0], np.float32)
    buf = gcodec.get_codec("sign", group_size=0).encode(x)
    sec = M.payload_sections(buf)[1]
    assert sec["bits"].tolist() == [0b01010001, 0b00000001]
    s = np.float32(28.0 / 9)
    assert sec["scales"].tolist() == [s]
    np.testing.assert_array_equal(gcodec.decode(buf), np.array([-s, s, s, s, -s, s, -s, s, -s], np.float32))


def test_all_zero_group_decodes_to_zero():
    x = np.zeros(128, np.float32)
    x[64:] = np.linspace(-1, 1, 64)
    y = gcodec.decode(gcodec.get_codec("sign", group_size=64).encode(x))
    assert not y[:64].any() and not np.signbit(y[:64]).any()


def test_scale_is_mean_abs_per_group():
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    sec = M.payload_sections(gcodec.get_codec("sign", group_size=100).encode(x))[1]
    np.testing.assert_allclose(sec["scales"], np.abs(x.astype(np.float64)).reshape(10, 100).mean(axis=1), rtol=1e-7)


def test_non_finite_input_is_refused():
    x = np.ones(100, np.float32)
    x[3] = np.nan
    with pytest.raises(gcodec.PayloadValueError):
        gcodec.get_codec("sign").encode(x)


def _offsets(buf):
    return {s[0]: s[2] for s in gcodec.validate(buf).tensors[0].sections}


@pytest.mark.parametrize("val", [np.nan, np.inf, -1.0, -0.0])
def test_s1_scale_rules(val):
    buf = gcodec.get_codec("sign", group_size=4).encode(np.arange(10, dtype=np.float32))
    off = _offsets(buf)["scales"]
    bad = edit(bytes(buf), data=lambda d: d.__setitem__(slice(off + 4, off + 8), np.float32(val).tobytes()))
    for f in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.PayloadValueError, match="S1"):
            f(bad)


def test_s2_unused_bits():
    buf = gcodec.get_codec("sign").encode(-np.ones(10, np.float32))
    off = _offsets(buf)["bits"]
    assert gcodec.validate(buf)
    bad = edit(bytes(buf), data=lambda d: d.__setitem__(off + 1, 0x07))
    for f in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.PayloadValueError, match="S2"):
            f(bad)


def test_accumulate():
    x = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    buf = gcodec.get_codec("sign").encode(x)
    out = np.full(5000, 0.25, np.float64)
    gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(out, 0.25 + gcodec.decode(buf).astype(np.float64))


@pytest.mark.parametrize("group", [0, 256, 64])
def test_payload_size_formula(group):
    n = 1_000_003
    buf = gcodec.get_codec("sign", group_size=group).encode(
        np.random.default_rng(0).standard_normal(n).astype(np.float32)
    )
    ideal = (n + 32 * (1 if group == 0 else -(-n // group))) / 8
    assert ideal <= len(buf) <= ideal * 1.01 + 256
