"""``uniform``: specs/codecs/uniform.md, with stochastic rounding and float16 scales (§9)."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases import edit

import gcodec

from . import quant_model as M

SIZES = [1, 7, 64, 65, 2047, 2049, 10007, 70001]


def _kw(bits, g, rounding, scale_dtype, seed, stream):
    return dict(
        rule="absmax",
        group_size=g,
        width=bits,
        qmax=2 ** (bits - 1) - 1,
        stochastic=rounding == "stochastic",
        seed=seed,
        stream=stream,
        scale_f16=scale_dtype == "float16",
    )


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("g", [1, 3, 64, 100, 2048, 3000, 70000])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("scale_dtype", ["float32", "float16"])
def test_payload_matches_the_spec_model(bits, g, rounding, scale_dtype):
    rng = np.random.default_rng(bits * 1000 + g)
    n = int(rng.choice(SIZES if g >= 64 else SIZES[:5]))
    x = (rng.standard_t(3, n) * 0.01).astype(np.float32)
    codec = gcodec.get_codec("uniform", bits=bits, group_size=g, rounding=rounding, scale_dtype=scale_dtype, seed=77)
    buf = codec.encode(x, step=5)
    _, sec = M.payload_sections(buf)
    sc, codes = M.scaled_sections(x, **_kw(bits, g, rounding, scale_dtype, 77, 5))
    assert sec["scales"].tobytes() == sc
    assert sec["codes"].tobytes() == codes
    scales = sec["scales"].astype(np.float32)
    np.testing.assert_array_equal(gcodec.decode(buf), M.scaled_decode(scales, codes, n, g, bits))


def test_float64_input_is_rounded_to_float32_first():
    x = np.random.default_rng(1).standard_normal(999) * (1 + 2.0**-40)
    c = gcodec.get_codec("uniform", bits=4, rounding="stochastic", seed=3)
    a = M.payload_sections(c.encode(x, step=1))[1]
    b = M.payload_sections(c.encode(x.astype(np.float32), step=1))[1]
    assert all(np.array_equal(a[k], b[k]) for k in ("scales", "codes"))


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("scale_dtype", ["float32", "float16"])
def test_nearest_error_is_at_most_half_a_step(bits, scale_dtype):
    """|y - x| <= s/2 up to float32 rounding: t = x/s and y = q*s each add a relative error of at
    most 2**-24 with |t| <= qmax, so |y - x| <= s/2 + 2 * qmax * s * 2**-24 <= s/2 * (1 + 2**-14)."""
    rng = np.random.default_rng(bits)
    x = (rng.standard_t(2, 50_000) * 1e-3).astype(np.float32)
    c = gcodec.get_codec("uniform", bits=bits, group_size=64, scale_dtype=scale_dtype)
    buf = c.encode(x)
    y = gcodec.decode(buf)
    s = np.repeat(M.payload_sections(buf)[1]["scales"].astype(np.float64), 64)[: x.size]
    err = np.abs(y.astype(np.float64) - x)
    assert (err <= s / 2 * (1 + 2.0**-14)).all()
    assert (err / s).max() > 0.49  # the bound is not vacuous: some errors come close to it


def test_float16_scale_is_the_smallest_float16_not_below_absmax_over_qmax():
    x = np.array([1.0, 0.3, -0.1, 1000.0, 1e-6, 3.0e-9, 0.0, 0.0], np.float32)
    buf = gcodec.get_codec("uniform", bits=8, group_size=2, scale_dtype="float16").encode(x)
    params, sec = M.payload_sections(buf)
    assert params["scale_dtype"] == "float16" and sec["scales"].dtype == np.float16
    for g, s16 in enumerate(sec["scales"]):
        want = np.float32(np.abs(x[2 * g : 2 * g + 2]).max()) / np.float32(127)
        assert np.float32(s16) >= want  # rounded up ...
        below = np.nextafter(s16, np.float16(0))
        assert want == 0 or np.float32(below) < want  # ... to the nearest float16 above
    assert sec["scales"][3] == 0  # an all-zero group keeps scale 0


def test_float16_scale_overflow_is_refused():
    x = np.array([65504.0 * 127 * 1.01, 1.0], np.float32)
    c = gcodec.get_codec("uniform", bits=8, scale_dtype="float16")
    with pytest.raises(gcodec.PayloadValueError, match="float16"):
        c.encode(x)
    gcodec.get_codec("uniform", bits=8).encode(x)  # float32 scales hold it


def test_float16_scales_halve_the_scale_overhead():
    x = np.ones(64 * 1000, np.float32)
    a = len(gcodec.get_codec("uniform", bits=4).encode(x))
    b = len(gcodec.get_codec("uniform", bits=4, scale_dtype="float16").encode(x))
    assert a - b == 2 * 1000


# ---- stochastic rounding ---------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 2])
def test_stochastic_rounding_is_unbiased(bits):
    """Mean of K decodes (streams 0..K-1) against x.

    Each decode of element i is one of the two grid points around x_i (an interval of length s_i,
    its group's scale) and has mean x_i (up to the 2**-17 s_i quantisation of the probability).
    Per element, Hoeffding with a union bound over n elements gives the half-width
    s_i * sqrt(ln(2n/1e-9) / 2K); over all nK draws the mean of (y - x)/s lies within
    sqrt(ln(2/1e-9) / 2nK) + 2**-17. Nearest rounding (error up to s/2 on most elements) or a
    systematic bias of 1% of a step would fail one of the two.
    """
    n, k = 2048, 300
    x = (np.random.default_rng(bits).standard_normal(n) * 0.05).astype(np.float32)
    c = gcodec.get_codec("uniform", bits=bits, group_size=64, rounding="stochastic", seed=11)
    mean, s = M.mean_decode_and_scales(c, x, k, 64)
    dev = mean - x
    assert (np.abs(dev) <= M.hoeffding_halfwidth(s, k, n)).all()
    assert abs(np.mean(dev / s)) <= float(M.hoeffding_halfwidth(1.0, k * n, 1)) + 2.0**-17


def test_stochastic_rounding_probability_is_the_fraction():
    """Groups of 64 whose absmax is 7 (bits=4: scale exactly 1) and whose other values are +-2.3
    (fraction 0.3 above the floor for +2.3, 0.7 for -2.3). Each element is an independent
    Bernoulli draw: with N draws the count of round-ups lies within 6 sd = 6 sqrt(N p (1-p)) of N p,
    where p is the fraction rounded to a multiple of 2**-16 (spec §9.4)."""
    ngroups = 4096
    x = np.full((ngroups, 64), 2.3, np.float32)
    x[:, 0] = 7.0
    x[1::2, 1:] = -2.3
    c = gcodec.get_codec("uniform", bits=4, group_size=64, rounding="stochastic", seed=5)
    y = gcodec.decode(c.encode(x, step=0))
    for sign, lo, frac in ((1, 2.0, np.float32(2.3) - np.float32(2)), (-1, -3.0, np.float32(-2.3) - np.float32(-3))):
        rows = y[0::2, 1:] if sign > 0 else y[1::2, 1:]
        assert set(np.unique(rows)) <= {lo, lo + 1}
        n = rows.size
        p = np.round(float(frac) * 65536) / 65536
        ups = int((rows == lo + 1).sum())
        assert abs(ups - n * p) <= 6 * np.sqrt(n * p * (1 - p))


def test_stochastic_error_is_below_one_step():
    x = (np.random.default_rng(3).standard_normal(20_000)).astype(np.float32)
    c = gcodec.get_codec("uniform", bits=2, group_size=64, rounding="stochastic")
    buf = c.encode(x)
    s = np.repeat(M.payload_sections(buf)[1]["scales"].astype(np.float64), 64)[: x.size]
    assert (np.abs(gcodec.decode(buf).astype(np.float64) - x) <= s * (1 + 2.0**-20)).all()


def test_stochastic_values_on_the_grid_stay_exact():
    """t with no fractional part is never moved: x = k * s decodes to itself whatever the draws."""
    x = np.tile(np.array([7, -7, 3, 0, -1, 2, 5, -6], np.float32), 100)
    c = gcodec.get_codec("uniform", bits=4, group_size=8, rounding="stochastic", seed=1)
    for step in range(5):
        np.testing.assert_array_equal(gcodec.decode(c.encode(x, step=step)), x)


# ---- header ----------------------------------------------------------------------------------


def test_stream_is_recorded_only_for_stochastic_rounding():
    x = np.ones(10, np.float32)
    p1 = gcodec.validate(gcodec.get_codec("uniform").encode(x, step=3)).params
    assert "stream" not in p1 and p1["seed"] == 0
    p2 = gcodec.validate(gcodec.get_codec("uniform", rounding="stochastic", seed=9).encode(x, step=3)).params
    assert p2["stream"] == 3 and p2["seed"] == 9


def _with_params(buf, **changes):
    def f(h):
        for k, v in changes.items():
            if v is None:
                del h["tensors"][0]["params"][k]
            else:
                h["tensors"][0]["params"][k] = v

    return edit(bytes(buf), header=f)


@pytest.mark.parametrize(
    "rounding, changes",
    [
        ("stochastic", {"stream": None}),  # stochastic payloads must say their stream
        ("nearest", {"stream": 0}),  # nearest ones must not have one
        ("stochastic", {"stream": -1}),
        ("stochastic", {"stream": 1.0}),
        ("stochastic", {"seed": "0"}),
        ("nearest", {"scale_dtype": "float64"}),
        ("nearest", {"rounding": "up"}),
    ],
)
def test_header_rule_c1(rounding, changes):
    buf = gcodec.get_codec("uniform", rounding=rounding).encode(np.ones(5, np.float32))
    bad = _with_params(buf, **changes)
    for f in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.HeaderError, match="C1"):
            f(bad)


def test_float16_scales_change_the_section_type():
    buf = gcodec.get_codec("uniform", scale_dtype="float16").encode(np.ones(100, np.float32))
    info = gcodec.validate(buf)
    assert [s[:2] for s in info.tensors[0].sections] == [("scales", "f2"), ("codes", "u1")]
    bad = _with_params(buf, scale_dtype="float32")  # section table no longer matches
    with pytest.raises(gcodec.SizeMismatchError):
        gcodec.validate(bad)


# ---- value rules -----------------------------------------------------------------------------


def _set_scale16(buf, g, bits16):
    info = gcodec.validate(buf)
    off = info.tensors[0].sections[0][2]
    return edit(
        bytes(buf), data=lambda d: d.__setitem__(slice(off + 2 * g, off + 2 * g + 2), bits16.to_bytes(2, "little"))
    )


@pytest.mark.parametrize("bits16", [0x7C00, 0xFC00, 0x7E00, 0x8000, 0xBC00])
def test_u1_float16_scales(bits16):
    buf = gcodec.get_codec("uniform", scale_dtype="float16").encode(np.arange(200, dtype=np.float32))
    bad = _set_scale16(buf, 1, bits16)
    for f in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.PayloadValueError, match="U1"):
            f(bad)


def test_accumulate_adds_and_a_bad_payload_leaves_out_untouched():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    c = gcodec.get_codec("uniform", bits=4, rounding="stochastic")
    buf = c.encode(x)
    out = np.ones(1000, np.float32)
    gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(out, np.float32(1) + gcodec.decode(buf))
    info = gcodec.validate(buf)
    off = info.tensors[0].sections[1][2]
    bad = edit(bytes(buf), data=lambda d: d.__setitem__(off + 499, 0x88))  # two -8 codes
    before = out.copy()
    with pytest.raises(gcodec.PayloadValueError, match="U2"):
        gcodec.decode(bad, out=out, accumulate=True)
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("bits, scale_dtype", [(8, "float32"), (4, "float32"), (2, "float16"), (4, "float16")])
@pytest.mark.parametrize("n", [1000, 1_000_003])
def test_payload_size_formula(bits, scale_dtype, n):
    """Within 1% + 256 bytes of (bits * n + scale bits * ngroups) / 8, and never below it."""
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    buf = gcodec.get_codec("uniform", bits=bits, scale_dtype=scale_dtype, rounding="stochastic").encode(x)
    ideal = (bits * n + (16 if scale_dtype == "float16" else 32) * -(-n // 64)) / 8
    assert ideal <= len(buf) <= ideal * 1.01 + 256
