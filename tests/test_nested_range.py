"""Hybrids on inputs beyond a nested codec's range (specs/codecs/hybrid.md §3.1).

An encoder never writes a payload that its own decoder refuses. The host rules T4 (``topk``), TH4
(``threshold``), R2 (``randomk``) and P3 (``powersgd``) refuse a nested value that decodes to
±infinity, and P4 a factor product that could overflow, so the host refuses such input on encode
with ``PayloadValueError``: a kept value of magnitude >= 65520 with ``fp16`` values (it would round
to infinity, as a plain ``fp16`` payload carries it), >= 3.3961775e38 with ``bf16`` values. Every
other input either encodes to a payload that validates and decodes, or is refused with a
``GcodecError``: that is checked for every host with every codec that nests, on wide-range inputs
(magnitudes log-uniform from 1e-30 to 3e38, the edges of binary16, bfloat16 and binary32).
"""

from __future__ import annotations

import numpy as np
import pytest

import gcodec
from gcodec import PayloadValueError
from gcodec.arrays import DTYPES
from gcodec.codecs import registry
from gcodec.codecs.base import Codec, EncodePlan
from gcodec.codecs.randomk import randomk_indices
from gcodec.sections import SectionSpec
from tests.codec_kit import (
    FLT_MAX,
    NESTED_CASES,
    NESTED_CODECS,
    RANGE_EDGES_F64,
    check_encoder,
    missing_nested,
    serial_kernels,
    wide_input,
)


@pytest.fixture(autouse=True, scope="module")
def _one_kernel_thread():
    yield from serial_kernels()


F16_OVERFLOW_F64 = RANGE_EDGES_F64[0]  # 65519.998046875: the smallest binary64 that rounds to 65520
BF16_TIE = float(np.array(0x7F7F8000, np.uint32).view(np.float32))  # rounds to bfloat16 infinity
BF16_MAX = float(np.array(0x7F7F0000, np.uint32).view(np.float32))
HOSTS = [("topk", {"k": 3}, "T4"), ("threshold", {"threshold": 0.5}, "TH4"), ("randomk", {"k": 4}, "R2")]


def _nid(cfg: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg.items())


def _sparse(host: str, params: dict, values: str) -> gcodec.Codec:
    return gcodec.get_codec(host, values={"id": values}, **params)


# ---------------------------------------------------------------------------------------------
# what a nested codec promises: Codec.magnitude_bound


def test_every_codec_that_nests_is_listed():
    assert missing_nested() == [], "add these codecs to tests/codec_kit.py NESTED_CODECS"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("pattern", ["wide", "edges", "scaled"])
@pytest.mark.parametrize("cfg", NESTED_CODECS, ids=_nid)
def test_decoded_values_stay_within_the_codec_bound(cfg, pattern, dtype):
    """What a codec decodes is never larger than its bound for the largest input magnitude, and the
    bound is infinite whenever what it decodes is (fp16, bf16 beyond their range)."""
    codec = gcodec.get_codec(cfg)
    for seed in range(4):
        x = wide_input((97,), dtype, seed, pattern)
        bound = codec.magnitude_bound(float(np.abs(x).max()), x.size)
        try:
            y = gcodec.decode(codec.encode(x, step=0)).astype(np.float64)
        except PayloadValueError:
            continue  # the codec refuses what it cannot represent
        assert np.abs(y).max() <= bound, (seed, np.abs(y).max(), bound)
        if not np.isfinite(y).all():
            assert bound == np.inf


@pytest.mark.parametrize("cid", ["fp16", "bf16"])
def test_cast_codec_bound_is_infinite_exactly_from_the_overflow(cid):
    codec = gcodec.get_codec(cid)
    tie, largest = (65520.0, 65504.0) if cid == "fp16" else (BF16_TIE, BF16_MAX)
    below = float(np.nextafter(np.float32(tie), np.float32(0)))
    assert codec.magnitude_bound(tie, 1) == np.inf
    assert codec.magnitude_bound(below, 1) == largest
    # float64 input is rounded to binary32 first: its last value below the binary32 tie is finite
    f64 = F16_OVERFLOW_F64 if cid == "fp16" else RANGE_EDGES_F64[2]
    assert codec.magnitude_bound(f64, 1) == np.inf
    assert codec.magnitude_bound(float(np.nextafter(f64, 0)), 1) == largest
    y = gcodec.decode(codec.encode(np.array([below, tie, f64, np.nextafter(f64, 0)], np.float64)))
    assert y.tolist() == [largest, np.inf, np.inf, largest]


def test_a_codec_that_bounds_nothing_cannot_nest(monkeypatch):
    class Unbounded(Codec):
        codec_id = "unbounded"

        def plan(self, x, ctx):  # pragma: no cover - never encodes here
            return EncodePlan({}, [SectionSpec("data", "f4", 4 * x.size)], lambda v: None)

        @classmethod
        def expected_sections(cls, params, shape):  # pragma: no cover
            return []

        @classmethod
        def decode_into(cls, params, entry, views, out, accumulate):  # pragma: no cover
            pass

    monkeypatch.setitem(registry._REGISTRY, "unbounded", Unbounded)
    with pytest.raises(gcodec.ConfigError, match="does not bound"):
        gcodec.get_codec("topk", values={"id": "unbounded"})
    with pytest.raises(gcodec.ConfigError, match="does not bound"):
        gcodec.get_codec("powersgd", factors={"id": "unbounded"})


# ---------------------------------------------------------------------------------------------
# sparse hosts: a kept value that fp16 / bf16 would decode to infinity is refused on encode


def test_topk_with_fp16_values_refuses_a_million():
    """The conformance report: 129 kept values up to 1e6 through fp16 values."""
    x = np.linspace(-1e6, 1e6, 1000).astype(np.float32)
    codec = gcodec.get_codec("topk", k=129, values={"id": "fp16"})
    with pytest.raises(PayloadValueError, match=r"topk: 129 kept value\(s\) of tensor 'layer1' .*65520.*T4"):
        codec.encode(x, key="layer1")


@pytest.mark.parametrize("host,params,rule", HOSTS, ids=[h[0] for h in HOSTS])
def test_fp16_values_keep_65504_and_refuse_65520(host, params, rule):
    """fp16.md §3: |v| >= 65520 rounds to infinity, 65519.996 to 65504."""
    base = np.array([0.25, -0.5, 0.125], np.float32)
    for ok in (65504.0, -65519.99609375):
        y = gcodec.decode(_sparse(host, params, "fp16").encode(np.append(base, ok).astype(np.float32), step=0))
        assert np.abs(y).max() == 65504.0 and np.isfinite(y).all()
    with pytest.raises(PayloadValueError, match=rule):
        _sparse(host, params, "fp16").encode(np.append(base, -65520.0).astype(np.float32), step=0)


@pytest.mark.parametrize("host,params,rule", HOSTS, ids=[h[0] for h in HOSTS])
def test_fp16_values_of_float64_input_round_to_binary32_first(host, params, rule):
    base = np.array([0.25, -0.5, 0.125])
    y = gcodec.decode(_sparse(host, params, "fp16").encode(np.append(base, np.nextafter(F16_OVERFLOW_F64, 0)), step=0))
    assert np.abs(y).max() == 65504.0
    for bad in (F16_OVERFLOW_F64, 1e300):
        with pytest.raises(PayloadValueError, match=rule):
            _sparse(host, params, "fp16").encode(np.append(base, bad), step=0)


@pytest.mark.parametrize("host,params,rule", HOSTS, ids=[h[0] for h in HOSTS])
def test_bf16_values_refuse_the_values_that_round_to_infinity(host, params, rule):
    """bf16.md §3: from 0x7F7F8000 up (FLT_MAX included) the rounding gives infinity."""
    base = np.array([0.25, -0.5, 0.125], np.float32)
    below = float(np.nextafter(np.float32(BF16_TIE), np.float32(0)))
    y = gcodec.decode(_sparse(host, params, "bf16").encode(np.append(base, below).astype(np.float32), step=0))
    assert np.abs(y).max() == BF16_MAX
    for bad in (BF16_TIE, -FLT_MAX):
        with pytest.raises(PayloadValueError, match=rule):
            _sparse(host, params, "bf16").encode(np.append(base, bad).astype(np.float32), step=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_tensors_overflow_fp16_values_only_when_they_can(dtype):
    """A float16 tensor never exceeds 65504; a bfloat16 one can (65536 is a bfloat16 value)."""
    x = np.array([1.0, -65504.0, 2.0, 65536.0 if dtype == "bfloat16" else 3.0]).astype(DTYPES[dtype])
    codec = gcodec.get_codec("topk", k=2, values={"id": "fp16"})
    if dtype == "float16":
        assert np.isfinite(gcodec.decode(codec.encode(x)).astype(np.float32)).all()
    else:
        with pytest.raises(PayloadValueError, match="T4"):
            codec.encode(x)


def test_topk_and_threshold_judge_only_the_values_they_keep():
    x = np.array([1e5, 2.0, -3.0, 0.5], np.float32)
    for codec in (
        gcodec.get_codec("topk", k=0, values={"id": "fp16"}),
        gcodec.get_codec("threshold", threshold=1e6, values={"id": "fp16"}),  # 1e5 stays below t
    ):
        y = gcodec.decode(codec.encode(x))
        assert not y.any()


def test_randomk_refuses_an_out_of_range_element_even_when_it_is_not_drawn():
    """As for NaN (randomk.md §4): whether a tensor is refused does not depend on the stream."""
    x = np.linspace(-1, 1, 100).astype(np.float32)
    codec = gcodec.get_codec("randomk", k=5, seed=1, values={"id": "fp16"})
    drawn = randomk_indices(100, 5, 1, 0)
    far = next(i for i in range(100) if i not in set(drawn.tolist()))
    x[far] = 1e6
    with pytest.raises(PayloadValueError, match=r"randomk: 1 element\(s\).*R2"):
        codec.encode(x, step=0)


def test_quantized_values_are_refused_by_the_nested_codec_itself():
    """uniform refuses a group whose scale * 127 overflows (U1): its own rule, not the host's."""
    x = np.array([FLT_MAX, 1.0, -2.0], np.float32)
    with pytest.raises(PayloadValueError, match="uniform: input too large"):
        gcodec.get_codec("topk", k=2, values={"id": "uniform"}).encode(x)
    y = gcodec.decode(gcodec.get_codec("topk", k=2, values={"id": "bf16"}).encode(x / 2))
    assert np.isfinite(y).all()


# ---------------------------------------------------------------------------------------------
# powersgd: nested factors (P3: finite, P4: bounded product) are judged as they will decode


def _rank1(scale: float, dtype=np.float32) -> np.ndarray:
    u = np.linspace(0.5, 1.0, 16)
    return (np.outer(u, np.linspace(-1.0, 1.0, 12)) * scale).astype(dtype)


def test_powersgd_refuses_fp16_factors_beyond_65504():
    codec = gcodec.get_codec("powersgd", rank=1, min_compression_rate=0.0, factors={"id": "fp16"})
    assert np.isfinite(gcodec.decode(codec.encode(_rank1(1e3)))).all()
    with pytest.raises(PayloadValueError, match=r"factor Q of tensor 'w' .*'fp16'.*P3"):
        codec.encode(_rank1(1e5), key="w")


def _p4_edge() -> np.ndarray:
    """A rank-1 matrix with max|M| = 2^127 (1 - 2^-12): its raw factors meet P4 with a margin of
    2^-12 (for rank 1, max|P| * max|Q| = max|M| in exact arithmetic). The margin is far above what
    the float32 products and the orthogonalisation round (a few 2^-24 each, in whatever order the
    BLAS sums: at exactly 2^127 the raw factors broke P4 with one numpy build and not another), and
    below what the nested codecs add (bf16 rounds each factor by up to 2^-9)."""
    rng = np.random.default_rng(2)
    m = np.outer(rng.standard_normal(6), rng.standard_normal(5))
    return (m / np.abs(m).max() * (2.0**127 * (1 - 2.0**-12))).astype(np.float32)


@pytest.mark.parametrize("factors", [{"id": "bf16"}, {"id": "qsgd", "levels": 1, "bucket_size": 0}], ids=_nid)
def test_powersgd_judges_p4_on_the_factors_as_decoded(factors):
    """The nested codec rounds the factors up (bf16) or decodes an element of P to its bucket's
    norm (qsgd): rank * max|P| * max|Q| as decoded could exceed 2^127, which P4 refuses, so the
    encoder refuses the input. Half of it passes."""
    x = _p4_edge()
    gcodec.validate(gcodec.get_codec("powersgd", rank=1, min_compression_rate=0.0).encode(x))
    nested = gcodec.get_codec("powersgd", rank=1, min_compression_rate=0.0, factors=factors, warm_start=False)
    with pytest.raises(PayloadValueError, match="P4"):
        nested.encode(x)
    scale = 0.5 if factors["id"] == "bf16" else 2.0**-4  # qsgd: P's bucket norm is sqrt(6) * max|P| at most
    assert np.isfinite(gcodec.decode(nested.encode(x * np.float32(scale)))).all()


def test_powersgd_refused_input_keeps_the_warm_start():
    """A refused input does not become the key's warm start (docs/nonfinite.md): neither when the
    raw factors break P4, nor when the nested codec refuses its factor while it is written."""
    rng = np.random.default_rng(3)
    good = [rng.standard_normal((16, 12)).astype(np.float32) for _ in range(2)]
    one_row = np.zeros((16, 12), np.float32)
    one_row[0] = 2e38  # P = e_0 and Q = that row: finite factors, max|P| * max|Q| = 2e38 > 2^127
    for factors, bad in (
        (None, one_row),  # P4 on the raw factors
        ({"id": "fp16"}, _rank1(1e5)),  # P3 through the nested fp16
        ({"id": "uniform", "scale_dtype": "float16"}, _rank1(1e9)),  # a scale beyond binary16 (U1)
    ):
        a = gcodec.get_codec("powersgd", rank=1, min_compression_rate=0.0, factors=factors)
        b = gcodec.get_codec("powersgd", rank=1, min_compression_rate=0.0, factors=factors)
        a.encode(good[0], key="w")
        b.encode(good[0], key="w")
        with pytest.raises(PayloadValueError):
            a.encode(bad, key="w")
        assert bytes(a.encode(good[1], key="w")) == bytes(b.encode(good[1], key="w")), factors


# ---------------------------------------------------------------------------------------------
# error feedback around a hybrid that refuses


@pytest.mark.parametrize(
    "cfg",
    [
        {"id": "topk", "k": 4, "values": {"id": "fp16"}},
        {"id": "threshold", "threshold": 0.5, "values": {"id": "fp16"}},
        {"id": "randomk", "k": 4, "values": {"id": "bf16"}},
        {"id": "powersgd", "rank": 1, "min_compression_rate": 0.0, "factors": {"id": "fp16"}},
    ],
    ids=lambda c: f"{c['id']}-{(c.get('values') or c.get('factors'))['id']}",
)
def test_error_feedback_keeps_the_residual_when_a_nested_value_would_overflow(cfg):
    nested = (cfg.get("values") or cfg["factors"])["id"]
    big = 1e5 if nested == "fp16" else FLT_MAX
    rng = np.random.default_rng(0)
    x1, x3 = (rng.standard_normal((16, 12)).astype(np.float32) for _ in range(2))
    bad = _rank1(big) if cfg["id"] == "powersgd" else np.full((16, 12), big, np.float32)
    ef, twin = gcodec.ErrorFeedback(cfg), gcodec.ErrorFeedback(cfg)
    ef.encode(x1, key="w", step=1)
    twin.encode(x1, key="w", step=1)
    before = ef.residual("w")
    with pytest.raises(PayloadValueError, match="beyond the range of the nested"):  # refused on encode
        ef.encode(bad, key="w", step=2)
    np.testing.assert_array_equal(ef.residual("w"), before)
    # the next step is the one a run without the refused step takes
    assert bytes(ef.encode(x3, key="w", step=3)) == bytes(twin.encode(x3, key="w", step=3))
    np.testing.assert_array_equal(ef.residual("w"), twin.residual("w"))


# ---------------------------------------------------------------------------------------------
# every host with every nested codec: an encoder writes what its decoder accepts, or refuses


# decoding a float16 tensor rounds what bf16 values decode to (65504 -> 65536) into float16: infinity,
# as any 16-bit arithmetic overflows (docs/nonfinite.md); numpy warns about it
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("case", NESTED_CASES, ids=lambda c: c.id)
def test_encoder_writes_only_payloads_that_decode(case):
    """Every dtype, wide-range inputs with fixed seeds: a GcodecError, or a payload that validates and
    decodes. Each case meets both outcomes, so the sweep is not vacuous."""
    outcomes = set()
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        for pattern in ("wide", "edges", "scaled"):
            for seed in range(3):
                outcomes.add(check_encoder(case, wide_input(case.shape, dtype, seed, pattern)))
    assert outcomes == {"refused", "valid"}
