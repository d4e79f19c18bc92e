"""``terngrad``: specs/codecs/terngrad.md."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases import edit

import gcodec

from . import quant_model as M


def _model(x, group, clip, seed, stream):
    return M.scaled_sections(
        x, rule="max", group_size=group, width=2, qmax=1, stochastic=True, seed=seed, stream=stream, clip=clip
    )


@pytest.mark.parametrize("group", [0, 1, 5, 64, 512, 3000, 70000])
@pytest.mark.parametrize("clip", [0.0, 1.0, 2.5])
def test_payload_matches_the_spec_model(group, clip):
    rng = np.random.default_rng(group + int(clip * 10))
    n = int(rng.choice([1, 9, 1000, 10007, 140001 if group >= 64 or group == 0 else 3001]))
    x = (rng.standard_t(3, n) * 0.01).astype(np.float32)
    buf = gcodec.get_codec("terngrad", group_size=group, clip=clip, seed=4).encode(x, step=6)
    params, sec = M.payload_sections(buf)
    assert params == {"group_size": group, "clip": clip, "seed": 4, "stream": 6}
    sc, codes = _model(x, group, clip, 4, 6)
    assert sec["scales"].tobytes() == sc
    assert sec["codes"].tobytes() == codes
    y = gcodec.decode(buf)
    np.testing.assert_array_equal(y, M.scaled_decode(sec["scales"], codes, n, group, 2))


def test_values_are_ternary_and_the_scale_is_the_absmax():
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    buf = gcodec.get_codec("terngrad").encode(x)
    s = M.payload_sections(buf)[1]["scales"]
    assert s.tolist() == [np.abs(x).max()]
    y = gcodec.decode(buf)
    assert set(np.unique(y)) <= {-s[0], 0, s[0]}
    assert (np.sign(y) * np.sign(x) >= 0).all()  # a value is sent with its own sign or as 0


def test_unbiased_without_clipping():
    """y_i in {0, sign(x_i) s} with P(nonzero) = |x_i| / s (to 2**-16): an interval of length s,
    mean x_i. Hoeffding per element with a union bound over n elements, and over all nK draws for
    the mean relative deviation."""
    n, k = 2048, 400
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    c = gcodec.get_codec("terngrad", group_size=256, seed=2)
    mean, s = M.mean_decode_and_scales(c, x, k, 256)
    dev = mean - x
    assert (np.abs(dev) <= M.hoeffding_halfwidth(s, k, n)).all()
    assert abs(np.mean(dev / s)) <= float(M.hoeffding_halfwidth(1.0, k * n, 1)) + 2.0**-17


def test_variance_is_s_abs_x_minus_x_squared():
    """TernGrad's variance per element is s|x| - x^2 (a scaled Bernoulli). The sum over n elements
    of the squared error has that expectation; its variance is the sum of the per-element
    variances s^2 (s|x| - x^2)(1 - ...) bounded by sum s^4/4, so the mean of K encodes lies within
    6 sqrt(sum s^4 / 4K) of sum (s|x| - x^2)."""
    n, k = 4096, 200
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32).astype(np.float64)
    c = gcodec.get_codec("terngrad", seed=8)
    sq = []
    for step in range(k):
        buf = c.encode(x.astype(np.float32), step=step)
        sq.append(((gcodec.decode(buf).astype(np.float64) - x) ** 2).sum())
    s = float(np.abs(x).max())
    expect = (s * np.abs(x) - x**2).sum()
    assert abs(np.mean(sq) - expect) <= 6 * np.sqrt(n * s**4 / 4 / k)


def test_clipping_caps_the_scale_at_c_sigma():
    x = np.random.default_rng(3).standard_normal(100_000).astype(np.float32)
    x[7] = 1000.0  # an outlier that would otherwise set the scale
    buf = gcodec.get_codec("terngrad", clip=2.5).encode(x)
    s = float(M.payload_sections(buf)[1]["scales"][0])
    assert s == pytest.approx(2.5 * x.astype(np.float64).std(), rel=1e-6)
    y = gcodec.decode(buf)
    big = np.abs(x) >= s
    np.testing.assert_array_equal(y[big], np.sign(x[big]) * np.float32(s))  # clipped values are sent as +-s


def test_clip_zero_sigma_gives_zero_scale():
    """A constant tensor has sigma = 0: clipping at c * sigma leaves scale 0 (spec §3.3)."""
    buf = gcodec.get_codec("terngrad", clip=2.5).encode(np.full(100, 3.0, np.float32))
    assert M.payload_sections(buf)[1]["scales"][0] == 0
    assert not gcodec.decode(buf).any()


def _offsets(buf):
    return {s[0]: s[2] for s in gcodec.validate(buf).tensors[0].sections}


def test_tg2_pattern_10_is_refused():
    buf = gcodec.get_codec("terngrad").encode(np.ones(16, np.float32))
    off = _offsets(buf)["codes"]
    bad = edit(bytes(buf), data=lambda d: d.__setitem__(off + 2, 0b01100101))  # element 9: pattern 10
    for f in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.PayloadValueError, match=r"^TG2:"):
            f(bad)


def test_tg1_and_tg3():
    buf = gcodec.get_codec("terngrad", group_size=4).encode(np.arange(10, dtype=np.float32))
    off = _offsets(buf)
    bad = edit(bytes(buf), data=lambda d: d.__setitem__(slice(off["scales"], off["scales"] + 4), b"\x00\x00\xc0\x7f"))
    with pytest.raises(gcodec.PayloadValueError, match=r"^TG1:"):
        gcodec.validate(bad)
    bad = edit(bytes(buf), data=lambda d: d.__setitem__(off["codes"] + 2, d[off["codes"] + 2] | 0x40))
    with pytest.raises(gcodec.PayloadValueError, match=r"^TG3:"):
        gcodec.validate(bad)


@pytest.mark.parametrize("clip", [-1.0, float("nan"), "2"])
def test_clip_param(clip):
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("terngrad", clip=clip)


@pytest.mark.parametrize("group", [0, 512])
def test_payload_size_formula(group):
    n = 1_000_003
    buf = gcodec.get_codec("terngrad", group_size=group).encode(
        np.random.default_rng(0).standard_normal(n).astype(np.float32)
    )
    ideal = (2 * n + 32 * (1 if group == 0 else -(-n // group))) / 8
    assert ideal <= len(buf) <= ideal * 1.01 + 256
