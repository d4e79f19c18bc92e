"""``randomk`` (specs/codecs/randomk.md): the Philox-driven index selection, summability, rules."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases import edit, header_of, section_blobs
from vector_cases.sparse import INVALID

import gcodec
from gcodec import sum_payloads
from gcodec.api import _checked
from gcodec.arrays import DTYPES
from gcodec.codecs.randomk import randomk_indices
from gcodec.kernels.cpu.philox import random_u32

from .rules import assert_refused


def reference_indices(n: int, k: int, seed: int, stream: int) -> list[int]:
    """The spec's algorithm (section 3), step by step, in plain Python integers."""
    if k == n:
        return list(range(n))
    w = [int(v) for v in random_u32(seed, stream, 2 * k)]
    chosen: set[int] = set()
    for m in range(k):
        u = w[2 * m] | (w[2 * m + 1] << 32)  # low word first
        j = n - k + m
        t = (u * (j + 1)) >> 64  # floor(u * (j + 1) / 2**64), in [0, j]
        chosen.add(j if t in chosen else t)
    return sorted(chosen)


@pytest.mark.parametrize(
    "n, k, seed, stream",
    [
        (1, 1, 0, 0),
        (10, 3, 1, 0),
        (1000, 10, 42, 7),
        (100_000, 1000, 2**64 - 1, 2**64 - 1),
        (64, 63, 5, 9),
        (5, 0, 0, 0),
    ],
)
def test_indices_follow_the_spec(n, k, seed, stream):
    got = randomk_indices(n, k, seed, stream)
    assert got.tolist() == reference_indices(n, k, seed, stream)
    assert len(set(got.tolist())) == k and (np.diff(got) > 0).all() and (k == 0 or got[-1] < n)


def test_indices_are_uniform():
    """Each index is kept with probability k/n. Over T streams the count is Binomial(T, k/n);
    every one of the n counts must lie within 5 standard deviations (a miss has probability < 1e-4)."""
    n, k, T = 50, 5, 4000
    counts = np.zeros(n)
    for s in range(T):
        counts[randomk_indices(n, k, 3, s)] += 1
    p = k / n
    sd = np.sqrt(T * p * (1 - p))
    assert np.abs(counts - T * p).max() < 5 * sd, counts


def test_payload_has_no_indices_and_records_seed_and_stream():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    c = gcodec.get_codec("randomk", ratio=0.05, seed=11)
    buf = c.encode(x, step=4)
    info = gcodec.validate(buf)
    assert info.params == {"k": 50, "seed": 11, "stream": 4, "values": None}
    assert [s[:2] for s in info.tensors[0].sections] == [("values", "f4")]
    y = gcodec.decode(buf)
    idx = randomk_indices(1000, 50, 11, 4)
    expect = np.zeros_like(x)
    expect[idx] = x[idx]
    np.testing.assert_array_equal(y, expect)


def test_streams_without_step_count_per_key():
    x = np.ones(100, np.float32)
    c = gcodec.get_codec("randomk", k=5, seed=1)
    streams = [gcodec.validate(c.encode(x, key="a")).params["stream"] for _ in range(3)]
    assert streams == [0, 1, 2]
    assert gcodec.validate(c.encode(x, key="b")).params["stream"] == 0
    assert c.default_state().next_stream("a") == 3


def test_same_seed_and_step_select_the_same_indices():
    x = np.arange(1, 10001, dtype=np.float32)
    a = gcodec.get_codec("randomk", ratio=0.01, seed=5)
    b = gcodec.get_codec("randomk", ratio=0.01, seed=5)
    ia = np.flatnonzero(gcodec.decode(a.encode(x, step=3)))
    assert np.array_equal(ia, np.flatnonzero(gcodec.decode(b.encode(x, step=3))))
    assert not np.array_equal(ia, np.flatnonzero(gcodec.decode(b.encode(x, step=4))))
    c = gcodec.get_codec("randomk", ratio=0.01, seed=6)
    assert not np.array_equal(ia, np.flatnonzero(gcodec.decode(c.encode(x, step=3))))


def _two_workers(dtype=np.float32, **kw):
    rng = np.random.default_rng(1)
    x1 = rng.standard_normal(5000).astype(dtype)
    x2 = rng.standard_normal(5000).astype(dtype)
    c1 = gcodec.get_codec("randomk", ratio=0.02, seed=9, **kw)
    c2 = gcodec.get_codec("randomk", ratio=0.02, seed=9, **kw)
    return c1.encode(x1, step=12), c2.encode(x2, step=12)


def test_two_workers_sum_before_decoding():
    """Summable: adding the two value sections gives a payload that decodes to the sum."""
    p1, p2 = _two_workers()
    want = gcodec.decode(p1) + gcodec.decode(p2)
    # by hand: the values section of one payload replaced by the elementwise sum
    v1 = np.frombuffer(section_blobs(bytes(p1))[0][0], "<f4")
    v2 = np.frombuffer(section_blobs(bytes(p2))[0][0], "<f4")
    summed = edit(bytes(p1), data=lambda d: d.__setitem__(slice(0, 4 * v1.size), (v1 + v2).tobytes()))
    np.testing.assert_array_equal(gcodec.decode(summed), want)
    # the library helper
    np.testing.assert_array_equal(gcodec.decode(sum_payloads([p1, p2])), want)
    assert gcodec.get_codec("randomk").aggregation is gcodec.Aggregation.SUMMABLE


def test_sum_payloads_refuses_different_indices():
    x = np.ones(100, np.float32)
    c = gcodec.get_codec("randomk", k=5, seed=1)
    with pytest.raises(gcodec.ConfigError, match="different indices"):
        sum_payloads([c.encode(x, step=1), c.encode(x, step=2)])
    with pytest.raises(gcodec.ConfigError):
        sum_payloads([c.encode(x, step=1), gcodec.get_codec("topk", k=5).encode(x)])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dtypes_and_shapes(dtype):
    x = np.random.default_rng(2).standard_normal((7, 11)).astype(DTYPES[dtype])
    buf = gcodec.get_codec("randomk", k=13, seed=2).encode(x, step=0)
    y = gcodec.decode(buf)
    assert y.shape == x.shape and y.dtype == x.dtype
    idx = randomk_indices(77, 13, 2, 0)
    np.testing.assert_array_equal(y.reshape(-1)[idx].view(np.uint8), x.reshape(-1)[idx].view(np.uint8))
    assert np.count_nonzero(np.delete(y.reshape(-1).astype(np.float64), idx)) == 0


def test_edge_sizes():
    for n, k in ((0, 0), (1, 1), (10, 0), (10, 10)):
        x = np.arange(1, n + 1, dtype=np.float32)
        y = gcodec.decode(gcodec.get_codec("randomk", k=k).encode(x, step=0))
        assert np.count_nonzero(y) == k


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_nonfinite_input_is_rejected(special):
    x = np.ones(1000, np.float32)
    x[999] = special  # rejected even where no index would pick it
    with pytest.raises(gcodec.PayloadValueError, match="NaN or infinite"):
        gcodec.get_codec("randomk", k=1).encode(x, step=0)


def test_decode_accumulates():
    p1, p2 = _two_workers(np.float64)
    out = np.zeros(5000, np.float64)
    gcodec.decode(p1, out=out, accumulate=True)
    gcodec.decode(p2, out=out, accumulate=True)
    np.testing.assert_array_equal(out, gcodec.decode(p1) + gcodec.decode(p2))


def test_header_values_are_what_the_stream_needs():
    p1, _ = _two_workers()
    h = header_of(bytes(p1))["tensors"][0]["params"]
    assert set(h) == {"k", "seed", "stream", "values"}
    _, checked = _checked(p1, None, full=True)
    assert checked[0][2]["stream"] == 12


@pytest.mark.parametrize("name, make, error, rule", [c for c in INVALID if "_randomk_" in c[0]])
def test_rule(name, make, error, rule):
    assert_refused(make(), error, rule)


def test_r2_nonfinite_value():
    x = np.ones(10, np.float32)
    buf = bytes(gcodec.get_codec("randomk", k=2).encode(x, step=0))
    bad = edit(buf, data=lambda d: d.__setitem__(slice(0, 4), np.float32(np.nan).tobytes()))
    with pytest.raises(gcodec.PayloadValueError, match=r"^R2:"):
        gcodec.validate(bad)
    with pytest.raises(gcodec.PayloadValueError, match=r"^R2:"):
        gcodec.decode(bad)
