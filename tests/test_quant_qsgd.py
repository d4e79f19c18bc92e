"""``qsgd``: specs/codecs/qsgd.md."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases import edit

import gcodec
from gcodec.codecs.qsgd import code_width

from . import quant_model as M


def _model(x, levels, bucket, seed, stream):
    return M.scaled_sections(
        x,
        rule="l2",
        group_size=bucket,
        width=code_width(levels),
        qmax=levels,
        stochastic=True,
        seed=seed,
        stream=stream,
    )


@pytest.mark.parametrize("levels", [1, 2, 3, 7, 15, 31, 100, 127])
@pytest.mark.parametrize("bucket", [0, 1, 7, 512, 3000, 70000])
def test_payload_matches_the_spec_model(levels, bucket):
    rng = np.random.default_rng(levels * 7 + bucket)
    n = int(rng.choice([1, 9, 513, 2049, 10007, 140001 if bucket >= 64 or bucket == 0 else 3001]))
    x = (rng.standard_t(3, n) * 0.01).astype(np.float32)
    buf = gcodec.get_codec("qsgd", levels=levels, bucket_size=bucket, seed=21).encode(x, step=8)
    params, sec = M.payload_sections(buf)
    assert params == {"levels": levels, "bucket_size": bucket, "seed": 21, "stream": 8}
    sc, codes = _model(x, levels, bucket, 21, 8)
    assert sec["scales"].tobytes() == sc
    assert sec["codes"].tobytes() == codes
    np.testing.assert_array_equal(
        gcodec.decode(buf), M.scaled_decode(sec["scales"], codes, n, bucket, code_width(levels))
    )


@pytest.mark.parametrize(
    "levels, width", [(1, 2), (2, 3), (3, 3), (4, 4), (7, 4), (8, 5), (15, 5), (16, 6), (63, 7), (64, 8), (127, 8)]
)
def test_codes_take_the_fewest_bits_holding_sign_and_level(levels, width):
    """2*levels + 1 values need ceil(log2(2 levels + 1)) bits; the spec's 1 + bit_length(levels) equals it."""
    assert code_width(levels) == width == int(np.ceil(np.log2(2 * levels + 1)))
    n = 4096
    buf = gcodec.get_codec("qsgd", levels=levels, bucket_size=512).encode(np.ones(n, np.float32))
    info = gcodec.validate(buf)
    assert info.tensors[0].sections[1][3] == n * width // 8


def _stats(x, levels, bucket, k, seed=0):
    """Mean decode, mean squared error ||Q(x) - x||^2, and the payload's steps d per element."""
    c = gcodec.get_codec("qsgd", levels=levels, bucket_size=bucket, seed=seed)
    acc = np.zeros(x.size)
    sq = np.zeros(k)
    d = None
    for step in range(k):
        buf = c.encode(x, step=step)
        y = gcodec.decode(buf).astype(np.float64)
        acc += y
        sq[step] = ((y - x) ** 2).sum()
        if d is None:
            d = np.repeat(M.payload_sections(buf)[1]["scales"].astype(np.float64), bucket)[: x.size]
    return acc / k, sq, d


@pytest.mark.parametrize("levels", [1, 15])
def test_unbiased(levels):
    """Each decode of x_i is one of the two multiples of d around it (an interval of length d),
    with mean x_i up to 2**-17 d: Hoeffding per element with a union bound over n elements."""
    n, k, bucket = 2048, 300, 256
    x = (np.random.default_rng(levels).standard_normal(n)).astype(np.float32)
    mean, _, d = _stats(x, levels, bucket, k)
    dev = mean - x
    assert (np.abs(dev) <= M.hoeffding_halfwidth(d, k, n)).all()
    assert abs(np.mean(dev / d)) <= float(M.hoeffding_halfwidth(1.0, k * n, 1)) + 2.0**-17


@pytest.mark.parametrize("levels", [1, 3, 15])
@pytest.mark.parametrize("dist", ["normal", "laplace"])
def test_variance_within_the_papers_bound(levels, dist):
    """QSGD Lemma 3.1: E||Q(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2 for each bucket of d elements.

    The exact expectation is computable from the payload: element i rounds between lo = floor(t) d
    and lo + d with P(up) = p_i (its fraction, to 2**-16), so E = sum p (hi - x)^2 + (1 - p)(lo - x)^2
    and Var(||Q - v||^2) = sum of the per-element variances. The test checks (a) E is within the
    bound (the algorithm), (b) the mean over K encodes is within 6 standard errors of E (the code
    draws what the spec says), and therefore (c) the empirical variance respects the bound.
    """
    n, k, bucket = 4096, 200, 512
    rng = np.random.default_rng(levels)
    x = (rng.standard_normal(n) if dist == "normal" else rng.laplace(size=n)).astype(np.float32)
    _, sq, d = _stats(x, levels, bucket, k, seed=3)
    t = np.minimum(np.abs(x) / d, levels)
    lo = np.floor(t) * d
    p = np.round((t - np.floor(t)) * 65536) / 65536
    a, b = (lo + d - np.abs(x)) ** 2, (lo - np.abs(x)) ** 2
    expect = p * a + (1 - p) * b
    var = p * a**2 + (1 - p) * b**2 - expect**2
    xb = x.astype(np.float64).reshape(-1, bucket)
    bound = (np.minimum(bucket / levels**2, np.sqrt(bucket) / levels) * (xb**2).sum(axis=1)).sum()
    assert expect.sum() <= bound
    assert abs(sq.mean() - expect.sum()) <= 6 * np.sqrt(var.sum() / k) + 1e-9 * expect.sum()
    assert sq.mean() <= bound * (1 + 6 * np.sqrt(var.sum() / k) / expect.sum())


def test_bucket_of_zeros_and_whole_tensor_norm():
    x = np.zeros(1024, np.float32)
    x[600] = -3.0
    buf = gcodec.get_codec("qsgd", levels=7, bucket_size=512).encode(x)
    sec = M.payload_sections(buf)[1]
    assert sec["scales"][0] == 0 and sec["scales"][1] == np.float32(3.0) / np.float32(7)
    np.testing.assert_array_equal(gcodec.decode(buf), x)  # |x| = norm: t = s exactly, no randomness
    buf = gcodec.get_codec("qsgd", levels=7, bucket_size=0).encode(x)
    assert M.payload_sections(buf)[1]["scales"].size == 1


@pytest.mark.parametrize("levels", [0, 128, 2.0, True])
def test_levels_range(levels):
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("qsgd", levels=levels)


def test_non_finite_input_is_refused():
    x = np.ones(100, np.float32)
    x[50] = np.inf
    with pytest.raises(gcodec.PayloadValueError):
        gcodec.get_codec("qsgd").encode(x)


def _sections_offsets(buf):
    return {s[0]: s[2] for s in gcodec.validate(buf).tensors[0].sections}


def test_q1_scale_rules():
    buf = gcodec.get_codec("qsgd", bucket_size=8).encode(np.arange(20, dtype=np.float32))
    off = _sections_offsets(buf)["scales"]
    for val in (np.float32(np.nan), np.float32(-1.0), np.float32(-0.0), np.float32(np.inf)):
        bad = edit(bytes(buf), data=lambda d, v=val: d.__setitem__(slice(off + 4, off + 8), v.tobytes()))
        for f in (gcodec.validate, gcodec.decode):
            with pytest.raises(gcodec.PayloadValueError, match="Q1"):
                f(bad)


@pytest.mark.parametrize("byte", [0x06, 0x0A, 0x08])  # +6 and -6 exceed levels=5; -8 too
def test_q2_codes_beyond_levels(byte):
    buf = gcodec.get_codec("qsgd", levels=5, bucket_size=8).encode(np.ones(20, np.float32))  # 4-bit codes
    off = _sections_offsets(buf)["codes"]
    bad = edit(bytes(buf), data=lambda d: d.__setitem__(off + 3, byte))
    for f in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.PayloadValueError, match="Q2"):
            f(bad)
    out = np.zeros(20, np.float32)
    with pytest.raises(gcodec.PayloadValueError, match="Q2"):
        gcodec.decode(bad, out=out, accumulate=True)
    assert not out.any()


def test_q3_unused_bits():
    buf = gcodec.get_codec("qsgd", levels=15).encode(np.ones(3, np.float32))  # 15 bits in 2 bytes
    off = _sections_offsets(buf)["codes"]
    bad = edit(bytes(buf), data=lambda d: d.__setitem__(off + 1, d[off + 1] | 0x80))
    with pytest.raises(gcodec.PayloadValueError, match="Q3"):
        gcodec.validate(bad)


@pytest.mark.parametrize("levels, bucket", [(15, 512), (1, 0), (127, 2048), (7, 64)])
def test_payload_size_formula(levels, bucket):
    n = 1_000_003
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    buf = gcodec.get_codec("qsgd", levels=levels, bucket_size=bucket).encode(x)
    ngroups = 1 if bucket == 0 else -(-n // bucket)
    ideal = (code_width(levels) * n + 32 * ngroups) / 8
    assert ideal <= len(buf) <= ideal * 1.01 + 256
