"""``gcodec tour --quick --json``: it runs, covers every codec, and its numbers agree with the library."""

from __future__ import annotations

import contextlib
import io
import json
import math
from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec import demo
from gcodec.cli import main

BUILTIN = {"fp16", "bf16", "uniform"}


def codec_bound(config: dict[str, Any]) -> float | None:
    """Largest acceptable relative L2 error for codecs whose behaviour we know; None: only finiteness."""
    cid = config["id"]
    if cid == "fp16":
        return 1e-3  # 11-bit significand: about 2**-11 / sqrt(3)
    if cid == "bf16":
        return 5e-3  # 8-bit significand
    if cid == "uniform":
        return {8: 0.05, 4: 0.4, 2: 1.0}[config["bits"]]
    if cid in ("topk", "threshold", "sign") and config.get("values") is None:
        return 1.0 + 1e-6  # keep exact values or the best scaled sign: never worse than sending zeros
    return None


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["tour", "--quick", "--json"])
    assert rc == 0
    return json.loads(out.getvalue())  # strict JSON: the demo writes no NaN or Infinity


def ok_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in result["codecs"] if r["ok"]]


def test_every_registered_codec_appears_or_reports_a_reason(result):
    assert result["codecs_registered"] == gcodec.list_codecs()
    seen = {r["id"] for r in result["codecs"]}
    assert seen == set(gcodec.list_codecs())
    for r in result["codecs"]:
        if not r["ok"]:
            assert r["error"] and ":" in r["error"], r
    assert BUILTIN <= {r["id"] for r in ok_rows(result)}, [r for r in result["codecs"] if not r["ok"]]
    # every codec is shown at its defaults
    for cid in gcodec.list_codecs():
        assert any(r["id"] == cid and r["label"] == demo.codec_label(gcodec.get_codec(cid)) for r in result["codecs"])


def test_sizes_match_what_validate_reports(result):
    big = demo.heavy_tailed(tuple(result["gradients"]["big"]["shape"]))
    for r in ok_rows(result):
        b = r["big"]
        codec = gcodec.get_codec(r["config"])
        assert codec.get_config() == r["config"]
        buf = codec.encode(big, key="big")
        info = gcodec.validate(buf)
        assert b["nbytes"] == info.nbytes, r["label"]
        assert b["ratio"] == pytest.approx(info.ratio, rel=1e-12)
        assert b["bits_per_element"] == pytest.approx(info.bits_per_element, rel=1e-12)
        assert b["bits_per_element"] * b["ratio"] == pytest.approx(32.0)  # fp32 input
        m = r["mlp"]
        assert m["elements"] == result["gradients"]["elements"]
        assert m["ratio"] == pytest.approx(32.0 / m["bits_per_element"])
        assert m["ratio"] == pytest.approx(4.0 * m["elements"] / m["nbytes"])


def test_mlp_sizes_match_validate(result):
    grads = demo.collect_gradients(demo.DemoSizes.quick())
    assert {k: list(g.shape) for k, g in grads.items()} == {
        k: t["shape"] for k, t in result["gradients"]["tensors"].items()
    }
    for r in ok_rows(result):
        codec = gcodec.get_codec(r["config"])
        nbytes = sum(gcodec.validate(codec.encode(g, key=k)).nbytes for k, g in grads.items())
        assert nbytes == r["mlp"]["nbytes"], r["label"]


def test_errors_are_finite_and_within_codec_bounds(result):
    for r in ok_rows(result):
        bound = codec_bound(r["config"])
        for part in ("mlp", "big"):
            err, norm = r[part]["rel_error"], r[part]["norm_ratio"]
            assert err is not None and math.isfinite(err) and err >= 0, (r["label"], part)
            assert norm is not None and math.isfinite(norm) and norm > 0, (r["label"], part)
            if bound is not None:
                assert err < bound, (r["label"], part, err)
        if r["id"] in ("fp16", "bf16", "uniform") and r["config"].get("bits", 8) == 8:
            assert abs(r["big"]["norm_ratio"] - 1) < 1e-2


def test_errors_match_a_direct_computation(result):
    big = demo.heavy_tailed(tuple(result["gradients"]["big"]["shape"]))
    for r in ok_rows(result):
        if r["id"] not in BUILTIN:  # stochastic codecs would need the demo's exact call sequence
            continue
        y = gcodec.decode(gcodec.get_codec(r["config"]).encode(big))
        assert isinstance(y, np.ndarray)
        x64 = big.astype(np.float64)
        err = np.linalg.norm(y - x64) / np.linalg.norm(x64)
        assert r["big"]["rel_error"] == pytest.approx(err, rel=1e-6)
        assert r["big"]["norm_ratio"] == pytest.approx(np.linalg.norm(y) / np.linalg.norm(x64), rel=1e-6)


def test_lossier_settings_cost_fewer_bits_and_more_error(result):
    uni = sorted((r for r in ok_rows(result) if r["id"] == "uniform"), key=lambda r: r["config"]["bits"], reverse=True)
    assert [r["config"]["bits"] for r in uni] == [8, 4, 2]
    bits = [r["big"]["bits_per_element"] for r in uni]
    errs = [r["big"]["rel_error"] for r in uni]
    assert bits == sorted(bits, reverse=True)
    assert errs == sorted(errs)


def test_speeds_are_positive(result):
    for r in ok_rows(result):
        for k in ("encode_gbps", "decode_gbps"):
            v = r["big"][k]
            assert v is not None and math.isfinite(v) and v > 0, (r["label"], k)


def test_bundle_beats_separate_payloads(result):
    assert result["bundle"]
    for b in result["bundle"]:
        assert b["ok"], b
        assert b["tensors"] == len(result["gradients"]["tensors"])
        assert b["matches_separate_decode"] is True
        assert b["nbytes"] < b["separate_nbytes"]
        assert b["overhead_per_tensor"] < b["separate_overhead_per_tensor"]
        assert b["header_nbytes"] < b["nbytes"]
        assert b["ratio"] == pytest.approx(b["original_nbytes"] / b["nbytes"])


def test_training_comparison(result):
    t = result["training"]
    runs = {r["label"]: r for r in t["runs"]}
    base = runs["fp32 (uncompressed)"]
    assert base["ok"] and base["bits_per_element"] == pytest.approx(32.0)
    assert base["train_accuracy"] > 0.4  # 10 classes: chance is 0.1
    ef_runs = [r for r in t["runs"] if r["error_feedback"]]
    assert len(ef_runs) >= 1
    assert any(not r["error_feedback"] and r["codec"] is not None for r in t["runs"])
    for r in t["runs"]:
        assert r["ok"], r
        for k in ("train_loss", "test_loss", "train_accuracy", "test_accuracy", "mean_norm_ratio"):
            assert r[k] is not None and math.isfinite(r[k]), (r["label"], k)
        if r["codec"] is not None:
            assert r["bits_per_element"] < 32.0
    for r in ef_runs:
        assert r["train_accuracy"] > 0.2, r["label"]  # it learns
    for r in t["runs"]:  # error feedback beats the same codec without it
        if r["codec"] is not None and not r["error_feedback"]:
            (with_ef,) = [e for e in ef_runs if e["codec"] == r["codec"]]
            assert with_ef["train_loss"] < r["train_loss"], r["label"]


def test_training_is_deterministic():
    sizes = demo.DemoSizes.quick()
    codec = gcodec.get_codec("uniform", bits=2)
    a = demo.train(sizes, codec, True)
    b = demo.train(sizes, codec, True)
    for k in ("train_loss", "test_accuracy", "bits_per_element"):
        assert a[k] == b[k]


def test_text_report_shows_every_row(result):
    text = "".join(demo.iter_text(result))
    for r in result["codecs"]:
        assert r["label"] in text
    for r in result["training"]["runs"]:
        assert r["label"] in text
    assert "enc GB/s" in text and "dec GB/s" in text


def test_mlp_backprop_matches_finite_differences():
    sizes = demo.DemoSizes.quick()
    x, y, _, _ = demo.make_dataset(sizes)
    model = demo.MLP(sizes.d_in, sizes.hidden, sizes.classes)
    model.params = {k: v.astype(np.float64) for k, v in model.params.items()}
    model.params["fc1.bias"] += 0.1  # keep ReLUs away from their kink
    x64, y8 = x[:8].astype(np.float64), y[:8]

    def loss() -> float:
        return model.evaluate(x64, y8)[0]

    _, grads = model.gradients(x64, y8)
    rng = np.random.default_rng(0)
    for name, p in model.params.items():
        for _ in range(3):
            i = tuple(int(rng.integers(0, s)) for s in p.shape)
            old = p[i]
            p[i] = old + 1e-5
            up = loss()
            p[i] = old - 1e-5
            down = loss()
            p[i] = old
            assert (up - down) / 2e-5 == pytest.approx(float(grads[name][i]), rel=1e-3, abs=1e-6), (name, i)
