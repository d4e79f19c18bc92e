"""``threshold`` (specs/codecs/threshold.md): |x| >= t, a variable count, the shared index coding."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases.sparse import INVALID

import gcodec
from gcodec.arrays import DTYPES
from gcodec.codecs.threshold import threshold_key

from .rules import assert_refused


def expected(x: np.ndarray, t: float) -> np.ndarray:
    keep = np.abs(x.astype(np.float64)) >= t
    return np.where(keep, x, np.zeros_like(x))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n", [0, 1, 1000, 100_003])
def test_selection_matches_numpy(dtype, n):
    x = np.random.default_rng(n).standard_t(3, n).astype(DTYPES[dtype])
    for t in (0.0, 0.5, 3.0, 1e9):
        for coding in ("delta", "raw"):
            buf = gcodec.get_codec("threshold", threshold=t, index_coding=coding).encode(x)
            info = gcodec.validate(buf)
            assert info.params["k"] == int((np.abs(x.astype(np.float64)) >= t).sum())
            assert info.params["threshold"] == t
            y = gcodec.decode(buf)
            np.testing.assert_array_equal(y.view(np.uint8), expected(x, t).view(np.uint8))


def test_comparison_is_in_float64():
    """float32(0.1) = 0.10000000149 >= 0.1, but below 0.1000000016."""
    x = np.array([0.1, -0.1, 0.05, 0.2], np.float32)
    keep = gcodec.decode(gcodec.get_codec("threshold", threshold=0.1).encode(x))
    np.testing.assert_array_equal(keep, [x[0], x[1], 0, x[3]])
    above = float(np.float32(0.1)) + 1e-12
    keep2 = gcodec.decode(gcodec.get_codec("threshold", threshold=above).encode(x))
    np.testing.assert_array_equal(keep2, [0, 0, 0, x[3]])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_threshold_key_is_the_smallest_key_reaching_t(dtype):
    """Against brute force over all 2**15 non-negative 16-bit patterns."""
    dt = DTYPES[dtype]
    keys = np.arange(1 << 15, dtype=np.uint16)
    with np.errstate(invalid="ignore"):  # NaN patterns
        vals = keys.view(dt).astype(np.float64)
    finite = ~np.isnan(vals)
    for t in (0.0, 1e-7, 0.1, 1.0, 3.3, 65504.0, 1e5, 1e40):
        ok = np.flatnonzero(finite & (vals >= t))
        assert threshold_key(t, dtype) == int(ok[0]), t


def test_payload_size_follows_the_count():
    rng = np.random.default_rng(3)
    sizes = set()
    for scale in (0.5, 1.0, 2.0):
        x = (rng.standard_normal(10000) * scale).astype(np.float32)
        sizes.add(len(gcodec.get_codec("threshold", threshold=2.0).encode(x)))
    assert len(sizes) == 3  # variable-size payloads: the transports must gather them


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_nonfinite_input_is_rejected(special):
    x = np.zeros(100_000, np.float32)
    x[77] = special
    with pytest.raises(gcodec.PayloadValueError, match="NaN or infinite"):
        gcodec.get_codec("threshold", threshold=1.0).encode(x)


def test_config():
    assert gcodec.get_codec("threshold").params["threshold"] == 1e-3
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("threshold", threshold=-1.0)
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("threshold", threshold=float("nan"))


def test_error_feedback_lets_small_values_through():
    """Values below t accumulate in the residual until they cross it."""
    ef = gcodec.ErrorFeedback(gcodec.get_codec("threshold", threshold=1.0))
    x = np.full(10, 0.3, np.float32)
    sent = [gcodec.decode(ef.encode(x, key="w"))[0] for _ in range(4)]
    assert sent[:3] == [0, 0, 0] and abs(sent[3] - 1.2) < 1e-6


@pytest.mark.parametrize("name, make, error, rule", [c for c in INVALID if "_threshold_" in c[0]])
def test_rule(name, make, error, rule):
    assert_refused(make(), error, rule)
