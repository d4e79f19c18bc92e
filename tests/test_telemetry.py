"""Quality telemetry: each statistic against its NumPy formula, sampling, the callback, logging, and
the low-norm-ratio warning (fires for a sustained low ratio, not for a healthy run)."""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import pytest

import gcodec
from gcodec.errors import ConfigError
from gcodec.telemetry import LowNormRatioWarning, Telemetry, measure, quality
from gcodec.transports import TransportState, allreduce_protocol, run_blocking
from tests.localcomm import LocalComm


def _pair(seed: int, n: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    y = (0.8 * x + 0.3 * rng.standard_normal(n)).astype(np.float32)
    return x, y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relative_error_is_norm_of_difference_over_norm(seed: int) -> None:
    x, y = _pair(seed)
    want = np.linalg.norm(x.astype(np.float64) - y) / np.linalg.norm(x.astype(np.float64))
    assert quality(x, y)["relative_error"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_norm_ratio_is_decoded_norm_over_original_norm(seed: int) -> None:
    x, y = _pair(seed)
    want = np.linalg.norm(y.astype(np.float64)) / np.linalg.norm(x.astype(np.float64))
    assert quality(x, y)["norm_ratio"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cosine_is_dot_over_norms(seed: int) -> None:
    x, y = _pair(seed)
    a, b = x.astype(np.float64), y.astype(np.float64)
    want = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    assert quality(x, y)["cosine"] == pytest.approx(want, rel=1e-12)


def test_bits_per_element_is_eight_payload_bytes_over_numel() -> None:
    x, y = _pair(0, 1000)
    assert quality(x, y, payload_bytes=1234)["bits_per_element"] == pytest.approx(8 * 1234 / 1000)
    assert quality(x, y)["bits_per_element"] is None


def test_residual_norm_is_the_residual_l2_norm() -> None:
    x, y = _pair(0, 1000)
    e = np.random.default_rng(9).standard_normal(1000).astype(np.float32)
    assert quality(x, y, residual=e)["residual_norm"] == pytest.approx(np.linalg.norm(e.astype(np.float64)))
    assert quality(x, y)["residual_norm"] is None


def test_large_tensors_accumulate_in_float64_across_chunks() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3 << 20) + 17).astype(np.float32)
    y = x * np.float32(0.5)
    q = quality(x, y)
    assert q["norm_ratio"] == pytest.approx(0.5, rel=1e-9)
    assert q["relative_error"] == pytest.approx(0.5, rel=1e-9)
    assert q["numel"] == x.size and q["norm"] == pytest.approx(np.linalg.norm(x.astype(np.float64)), rel=1e-12)


def test_zero_vectors_follow_the_documented_conventions() -> None:
    z = np.zeros(10, np.float32)
    assert (
        quality(z, z)["norm_ratio"] == 1.0 and quality(z, z)["relative_error"] == 0.0 and quality(z, z)["cosine"] == 1
    )
    q = quality(z, np.ones(10, np.float32))
    assert math.isinf(q["norm_ratio"]) and q["cosine"] == 0.0
    assert quality(np.ones(10, np.float32), z)["norm_ratio"] == 0.0


def test_shape_mismatch_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        quality(np.ones(3, np.float32), np.ones(4, np.float32))


def test_measure_matches_an_explicit_encode_decode() -> None:
    x = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    codec = gcodec.get_codec("uniform", bits=4)
    buf = gcodec.encode(x, codec)
    want = quality(x, gcodec.decode(buf), payload_bytes=len(memoryview(buf).cast("B")))
    got = measure(x, codec)
    for f in ("relative_error", "norm_ratio", "cosine", "bits_per_element"):
        assert got[f] == pytest.approx(want[f], rel=1e-12), f
    assert got["codec"] == codec.get_config()


def test_measure_with_residual_reports_the_feedback_residual_left_after_the_step() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(4096).astype(np.float32)
    e = 0.1 * rng.standard_normal(4096).astype(np.float32)
    ef = gcodec.ErrorFeedback({"id": "topk", "ratio": 0.05})
    ef.load_state_dict({"residuals": {"k": e}})
    ef.encode(x, key="k")
    got = measure(x, {"id": "topk", "ratio": 0.05}, residual=e)
    assert got["residual_norm"] == pytest.approx(np.linalg.norm(ef.residual("k").astype(np.float64)), rel=1e-6)


def _feed(t: Telemetry, key: str, ratios: list[float]) -> None:
    for step, r in enumerate(ratios):
        if t.due(step):
            t.observe(key, step, {"norm_ratio": r, "relative_error": 0.0, "cosine": 1.0, "bits_per_element": 8.0})


def test_sustained_low_norm_ratio_warns_once_after_patience_steps(caplog: pytest.LogCaptureFixture) -> None:
    t = Telemetry(every=1, patience=5)
    with pytest.warns(LowNormRatioWarning, match="'w'"), caplog.at_level(logging.WARNING, "gcodec.telemetry"):
        _feed(t, "w", [0.5] * 20)
    assert len(t.warnings) == 1 and t.warnings[0]["step"] == 4
    assert any("norm ratio of 'w'" in r.message for r in caplog.records)


def test_healthy_or_briefly_low_runs_do_not_warn() -> None:
    t = Telemetry(every=1, patience=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _feed(t, "w", [0.99] * 50)
        _feed(t, "v", ([0.5] * 4 + [0.95]) * 10)  # low for 4 steps at a time, never 5
    assert t.warnings == []


def test_patience_counts_steps_when_sampling_sparsely() -> None:
    t = Telemetry(every=10, patience=30, warn=False)
    _feed(t, "w", [0.5] * 100)
    assert [w["step"] for w in t.warnings] == [30]  # samples at 0, 10, 20, 30 span 31 steps (0 to 30)


def test_warning_rearms_after_a_healthy_sample() -> None:
    t = Telemetry(every=1, patience=3, warn=False)
    _feed(t, "w", [0.5] * 5 + [1.0] + [0.5] * 5)
    assert [w["step"] for w in t.warnings] == [2, 8]


def test_callback_gets_every_sampled_record_and_records_keep_the_last() -> None:
    got: list[dict] = []
    t = Telemetry(every=3, callback=got.append)
    _feed(t, "w", [1.0] * 10)
    assert [r["step"] for r in got] == [0, 3, 6, 9]
    assert t.records()["w"]["step"] == 9


def test_every_zero_samples_nothing() -> None:
    t = Telemetry(every=0)
    assert not any(t.due(s) for s in range(100))


@pytest.mark.parametrize("kw", [{"every": -1}, {"patience": 0}, {"threshold": "x"}])
def test_bad_settings_are_config_errors(kw: dict) -> None:
    with pytest.raises(ConfigError):
        Telemetry(**kw)


def _run(state: TransportState, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    comm = LocalComm()
    for _ in range(steps):
        x = rng.standard_normal(8192).astype(np.float32)
        run_blocking(allreduce_protocol(comm, state, x, np.empty_like(x), "layer", "mean", "gather"))


def test_transport_samples_every_n_steps_into_stats() -> None:
    seen: list[int] = []
    t = Telemetry(every=4, callback=lambda r: seen.append(r["step"]))
    st = TransportState({"id": "uniform", "bits": 8}, error_feedback=True, telemetry=t)
    _run(st, 10)
    assert seen == [0, 4, 8]
    q = st.stats()["layer"]["quality"]
    assert q["step"] == 8 and q["norm_ratio"] > 0.99 and q["cosine"] > 0.999 and q["residual_norm"] > 0


def test_transport_topk_without_feedback_warns_and_uniform8_does_not() -> None:
    bad = Telemetry(every=1, patience=5, warn=False)
    _run(TransportState({"id": "topk", "ratio": 0.01}, error_feedback=False, telemetry=bad), 8)
    good = Telemetry(every=1, patience=5, warn=False)
    _run(TransportState({"id": "uniform", "bits": 8}, error_feedback=True, telemetry=good), 8)
    assert len(bad.warnings) == 1 and bad.records()["layer"]["norm_ratio"] < 0.5
    assert good.warnings == []


def test_sampling_does_not_change_the_exchange() -> None:
    a = TransportState({"id": "qsgd", "levels": 15}, error_feedback=True)
    b = TransportState({"id": "qsgd", "levels": 15}, error_feedback=True, telemetry=Telemetry(every=1))
    _run(a, 3)
    _run(b, 3)
    assert np.array_equal(a.worker.residual("layer"), b.worker.residual("layer"))
    assert a.stats()["layer"]["payload_bytes"] == b.stats()["layer"]["payload_bytes"]
