"""Hybrids (specs/codecs/hybrid.md): sparse or low-rank payloads whose values or factors are coded
by a nested codec, declared in the header."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases.sparse import INVALID

import gcodec
from gcodec import sum_payloads
from gcodec.api import _checked
from gcodec.codecs.randomk import randomk_indices

from .rules import assert_refused

U16 = 2.0**-11  # unit roundoff of binary16


def heavy(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_t(3, n).astype(np.float32)


def views_of(buf):
    p, checked = _checked(buf, None, full=True)
    e, cls, params = checked[0]
    return e, cls, params, p.views(e)


# ---------------------------------------------------------------------------------------------
# the three required hybrids


def test_topk_with_uniform8_values():
    x = heavy(20_000, 1)
    c = gcodec.get_codec("topk", ratio=0.01, values={"id": "uniform", "bits": 8})
    buf = c.encode(x)
    info = gcodec.validate(buf)
    nested = info.params["values"]
    assert nested["codec"] == "uniform" and nested["version"] == 1 and nested["params"]["bits"] == 8
    names = [s[0] for s in info.tensors[0].sections]
    assert names[:2] == ["index_widths", "indices"] and all(n.startswith("values.") for n in names[2:])
    # the kept positions are exactly Top-K's; each value is within half a step of its group's scale
    y = gcodec.decode(buf)
    ref = gcodec.decode(gcodec.get_codec("topk", ratio=0.01).encode(x))
    keep = np.flatnonzero(ref)
    assert set(np.flatnonzero(y)) <= set(keep)
    v = x[keep].astype(np.float64)
    g = 64  # uniform's default group size, over the k kept values in index order
    pad = (-v.size) % g
    absmax = np.abs(np.concatenate([v, np.zeros(pad)])).reshape(-1, g).max(axis=1)
    bound = np.repeat(absmax / 127 / 2, g)[: v.size] * (1 + 1e-6) + np.abs(v) * 2.0**-22
    assert (np.abs(y[keep] - v) <= bound).all()


def test_randomk_with_fp16_values_stays_summable():
    rng = np.random.default_rng(2)
    x1 = rng.standard_normal(4000).astype(np.float32)
    x2 = rng.standard_normal(4000).astype(np.float32)
    c = gcodec.get_codec("randomk", ratio=0.05, seed=3, values={"id": "fp16"})
    assert c.aggregation is gcodec.Aggregation.SUMMABLE
    p1, p2 = c.encode(x1, step=8), c.encode(x2, step=8)
    info = gcodec.validate(p1)
    assert info.params["values"] == {"codec": "fp16", "params": {}, "version": 1}
    assert [s[:2] for s in info.tensors[0].sections] == [("values.data", "u2")]
    idx = randomk_indices(4000, 200, 3, 8)
    y1 = gcodec.decode(p1)
    np.testing.assert_array_equal(y1[idx], x1[idx].astype(np.float16).astype(np.float32))
    # summed in a wide accumulator, rounded once to binary16
    s = gcodec.decode(sum_payloads([p1, p2]))
    want = np.zeros(4000, np.float32)
    want[idx] = (y1[idx].astype(np.float64) + gcodec.decode(p2)[idx]).astype(np.float16)
    np.testing.assert_array_equal(s, want)


def test_randomk_with_uniform_values_is_gather_only():
    c = gcodec.get_codec("randomk", values={"id": "uniform", "bits": 8})
    assert c.aggregation is gcodec.Aggregation.GATHER
    x = np.ones(100, np.float32)
    with pytest.raises(gcodec.ConfigError, match="not summable"):
        sum_payloads([c.encode(x, step=0), c.encode(x, step=0)])


def _factor_bound(p: np.ndarray, q: np.ndarray, dp: np.ndarray, dq: np.ndarray) -> float:
    """||delta(P Q^T)||_F for entrywise factor errors up to dp, dq: sum_c (dp|q| + |p|dq + dp dq)."""
    a = dp @ np.abs(q).T + np.abs(p) @ dq.T + dp @ dq.T
    return float(np.linalg.norm(a))


def _raw_factors(x, **kw):
    c = gcodec.get_codec("powersgd", seed=4, **kw)
    e, cls, params, v = views_of(c.encode(x, key="k"))
    p, q = cls._factors(params, e, v)
    return p.astype(np.float64), q.astype(np.float64)


def test_powersgd_with_fp16_factors():
    x = np.random.default_rng(5).standard_normal((300, 200)).astype(np.float32)
    p, q = _raw_factors(x, rank=4)
    buf = gcodec.get_codec("powersgd", rank=4, seed=4, factors={"id": "fp16"}).encode(x, key="k")
    info = gcodec.validate(buf)
    assert info.params["p"]["codec"] == "fp16" and info.params["q"]["codec"] == "fp16"
    assert [s[0] for s in info.tensors[0].sections] == ["p.data", "q.data"]
    y = gcodec.decode(buf).astype(np.float64)
    # each factor entry is within half an ulp of binary16 (relative U16) of the float32 one
    bound = _factor_bound(p, q, np.abs(p) * U16, np.abs(q) * U16) * 1.001 + 1e-6
    assert np.linalg.norm(y - p @ q.T) <= bound


def test_powersgd_with_uniform8_factors():
    x = np.random.default_rng(6).standard_normal((256, 128)).astype(np.float32)
    p, q = _raw_factors(x, rank=2)
    buf = gcodec.get_codec("powersgd", rank=2, seed=4, factors={"id": "uniform", "bits": 8}).encode(x, key="k")
    info = gcodec.validate(buf)
    assert info.params["p"]["codec"] == "uniform" and info.params["rank"] == 2
    assert [s[0] for s in info.tensors[0].sections][:1] == ["p.scales"]
    y = gcodec.decode(buf).astype(np.float64)

    def step(f: np.ndarray) -> np.ndarray:  # half a quantisation step of each entry's group (64 entries)
        flat = f.reshape(-1)
        pad = (-flat.size) % 64
        am = np.abs(np.concatenate([flat, np.zeros(pad)])).reshape(-1, 64).max(axis=1)
        return (np.repeat(am / 127 / 2, 64)[: flat.size] * (1 + 1e-6)).reshape(f.shape)

    bound = _factor_bound(p, q, step(p), step(q)) + 1e-6
    assert np.linalg.norm(y - p @ q.T) <= bound
    assert np.linalg.norm(y - p @ q.T) > 0  # the factors really were quantised


# ---------------------------------------------------------------------------------------------
# the mechanism


def test_config_round_trip_and_repr():
    for c in (
        gcodec.get_codec("topk", ratio=0.01, values="fp16"),
        gcodec.get_codec("topk", k=9, values={"id": "uniform", "bits": 4}),
        gcodec.get_codec("powersgd", factors={"id": "uniform", "bits": 8}),
        gcodec.get_codec("threshold", values="bf16"),
    ):
        cfg = c.get_config()
        assert gcodec.get_codec(cfg) == c
        assert eval(repr(c), {"gcodec": gcodec}) == c
    assert gcodec.get_codec("topk", values="fp16").params["values"] == {"id": "fp16"}
    assert gcodec.get_codec("topk", values={"id": "uniform"}).params["values"]["bits"] == 8  # defaults filled


def test_nested_codec_must_exist_and_be_elementwise():
    with pytest.raises(gcodec.UnknownCodecError):
        gcodec.get_codec("topk", values={"id": "nope"})
    for host, role in (("topk", "values"), ("randomk", "values"), ("powersgd", "factors")):
        with pytest.raises(gcodec.ConfigError, match="composite"):
            gcodec.get_codec(host, **{role: {"id": "topk"}})
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("topk", values={"id": "uniform", "bits": 3})
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("topk", values=5)


def test_hybrids_in_a_bundle():
    rng = np.random.default_rng(7)
    tensors = {
        "w": rng.standard_normal((64, 48)).astype(np.float32),
        "b": rng.standard_normal(48).astype(np.float32),
        "e": rng.standard_normal(5000).astype(np.float32),
    }
    codecs = {
        "w": gcodec.get_codec("powersgd", rank=2, factors={"id": "fp16"}),
        "b": gcodec.get_codec("powersgd"),
        "e": gcodec.get_codec("topk", ratio=0.02, values={"id": "uniform", "bits": 8}),
    }
    buf = gcodec.encode_bundle(tensors, codecs)
    info = gcodec.validate(buf)
    assert [t.codec for t in info.tensors] == ["powersgd", "powersgd", "topk"]
    out = gcodec.decode(buf)
    np.testing.assert_array_equal(out["b"], tensors["b"])
    assert out["w"].shape == (64, 48) and np.count_nonzero(out["e"]) <= 100


@pytest.mark.parametrize(
    "name, make, error, rule", [c for c in INVALID if c[0].startswith(("h1_", "c0_topk", "u1_topk"))]
)
def test_rule(name, make, error, rule):
    assert_refused(make(), error, rule)
