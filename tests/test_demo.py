"""``gcodec demo --quick``: the real multi-process demo (2 gloo ranks), its JSON and its table."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("tqdm")

import itertools

import gcodec
from gcodec.cli import main
from gcodec.demo import DEMO_RUNS, demo_settings
from gcodec.demo.data import load_digits, train_test_split
from gcodec.transports import resolve_mode, shares_flat_group

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("demo")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["demo", "--quick", "--no-progress", "--json", str(d / "r.json"), "--plot", str(d / "r.png")])
    return {"rc": rc, "text": out.getvalue(), "runs": json.loads((d / "r.json").read_text()), "png": d / "r.png"}


def test_the_demo_succeeds_and_runs_every_codec_in_order(demo):
    assert demo["rc"] == 0, demo["text"]
    assert [r["label"] for r in demo["runs"]] == [label for label, _, _ in DEMO_RUNS]
    for r, (_, codec, ef) in zip(demo["runs"], DEMO_RUNS):
        assert r["ok"], r
        assert r["codec"] == codec and r["error_feedback"] == ef
        for k in ("codec", "bits_per_element", "bytes_per_step", "accuracy"):
            assert k in r
        for k in ("bits_per_element", "bytes_per_step", "accuracy", "encode_ms", "decode_ms", "ratio"):
            assert math.isfinite(r[k]) and r[k] >= 0, (r["label"], k)


def test_uncompressed_training_learns_digits_and_fp16_matches_it(demo):
    runs = {r["label"]: r for r in demo["runs"]}
    base = runs["uncompressed"]
    assert base["accuracy"] > 0.9
    assert abs(runs["fp16"]["accuracy"] - base["accuracy"]) <= 0.01
    for r in demo["runs"]:
        assert r["delta_accuracy"] == pytest.approx(r["accuracy"] - base["accuracy"])
        assert r["accuracy"] > 0.5, r["label"]  # every codec learns (chance is 0.1)
        # the curve ends at the reported accuracy
        assert r["curve"][-1]["accuracy"] == r["accuracy"]


def _model_shapes() -> list[tuple[int, ...]]:
    s = demo_settings(quick=True)
    dims = [64, *s.hidden, 10]
    shapes: list[tuple[int, ...]] = []
    for a, b in itertools.pairwise(dims):
        shapes += [(b, a), (b,)]
    return shapes


def test_bytes_per_step_match_the_codec(demo):
    """What the demo reports a worker sends equals what the codec makes of the same tensors: one
    payload per step for the compressed weights a flat group may join (the hook flattens a bucket's
    tensors per codec), one per weight sent alone, plus the small tensors that stay dense in fp32."""
    s = demo_settings(quick=True)
    shapes = _model_shapes()
    nparams = sum(math.prod(sh) for sh in shapes)
    rng = np.random.default_rng(0)
    for r in demo["runs"]:
        assert r["params"] == nparams
        assert r["bits_per_element"] == pytest.approx(8 * r["bytes_per_step"] / nparams)
        assert r["ratio"] == pytest.approx(32 / r["bits_per_element"])
        if r["codec"] is None:
            assert r["bytes_per_step"] == 4 * nparams
            continue
        codec = gcodec.get_codec(r["codec"])
        if codec.codec_id == "powersgd":
            big = [sh for sh in shapes if len(sh) == 2 and sh[0] * sh[1] >= s.min_numel]
            expect = sum(4 * (m + n) * codec.params["rank"] for m, n in big)
        else:
            big = [sh for sh in shapes if math.prod(sh) >= s.min_numel]
            # the hook joins the tensors whose encoding a flat group leaves unchanged into one
            # payload, and sends every other one alone (docs/transports.md, "Plan, then run")
            mode = resolve_mode(codec, "auto", 2)
            joined = [sh for sh in big if shares_flat_group(codec, math.prod(sh), mode)]
            parts = [joined] if joined else []
            parts += [[sh] for sh in big if sh not in joined]
            expect = 0
            for part in parts:
                flat = rng.standard_normal(sum(math.prod(sh) for sh in part)).astype(np.float32)
                expect += gcodec.validate(codec.encode(flat)).nbytes
        dense = sum(4 * math.prod(sh) for sh in shapes if sh not in big)
        # 3 %: a sparse codec's delta-coded index widths depend on where the kept elements lie
        # (real gradients here, normal draws above): 2.2 % in all for top-k 1 % + uniform 8, whose
        # weights each go in a small payload of their own
        assert r["bytes_per_step"] == pytest.approx(expect + dense, rel=0.03), r["label"]


def test_the_table_shows_every_codec_and_the_plot_is_a_png(demo):
    for r in demo["runs"]:
        assert r["label"] in demo["text"]
    assert "bits/el" in demo["text"] and "test acc" in demo["text"]
    assert demo["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_shipped_digits_are_the_uci_digits():
    images, labels = load_digits()
    assert images.shape == (1797, 64) and labels.shape == (1797,)
    assert images.max() == 16 and set(np.unique(labels)) == set(range(10))
    xtr, ytr, _xte, yte = train_test_split(0)
    assert len(ytr) + len(yte) == 1797 and len(yte) == 359
    assert xtr.dtype == np.float32 and float(xtr.max()) == 1.0


def test_the_tour_stays_available_under_demo(tmp_path: Path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["demo", "--tour", "--quick", "--json", str(tmp_path / "t.json")])
    assert rc == 0
    assert "codecs" in json.loads((tmp_path / "t.json").read_text())


def test_the_progress_bar_keeps_compiling_and_start_up_out_of_its_estimate() -> None:
    """A fresh install compiles kernels for minutes before the first step; counted as training
    time, that made the first estimate of the time left read tens of hours. Timed by a clock the
    test moves: 120 s compiling, 5 s to the first step, then steps of 0.1 s."""
    from tqdm import tqdm

    from gcodec.demo.progress import Progress

    now = [0.0]
    bar = tqdm(total=2 * 10, file=io.StringIO(), mininterval=0, smoothing=0)
    bar._time = lambda: now[0]
    bar.start_t = bar.last_print_t = 0.0
    p = Progress(["first", "second"], 10, bar=bar)
    seen = []

    def compile_kernels() -> None:
        seen.append(bar.desc)
        now[0] += 120.0

    p.phase("starting workers")
    p.during("compiling kernels", compile_kernels)()
    assert seen == ["compiling kernels"] and bar.desc == "starting workers"
    now[0] += 5.0
    for k in range(1, 11):
        p.step(0, k)
        now[0] += 0.1
    assert bar.n == 10 and bar.desc.startswith("first")
    now[0] += 30.0  # the second run's set-up and first step
    for k in range(1, 6):
        p.step(1, k)
        now[0] += 0.1
    d = bar.format_dict
    assert bar.n == 15 and bar.desc.startswith("second")
    # what the bar counts: the 13 steps after each run's first, 0.1 s each (the clock moved 0.1 s
    # after the last report too); the waits (155 s) would dominate it
    assert d["elapsed"] == pytest.approx(14 * 0.1)
    left = (d["total"] - d["n"]) * d["elapsed"] / d["n"]  # tqdm's estimate without smoothing
    assert left < 2.0


@pytest.fixture(scope="module")
def small_job() -> dict[str, dict[str, Any]]:
    """One 2-worker job of four 6-step runs for the tests below (a job's cost is mostly its two
    workers starting): the settings' 1 warm-up step, a run asking for 4, the local hook, and the
    adaptive controller from step 0."""
    from gcodec.demo.launch import run_job
    from gcodec.demo.runs import Settings, run_spec

    s = Settings(hidden=[32], epochs=1, evals_per_epoch=0, start_iter=1, max_steps=6, min_numel=64)
    runs = [
        run_spec("fp16", {"id": "fp16"}, False),
        {**run_spec("fp16, 4 warm-up", {"id": "fp16"}, False), "start_iter": 4},
        run_spec("local", None, False, hook="local"),
        {
            **run_spec("adaptive", {"id": "fp16"}, True),
            "adaptive": {"bandwidth": "1Mbit", "interval": 10},
            "start_iter": 0,
        },
    ]
    return {r["label"]: r for r in run_job(runs, s, 2)["runs"]}


def test_a_run_may_set_its_own_warm_up_length(small_job: dict[str, dict[str, Any]]) -> None:
    """A run spec's ``start_iter`` replaces the settings' for that run alone (bench/link.py gives
    torch's PowerSGD its shortest warm-up, 2 dense steps, this way): over 6 steps a run with the
    settings' 1 warm-up step compresses 5, the run that asks for 4 compresses 2."""
    got = small_job
    assert got["fp16"].get("ok") and got["fp16, 4 warm-up"].get("ok"), got
    assert got["fp16"]["steps"] == got["fp16, 4 warm-up"]["steps"] == 6
    assert got["fp16"]["compressed_steps"] == 5
    assert got["fp16, 4 warm-up"]["compressed_steps"] == 2


def test_the_local_hook_passes_torchs_hook_checks_and_reports_no_bytes(small_job: dict[str, dict[str, Any]]) -> None:
    """bench/link.py times the compute floor with DDP under a hook that keeps each rank's own
    gradients (``hook="local"``): torch accepts it as a comm hook (it rejects a hook whose bucket
    is annotated with anything but ``dist.GradBucket``, which a string annotation is), the run
    trains its steps, counts no bytes sent, and reports each step's time."""
    r = small_job["local"]
    assert r.get("ok"), r
    assert r["steps"] == 6 and r["bytes_per_step"] == 0
    assert len(r["first_steps_ms"]) == 6 and all(t > 0 for t in r["first_steps_ms"])


def test_an_adaptive_run_reports_its_moves_and_every_gcodec_run_the_seconds_its_hook_held(
    small_job: dict[str, dict[str, Any]],
) -> None:
    """bench/link.py's adaptive contender through the demo worker: the controller (a declared 1
    Mbit/s link, so that the 32-wide MLP's bucket leaves dense at its first decision, step 0) is
    read for the run's rung changes, and a gcodec run reports the median seconds its hook held the
    gradients a step (what the link benchmark's hidden share sets against the step), where a run
    without gcodec's hook reports none."""
    got = small_job
    assert got["adaptive"].get("ok") and got["local"].get("ok"), got
    moves = got["adaptive"]["decisions"]
    assert moves and moves[0]["step"] == 0 and moves[0]["from"] == 0 and moves[0]["to"] > 0, moves
    assert got["adaptive"]["held_ms"] > 0 and got["local"]["held_ms"] is None
