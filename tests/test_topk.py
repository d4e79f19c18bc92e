"""``topk`` (specs/codecs/topk.md): exact selection, index coding, decoding, and every rule."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from vector_cases.sparse import INVALID, TOPK_EXAMPLE, pack_gaps, unpack_gaps

import gcodec
from gcodec.api import _checked
from gcodec.arrays import BFLOAT16, DTYPES
from gcodec.kernels.cpu import sparse as sparse_cpu

from .rules import assert_refused

SMALL = sparse_cpu._SMALL  # below this the kernel selects on all keys; above it samples first


def reference(x: np.ndarray, k: int) -> np.ndarray:
    """The spec's selection, by sorting: k largest |x|, ties to the lowest index; returned increasing."""
    a = np.abs(x.astype(np.float64).reshape(-1))
    order = np.lexsort((np.arange(a.size), -a))
    return np.sort(order[:k])


def indices_of(buf) -> np.ndarray:
    p, checked = _checked(buf, None, full=True)
    e, cls, params = checked[0]
    return cls._decode_indices(params, e, p.views(e))


def section(buf, name: str) -> np.ndarray:
    p, checked = _checked(buf, None, full=True)
    return p.views(checked[0][0])[name]


def check_exact(x: np.ndarray, k: int, **kw) -> None:
    buf = gcodec.get_codec("topk", k=k, **kw).encode(x)
    want = reference(x, k)
    got = indices_of(buf)
    np.testing.assert_array_equal(got, want)
    y = gcodec.decode(buf)
    expect = np.zeros_like(x).reshape(-1)
    expect[want] = x.reshape(-1)[want]
    np.testing.assert_array_equal(y.reshape(-1).view(np.uint8), expect.view(np.uint8))  # bit-exact values


# ---------------------------------------------------------------------------------------------
# selection: exact k against numpy


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n", [1, 7, 1000, SMALL + 1, 300_001])
def test_exact_k_random(dtype, n):
    rng = np.random.default_rng(n)
    x = rng.standard_t(3, n).astype(DTYPES[dtype])
    for k in sorted({0, 1, n // 100, n // 7, n - 1, n}):
        check_exact(x, k)


@pytest.mark.parametrize("n", [500, 200_000])
def test_many_ties(n):
    """Values from {-3..3}: most of the k-th magnitude's ties are cut, lowest indices first."""
    x = np.random.default_rng(1).integers(-3, 4, n).astype(np.float32)
    for k in (1, n // 100, n // 3, n // 2 + 17):
        check_exact(x, k)


@pytest.mark.parametrize("n", [100, 100_000])
def test_all_zeros_and_constants(n):
    for x in (np.zeros(n, np.float32), np.full(n, -2.5, np.float32), np.zeros(n, np.float64)):
        for k in (0, 1, n // 100, n):
            check_exact(x, k)
    # -0.0 and +0.0 have the same magnitude: a tie, broken by index
    z = np.array([-0.0, 0.0, -0.0, 1.0], np.float32)
    check_exact(z, 2)
    np.testing.assert_array_equal(indices_of(gcodec.get_codec("topk", k=2).encode(z)), [0, 3])


@pytest.mark.parametrize("n", [1000, 300_000])
def test_structured_inputs(n):
    """Inputs that defeat a sampled threshold: sorted, reversed, a spike of equal large values, denormals."""
    ramp = np.arange(n, dtype=np.float32)
    spike = np.zeros(n, np.float32)
    spike[::37] = 5.0  # ~n/37 ties at the top, k cuts through them
    tiny = (np.random.default_rng(2).standard_normal(n) * 1e-42).astype(np.float32)  # subnormals
    for x in (ramp, ramp[::-1].copy(), spike, tiny):
        for k in (1, n // 100, n // 50):
            check_exact(x, k)


def test_k_equals_n_and_zero_cost():
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    buf = gcodec.get_codec("topk", k=1000).encode(x)
    np.testing.assert_array_equal(gcodec.decode(buf), x)
    assert gcodec.validate(buf).tensors[0].sections[1][3] == 0  # all gaps 0: width 0, no index bytes
    buf0 = gcodec.get_codec("topk", k=0).encode(x)
    assert not gcodec.decode(buf0).any()


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("n", [10, 100_000])
def test_nonfinite_input_is_rejected(special, n):
    """Spec section 2: NaN and infinities are rejected, whatever k is and wherever they sit."""
    for where in (0, n // 2, n - 1):
        x = np.ones(n, np.float32)
        x[where] = special
        for k in (0, 1, n // 10, n):
            with pytest.raises(gcodec.PayloadValueError, match="NaN or infinite"):
                gcodec.get_codec("topk", k=k).encode(x)


def test_ratio_to_k():
    c = gcodec.get_codec("topk", ratio=0.01)
    assert [c.k_for(n) for n in (0, 1, 99, 100, 1000, 16_777_216)] == [0, 1, 1, 1, 10, 167_772]
    assert gcodec.get_codec("topk", k=50).k_for(10) == 10
    assert gcodec.get_codec("topk").params["ratio"] == 0.01
    for bad in ({"ratio": 0.0}, {"ratio": 1.5}, {"ratio": 0.1, "k": 3}, {"k": -1}, {"index_coding": "x"}):
        with pytest.raises(gcodec.ConfigError):
            gcodec.get_codec("topk", **bad)


# ---------------------------------------------------------------------------------------------
# index coding


def test_worked_example():
    """specs/codecs/topk.md section 5: k=3 of TOPK_EXAMPLE."""
    buf = gcodec.get_codec("topk", k=3).encode(TOPK_EXAMPLE)
    info = gcodec.validate(buf)
    assert info.params == {"k": 3, "index_coding": "delta", "index_bytes": 1, "values": None}
    assert bytes(section(buf, "index_widths")) == b"\x01"
    assert bytes(section(buf, "indices")) == b"\x03"  # gaps 1, 1, 0 at width 1, LSB first
    np.testing.assert_array_equal(section(buf, "values"), np.array([-3.0, 2.0, -2.0], np.float32))


def test_delta_coding_matches_reference_implementation():
    rng = np.random.default_rng(4)
    for n, k in ((10, 10), (1000, 1), (1 << 22, 300), (5000, 129), (1 << 30, 70)):
        idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
        widths = np.empty((k + 63) // 64, np.uint8)
        nbytes = sparse_cpu.delta_widths(idx, widths)
        packed = np.zeros(nbytes, np.uint8)
        assert sparse_cpu.delta_pack(idx, widths, packed) == nbytes
        ref_w, ref_p = pack_gaps(idx.tolist())
        assert bytes(widths) == ref_w and bytes(packed) == ref_p
        assert unpack_gaps(ref_w, ref_p, k) == idx.tolist()
        back = np.empty(k, np.int64)
        assert sparse_cpu.delta_unpack(packed, widths, k, n, back) == (sparse_cpu.OK, 0)
        np.testing.assert_array_equal(back, idx)


def test_index_bits_at_one_percent():
    """Index coding target (specs/codecs/topk.md): <= 10 index bits per kept element at 1 % density (32 raw).

    Gaps of a uniform 1 % subset are ~geometric (p = 0.01); a block of 64 gaps needs 9 bits with
    probability (1 - 0.99**512)**64 = 0.69 and 10 bits in nearly all other blocks, plus one width
    byte per 64 indices: about 9.4 bits.
    """
    n = 1 << 21
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    info = gcodec.validate(gcodec.get_codec("topk", ratio=0.01).encode(x))
    k = info.params["k"]
    sec = {s[0]: s[3] for s in info.tensors[0].sections}
    bits = 8 * (sec["index_widths"] + sec["indices"]) / k
    assert 9.0 < bits <= 10.0, bits
    raw = gcodec.validate(gcodec.get_codec("topk", ratio=0.01, index_coding="raw").encode(x))
    assert {s[0]: s[3] for s in raw.tensors[0].sections}["indices"] == 4 * k


def test_raw_and_delta_decode_the_same():
    x = np.random.default_rng(6).standard_normal((64, 33)).astype(np.float32)
    a = gcodec.decode(gcodec.get_codec("topk", ratio=0.05).encode(x))
    b = gcodec.decode(gcodec.get_codec("topk", ratio=0.05, index_coding="raw").encode(x))
    np.testing.assert_array_equal(a, b)
    assert a.shape == x.shape


# ---------------------------------------------------------------------------------------------
# decoding


def test_decode_into_out_and_accumulate():
    x = np.random.default_rng(7).standard_normal(5000).astype(np.float32)
    buf = gcodec.get_codec("topk", ratio=0.02).encode(x)
    y = gcodec.decode(buf)
    for dt in (np.float32, np.float64):
        base = np.random.default_rng(8).standard_normal(5000).astype(dt)
        out = base.copy()
        gcodec.decode(buf, out=out, accumulate=True)
        np.testing.assert_array_equal(out, base + y.astype(dt))
        out2 = np.full(5000, 7, dt)
        gcodec.decode(buf, out=out2)
        np.testing.assert_array_equal(out2, y.astype(dt))
    out16 = np.empty(5000, np.float16)
    gcodec.decode(buf, out=out16)
    np.testing.assert_array_equal(out16, y.astype(np.float16))


def test_decode_has_no_full_size_temporary():
    """Decode scatters into out= (and accumulates) without a temporary of the output's size (docs/limits.md)."""
    n = 1 << 20
    x = np.random.default_rng(9).standard_normal(n).astype(np.float32)
    for coding in ("delta", "raw"):
        buf = gcodec.get_codec("topk", ratio=0.01, index_coding=coding).encode(x)
        out = np.zeros(n, np.float32)
        gcodec.decode(buf, out=out, accumulate=True)  # compile first
        tracemalloc.start()
        gcodec.decode(buf, out=out, accumulate=True)
        gcodec.decode(buf, out=out)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 4 * n / 8, peak  # k int64 indices are 8 % of the output; a full copy is 100 %


def test_bad_payload_leaves_accumulator_untouched():
    make = dict((name, mk) for name, mk, *_ in INVALID)["t3_topk_index_out_of_range"]
    bad = make()
    out = np.arange(1000, dtype=np.float32)
    with pytest.raises(gcodec.PayloadValueError):
        gcodec.decode(bad, out=out, accumulate=True)
    np.testing.assert_array_equal(out, np.arange(1000, dtype=np.float32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_values_travel_in_the_input_dtype(dtype):
    x = np.random.default_rng(10).standard_normal(300).astype(DTYPES[dtype])
    buf = gcodec.get_codec("topk", k=30).encode(x)
    code = {"float16": "f2", "bfloat16": "u2", "float64": "f8"}[dtype]
    assert gcodec.validate(buf).tensors[0].sections[-1][1] == code
    y = gcodec.decode(buf)
    assert y.dtype == DTYPES[dtype]
    idx = reference(x, 30)
    np.testing.assert_array_equal(y[idx].view(np.uint8), x[idx].view(np.uint8))
    if dtype == "bfloat16":
        assert y.dtype == BFLOAT16


def test_error_feedback_conserves_the_sum():
    """With feedback, what was decoded plus the final residual equals what went in."""
    ef = gcodec.ErrorFeedback(gcodec.get_codec("topk", ratio=0.05))
    rng = np.random.default_rng(11)
    total_in = np.zeros(400, np.float64)
    total_out = np.zeros(400, np.float64)
    for _ in range(30):
        g = rng.standard_normal(400).astype(np.float32)
        total_in += g
        total_out += gcodec.decode(ef.encode(g, key="w"))
    np.testing.assert_allclose(total_out + ef.residual("w"), total_in, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# one test per rule: the golden invalid cases


@pytest.mark.parametrize(
    "name, make, error, rule", [c for c in INVALID if "_topk_" in c[0] and not c[0].startswith(("h1_", "c0_", "u1_"))]
)
def test_rule(name, make, error, rule):
    assert_refused(make(), error, rule)
